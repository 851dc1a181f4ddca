"""`capsim validate`: the error arithmetic, the intervals, and a short end-to-end run on a tiny model
(plumbing, not fidelity: no error threshold is asserted)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import yaml

from calibration.step_checks import Perturbed, residuals
from calibration.validate import targets
from calibration.validate_errors import compare_summaries, interval, per_request_errors, rel_error, uncertainty_block
from sim.models.step_time import LinearModel
from sim.io.profiles import LinearStepTime


def _summary(scale: float) -> dict:
    lat = {"mean": 1.0 * scale, "median": 0.9 * scale, "p90": 2.0 * scale, "p99": 3.0 * scale, "max": 4.0 * scale}
    return {"ttft_s": dict(lat), "tpot_s": dict(lat), "itl_s": dict(lat), "e2e_s": dict(lat),
            "makespan_s": 10.0 * scale, "output_throughput_tok_s": 100.0 / scale, "request_throughput_rps": 2.0 / scale}


def test_relative_error_arithmetic():
    assert rel_error(1.1, 1.0) == pytest.approx(0.1)
    assert rel_error(0.8, 1.0) == pytest.approx(-0.2)
    assert rel_error(None, 1.0) is None and rel_error(1.0, None) is None
    assert rel_error(1.0, 0.0) is None and rel_error(float("nan"), 1.0) is None
    c = compare_summaries(_summary(1.25), _summary(1.0))
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        for st in ("mean", "median", "p90", "p99"):
            assert c[key][st]["rel_error"] == pytest.approx(0.25)
            assert c[key][st]["simulated"] == pytest.approx(1.25 * c[key][st]["measured"])
    assert c["makespan_s"]["rel_error"] == pytest.approx(0.25)
    assert c["output_throughput_tok_s"]["rel_error"] == pytest.approx(1 / 1.25 - 1)
    t = targets(compare_summaries(_summary(1.04), _summary(1.0)))
    assert t["e2e_s.median"]["met"] and t["itl_s.median"]["met"] and t["ttft_s.median"]["met"]
    t = targets(compare_summaries(_summary(0.92), _summary(1.0)))
    assert not t["e2e_s.median"]["met"] and t["ttft_s.median"]["met"]   # 8%: over 5%, within 10%
    assert t["e2e_s.median"]["abs_rel_error"] == pytest.approx(0.08)


def test_per_request_errors_pair_by_id():
    real = pd.DataFrame({"id": [0, 1, 2, 3], "status": ["finished"] * 3 + ["rejected"],
                         "ttft_s": [1.0, 2.0, 4.0, np.nan], "tpot_s": [0.1, 0.1, np.nan, np.nan],
                         "e2e_s": [2.0, 4.0, 8.0, np.nan]})
    sim = pd.DataFrame({"id": [2, 1, 0, 3], "status": ["finished"] * 4, "ttft_s": [5.0, 2.0, 0.5, 1.0],
                        "tpot_s": [0.2, 0.12, 0.1, 0.1], "e2e_s": [8.0, 5.0, 3.0, 1.0]})
    e = per_request_errors(sim, real)
    assert e["paired_requests"] == 3
    assert e["ttft_s"]["n"] == 3
    assert e["ttft_s"]["median_abs_rel_error"] == pytest.approx(0.25)        # |-0.5|, 0, 0.25
    assert e["ttft_s"]["mean_abs_rel_error"] == pytest.approx(0.25)
    assert e["tpot_s"]["n"] == 2 and e["tpot_s"]["median_abs_rel_error"] == pytest.approx(0.1)
    assert e["e2e_s"]["median_rel_error"] == pytest.approx(0.25)             # 0.5, 0.25, 0


def test_intervals_and_which_uncertainty_dominates():
    assert interval([1.0, 2.0, None, float("nan"), 3.0], 0, 100) == [1.0, 3.0]
    assert interval([None]) is None
    central, measured = _summary(1.0), _summary(1.1)
    workload = [_summary(s) for s in (0.8, 1.0, 1.2)]      # +-20%
    model = [_summary(s) for s in (0.97, 1.0, 1.03)]       # +-3%
    u = uncertainty_block(central, measured, workload, model)
    assert u["dominant"] == "workload"
    m = u["metrics"]["e2e_s.median"]
    assert m["workload_rel_width"] > m["model_rel_width"] > 0
    assert m["measured_inside"] == {"workload": True, "model": False}
    assert m["workload_interval"][0] == pytest.approx(0.9 * np.percentile([0.8, 1.0, 1.2], 5))
    u = uncertainty_block(central, measured, model, workload)
    assert u["dominant"] == "model" and "widest" not in u
    # several replays of the same point: their spread is the measurement's own noise, relative to the first
    replays = [_summary(1.1), _summary(1.1 * 0.6), _summary(1.1 * 1.4)]
    u = uncertainty_block(central, measured, workload, model, replays)
    m = u["metrics"]["e2e_s.median"]
    assert m["measurement_rel_width"] == pytest.approx(0.8) and m["widest"] == "measurement"
    assert m["measurement_interval"] == pytest.approx([0.9 * 1.1 * 0.6, 0.9 * 1.1 * 1.4])
    assert u["replays"] == 3 and u["widest"] == "measurement" and u["dominant"] == "workload"


def test_perturbed_costs_scale_by_iteration_kind():
    inner = LinearModel(LinearStepTime(constant_s=1.0))
    p = Perturbed(inner, {"decode": 0.5, "prefill": 2.0, "mixed": 3.0})
    plan = SimpleNamespace(num_seqs=1, new_tokens=1, pairs=1, kv_tokens_read=0, decode_seqs=1, prefill_seqs=0)
    assert p.step_s(plan) == pytest.approx(0.5)
    plan.prefill_seqs = 1
    assert p.step_s(plan) == pytest.approx(3.0)
    plan.decode_seqs = 0
    assert p.step_s(plan) == pytest.approx(2.0)


def test_residuals_are_the_fit_errors_on_the_calibration_points(tiny_run):
    from calibration.fit import Observation, Roofline, predictor
    from calibration.points import read_points
    from calibration.shapes import tiny_model_profile
    from sim.models.spec import ModelSpec
    cfg, res = tiny_run
    by_kind, source = residuals(res.profile_path, res.profile, "linear", tiny_model_profile())
    rows = read_points(res.points_path).ok_rows
    assert "20 calibration points" in source and sum(len(v) for v in by_kind.values()) == len(rows)
    pred = predictor(res.profile.linear, Roofline(ModelSpec(tiny_model_profile()), "fp32", None, None))
    decode = [pred(Observation.from_row(r)) / r["time_s"] - 1 for r in rows if r["kind"] == "decode"]
    np.testing.assert_allclose(sorted(by_kind["decode"]), sorted(decode))


@pytest.fixture
def tiny_scenario(tmp_path, tiny_run):
    from calibration.shapes import tiny_model_profile
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(tiny_model_profile().model_dump(mode="json")))
    sc = {"name": "tiny-validate", "seed": 2, "model": "tiny.yaml", "hardware": "l4",
          "kv": {"budget": "64MiB", "block_tokens": 16, "format": "bf16"},
          "scheduler": {"kind": "chunked", "max_num_seqs": 4, "max_num_batched_tokens": 24, "chunk_tokens": 16},
          "step_time": {"model": {"kind": "profile", "path": str(tiny_run[1].profile_path)},
                        "allow_extrapolation": True},
          "workload": {"kind": "synthetic", "num_requests": 10, "arrival": {"kind": "poisson", "rate_rps": 300},
                       "prompt_tokens": {"kind": "uniform", "low": 3, "high": 30},
                       "output_tokens": {"kind": "uniform", "low": 2, "high": 10}}}
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(sc))
    return path


def test_validate_command_on_a_tiny_model(tmp_path, tiny_scenario, tiny_run, capsys):
    pytest.importorskip("torch", reason="the replay needs torch")
    from capsim.cli import main
    out = tmp_path / "val"
    rc = main(["validate", str(tiny_scenario), "--profile", str(tiny_run[1].profile_path), "--device", "cpu",
               "--out", str(out), "--rates", "200,2000", "--seeds", "2", "--model-draws", "3", "--threads", "1",
               "--replays", "2", "--quiet"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "rate_rps 200" in text and "rate_rps 2000" in text and "validation.json" in text
    report = json.loads((out / "validation.json").read_text())
    assert report["device"] == "cpu" and report["use"] == "linear" and len(report["points"]) == 2
    assert report["attention"] == "torch"
    assert (out / "error_vs_load.png").exists()
    for point, rate in zip(report["points"], (200, 2000)):
        sub = out / f"rate-{rate}"
        for f in ("cdf.png", "scatter.png", "measured/summary.json", "measured/requests.csv",
                  "measured/iterations.csv", "measured/replay_iterations.csv", "simulated/summary.json"):
            assert (sub / f).exists(), f
        real = json.loads((sub / "measured" / "summary.json").read_text())
        sim = json.loads((sub / "simulated" / "summary.json").read_text())
        assert real["requests"] == sim["requests"] == 10
        assert real["replay"]["attention"] == "torch"     # the profile's calibration's kernels
        # the reported arithmetic is the tables' arithmetic
        for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
            for st in ("mean", "median", "p90", "p99"):
                m = point["metrics"][key][st]
                assert m["measured"] == pytest.approx(real[key][st]) and m["simulated"] == pytest.approx(sim[key][st])
                assert m["rel_error"] == pytest.approx((sim[key][st] - real[key][st]) / real[key][st])
        assert point["metrics"]["makespan_s"]["rel_error"] == pytest.approx(
            sim["makespan_s"] / real["makespan_s"] - 1)
        # the arrival rate reached the workload: the measured arrivals are the rate's
        req = pd.read_csv(sub / "measured" / "requests.csv")
        sreq = pd.read_csv(sub / "simulated" / "requests.csv")
        np.testing.assert_allclose(req["arrival_s"], sreq["arrival_s"])
        assert point["rate_rps"] == rate
        assert point["replay_consistency"]["identical"]
        u = point["uncertainty"]
        assert u["workload_seeds"] == 2 and u["model_draws"] == 3 and u["dominant"] in ("workload", "model")
        assert u["replays"] == 2 and len(u["metrics"]["e2e_s.median"]["measured_replays"]) == 2
        assert u["metrics"]["e2e_s.median"]["measured_replays"][0] == pytest.approx(real["e2e_s"]["median"])
        st = point["step_time"]
        assert st["iterations"] == real["iterations"] and 0 <= st["host_share"] < 1 and st["forward_cpu_share"] > 0
        assert math.isfinite(st["all"]["mape"])
    # arrivals scale with the rate
    a = pd.read_csv(out / "rate-200" / "measured" / "requests.csv")["arrival_s"].to_numpy()
    b = pd.read_csv(out / "rate-2000" / "measured" / "requests.csv")["arrival_s"].to_numpy()
    np.testing.assert_allclose(a, 10 * b)


def test_the_replay_uses_the_attention_kernels_of_the_profiles_calibration(tmp_path, tiny_scenario, tiny_run):
    pytest.importorskip("torch", reason="the replay needs torch")
    import shutil
    from capsim.cli import main
    prof = tiny_run[1].profile_path
    for f in (prof, tiny_run[1].points_path):
        shutil.copy(f, tmp_path / f.name)
    csv = tmp_path / tiny_run[1].points_path.name
    csv.write_text(csv.read_text().replace("# attention=torch\n", "# attention=no-cudnn\n"))
    out = tmp_path / "val"
    assert main(["validate", str(tiny_scenario), "--profile", str(tmp_path / prof.name), "--device", "cpu",
                 "--out", str(out), "--seeds", "1", "--model-draws", "0", "--no-plots", "--quiet"]) == 0
    real = json.loads((out / "measured" / "summary.json").read_text())
    assert real["replay"]["attention"] == "no-cudnn"


def test_a_cuda_replay_with_torchs_attention_choice_is_warned_of():
    from calibration.validate import attention_warning
    text = attention_warning("cuda", "torch", "p.yaml")
    assert text.startswith("warning: p.yaml: calibrated with torch's attention choice") and "--attention no-cudnn" in text
    assert attention_warning("cuda", "no-cudnn", "p.yaml") is None
    unknown = attention_warning("cuda", "torch", "p.yaml", known=False)
    assert "no points CSV beside it says which attention kernels" in unknown
    assert attention_warning("cpu", "torch", "p.yaml") is None and attention_warning("mps", "torch", "p.yaml") is None


def test_a_damaged_points_file_or_a_bad_setting_in_it_is_named(tmp_path, tiny_scenario, tiny_run, capsys):
    pytest.importorskip("torch", reason="the replay needs torch")
    import shutil
    from capsim.cli import main
    prof = tiny_run[1].profile_path
    for f in (prof, tiny_run[1].points_path):
        shutil.copy(f, tmp_path / f.name)
    csv = tmp_path / tiny_run[1].points_path.name
    text = csv.read_text()
    args = ["validate", str(tiny_scenario), "--profile", str(tmp_path / prof.name), "--device", "cpu",
            "--seeds", "1", "--model-draws", "0", "--no-plots", "--quiet", "--threads", "1"]
    csv.write_text(text + "k,decode,ok,abc\n")     # a damaged row (the model's residuals read every point)
    assert main(args + ["--out", str(tmp_path / "a")]) == 2
    assert f"{csv}: point " in capsys.readouterr().err
    csv.write_text(text.replace("# attention=torch\n", "# attention=flash\n"))
    assert main(args + ["--out", str(tmp_path / "b")]) == 2
    assert f"{csv}: attention: 'flash' is not a calibration setting" in capsys.readouterr().err


def test_validate_refuses_a_profile_of_another_model(tmp_path, tiny_scenario, capsys):
    from capsim.cli import main
    rc = main(["validate", str(tiny_scenario), "--profile", "cpu__qwen2.5-0.5b__bf16.yaml", "--out",
               str(tmp_path / "x"), "--quiet"])
    assert rc == 2
    assert "profile is for 'qwen2.5-0.5b' but the scenario runs 'tiny'" in capsys.readouterr().err
