"""The harness end to end on a two-layer model: points, resume, out-of-memory, profile round trip."""

from __future__ import annotations

import math
import shutil
import statistics

import pytest
import yaml

torch = pytest.importorskip("torch", reason="the calibration harness needs torch")

from calibration import fit as fitmod  # noqa: E402
from calibration.harness import Runner, calibrate, plan_layers  # noqa: E402
from calibration.points import COLUMNS, read_points  # noqa: E402
from calibration.shapes import Shape, grid_shapes, tiny_model_profile  # noqa: E402
from sim.io.profiles import load_fitted, load_hardware  # noqa: E402

from .conftest import TINY_SHAPES, tiny_config  # noqa: E402


def test_end_to_end_two_layer_model(tiny_run):
    cfg, res = tiny_run
    pts = read_points(res.points_path)
    assert [r["key"] for r in pts.rows] == [s.key for s in TINY_SHAPES]
    assert all(r["status"] == "ok" and r["time_s"] > 0 for r in pts.rows)
    assert all(r["time_min_s"] <= r["time_s"] <= r["time_max_s"] for r in pts.rows)
    assert all(len(r["times_s"].split(";")) == r["repeats"] and 3 <= r["repeats"] <= 9 for r in pts.rows)
    for k in ("model", "device", "dtype", "matmul_tflops", "copy_gbs", "torch", "layers_timed"):
        assert pts.meta[k], k
    # the profile on disk is the one returned, validated by the simulator's loader
    prof = load_fitted(res.profile_path)
    assert prof == res.profile
    assert prof.model == "tiny" and prof.dtype == "fp32" and not prof.cuda_graphs and prof.layers_timed is None
    assert prof.valid_range.max_batch == 8 and prof.valid_range.max_new_tokens == 32
    assert prof.valid_range.max_context_tokens == 65
    assert prof.fit.n_points == len(TINY_SHAPES) and prof.fit.n_heldout == 5   # 2 of 8 prefill and decode, 1 of 4 mixed
    assert prof.linear is not None and prof.efficiency is not None
    assert prof.efficiency.peak_tflops == pytest.approx(float(pts.meta["matmul_tflops"]))
    assert prof.provenance.points_csv == res.points_path.name
    assert prof.provenance.torch_version == torch.__version__
    assert "held-out" in prof.provenance.notes and "Measured ceilings" in prof.provenance.notes


def test_mfu_mbu_columns_use_sim_roofline(tiny_run):
    cfg, res = tiny_run
    pts = read_points(res.points_path)
    roof = fitmod.Roofline(fitmod.ModelSpec(cfg.model), "fp32", float(pts.meta["matmul_tflops"]) * 1e12,
                           float(pts.meta["copy_gbs"]) * 1e9)
    for r in pts.rows:
        o = fitmod.Observation.from_row(r)
        assert r["flops"] == pytest.approx(roof.flops(o))
        assert r["mfu"] == pytest.approx(roof.flops(o) / (r["time_s"] * roof.peak_flops_per_s))
        assert r["mbu"] == pytest.approx(roof.bytes_read(o) / (r["time_s"] * roof.bandwidth_bytes_per_s))


def test_resume_after_interruption(tmp_path):
    cfg = tiny_config(tmp_path / "p.yaml", max_points=7)
    first = calibrate(cfg)
    assert first.profile is None and first.measured_now == 7 and first.remaining == len(TINY_SHAPES) - 7
    # a kill in the middle of writing a row leaves a torn line: it is dropped on resume
    with open(first.points_path, "a") as fh:
        fh.write("decode:4x1@4,decode,o")
    calls = []
    orig = Runner.measure

    def counting(self, shape, index):
        calls.append(shape.key)
        return orig(self, shape, index)

    Runner.measure = counting
    try:
        second = calibrate(tiny_config(tmp_path / "p.yaml"))
    finally:
        Runner.measure = orig
    assert calls == [s.key for s in TINY_SHAPES[7:]]
    assert second.measured_now == len(TINY_SHAPES) - 7 and second.skipped == 7
    keys = [r["key"] for r in read_points(second.points_path).rows]
    assert keys == [s.key for s in TINY_SHAPES]
    assert second.profile is not None
    # a third run measures nothing and refits from the file
    third = calibrate(tiny_config(tmp_path / "p.yaml"))
    assert third.measured_now == 0 and third.profile.linear == second.profile.linear


def test_resume_refuses_a_different_run(tmp_path):
    calibrate(tiny_config(tmp_path / "p.yaml", max_points=1))
    with pytest.raises(ValueError, match=r"points from a different run \(dtype: file 'fp32', now 'bf16'\)"):
        calibrate(tiny_config(tmp_path / "p.yaml", dtype="bf16"))


def test_out_of_memory_point_is_recorded_and_skipped(tmp_path, monkeypatch):
    orig = Runner.measure
    bad = TINY_SHAPES[5].key

    def measure(self, shape, index):
        if shape.key == bad:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
        return orig(self, shape, index)

    monkeypatch.setattr(Runner, "measure", measure)
    res = calibrate(tiny_config(tmp_path / "p.yaml"))
    rows = {r["key"]: r for r in read_points(res.points_path).rows}
    assert rows[bad]["status"] == "oom" and "Tried to allocate" in rows[bad]["note"]
    assert rows[bad]["time_s"] is None and rows[bad]["new_tokens"] == TINY_SHAPES[5].features["new_tokens"]
    assert res.profile is not None and res.profile.fit.n_points == len(TINY_SHAPES) - 1
    # not retried on resume
    monkeypatch.setattr(Runner, "measure", lambda *a: pytest.fail("nothing should run"))
    assert calibrate(tiny_config(tmp_path / "p.yaml")).measured_now == 0


def test_other_errors_are_fatal(tmp_path, monkeypatch):
    monkeypatch.setattr(Runner, "measure", lambda self, s, i: (_ for _ in ()).throw(RuntimeError("shape mismatch")))
    with pytest.raises(RuntimeError, match="shape mismatch"):
        calibrate(tiny_config(tmp_path / "p.yaml"))


def test_layer_subset_is_scaled_and_stated(tmp_path):
    prof = tiny_model_profile(num_layers=4)
    shapes = [Shape.parse(k) for k in ("1x8@0", "2x8@0", "1x16@0", "1x1@8", "2x1@8", "4x1@8", "1x1@8+1x8@0")]
    res = calibrate(tiny_config(tmp_path / "p.yaml", model=prof, layers=1, shapes=shapes))
    rows = read_points(res.points_path).rows
    for r in rows:
        times = [float(t) for t in r["times_s"].split(";")]
        assert r["layers_timed"] == 1 and r["time_layers_s"] > 0
        assert statistics.median(times) == pytest.approx(r["time_s"], rel=1e-5)
        # scaled time = whole run + 3 more copies of the layer segment: above the run alone
        assert r["time_s"] > 3 * r["time_layers_s"]
    assert res.profile.layers_timed == 1
    assert "Only 1 of 4 layers" in res.profile.provenance.notes


def test_plan_layers_fits_memory():
    prof = tiny_model_profile(num_layers=8)
    shapes = [Shape.parse("1x16@0")]
    assert plan_layers(prof, "fp32", shapes, None) == 8
    assert plan_layers(prof, "fp32", shapes, 10**12) == 8
    assert plan_layers(prof, "fp32", shapes, 1) == 1
    per_layer = 4 * (64 * (64 + 2 * 32) + 64 * 64 + 3 * 64 * 128)   # 147,456 B of weights per layer
    layers = plan_layers(prof, "fp32", shapes, 1_000_000)
    assert 1 < layers < 8 and layers * per_layer < 0.9 * 1_000_000


def test_named_grids_are_sane():
    from sim.io.profiles import load_model
    m = load_model("qwen2.5-0.5b")
    for device in ("cpu", "cuda"):
        sizes = [len(grid_shapes(g, device, m)) for g in ("quick", "standard", "full")]
        assert sizes == sorted(sizes) and sizes[0] >= 20, (device, sizes)
        for g in ("quick", "standard", "full"):
            shapes = grid_shapes(g, device, m)
            assert {s.kind for s in shapes} == {"prefill", "decode", "mixed"}
            assert any(len({gr.cached for gr in s.groups}) > 1 and s.kind == "decode" for s in shapes)
            assert len({s.key for s in shapes}) == len(shapes)


def test_profile_runs_in_the_simulator(tmp_path, monkeypatch):
    """Round trip: the written profile drives a simulation through a scenario's step_time.model.path.
    bf16: scenarios have no fp32 weight/KV format, and the efficiency table is indexed by bytes in the format."""
    cfg = tiny_config(tmp_path / "run" / "cpu__tiny__bf16.yaml", dtype="bf16")
    res = calibrate(cfg)
    root = tmp_path / "profiles"
    (root / "models").mkdir(parents=True)
    (root / "hardware").mkdir()
    (root / "fitted").mkdir()
    (root / "models" / "tiny.yaml").write_text(yaml.safe_dump(cfg.model.model_dump(mode="json")))
    shutil.copy(fitmod.Path(fitmod.__file__).parent.parent / "profiles" / "hardware" / "l4.yaml", root / "hardware")
    shutil.copy(res.profile_path, root / "fitted")
    monkeypatch.setenv("CAPSIM_PROFILES", str(root))
    from sim.api import run
    from sim.io.config import Scenario

    for use in ("linear", "efficiency"):
        sc = Scenario.model_validate({
            "name": "roundtrip", "model": "tiny", "hardware": "l4", "weight_format": "bf16",
            "kv": {"budget": "64MiB", "format": "bf16"},
            "scheduler": {"kind": "chunked", "max_num_seqs": 4, "max_num_batched_tokens": 32, "chunk_tokens": 16},
            "step_time": {"model": {"kind": "profile", "path": res.profile_path.name, "use": use},
                          "allow_extrapolation": True},
            "workload": {"kind": "requests", "requests": [
                {"arrival_s": 0.0, "prompt_tokens": 16, "output_tokens": 4},
                {"arrival_s": 0.0, "prompt_tokens": 8, "output_tokens": 3}]},
        })
        out = run(sc, tmp_path)
        assert out.summary["completed"] == 2
        assert (out.iterations["duration_s"] > 0).all()
        if use == "linear":
            assert (out.iterations["duration_s"] >= res.profile.linear.constant_s).all()


def test_stated_error_is_what_the_simulator_makes(tiny_run):
    """The YAML, read back and evaluated by sim.models.step_time on the held-out CSV points, gives the stated MAPE."""
    cfg, res = tiny_run
    prof = load_fitted(res.profile_path)
    rows = [r for r in read_points(res.points_path).rows if r["status"] == "ok"]
    _, held = fitmod.split_heldout([fitmod.Observation.from_row(r) for r in rows])
    model = fitmod.LinearModel(prof.linear)
    errs = [abs(model.step_s(o.plan()) / o.time_s - 1) for o in held]
    assert prof.fit.n_heldout == len(held)
    assert sum(errs) / len(errs) == pytest.approx(prof.fit.mape, rel=1e-9)
    assert max(errs) == pytest.approx(prof.fit.max_abs_rel_err, rel=1e-9)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available: CUDA events, graphs and memory "
                                                          "statistics are exercised only on a CUDA device")
@pytest.mark.parametrize("graphs", [False, True])
def test_cuda_events_graphs_and_memory(tmp_path, graphs):
    res = calibrate(tiny_config(tmp_path / "p.yaml", device="cuda", dtype="bf16", cuda_graphs=graphs,
                                matmul_n=1024, copy_bytes=1 << 24))
    rows = read_points(res.points_path).rows
    assert all(r["status"] == "ok" for r in rows)
    assert all(r["act_peak_bytes"] is not None and r["act_peak_bytes"] >= 0 for r in rows)
    assert int(read_points(res.points_path).meta["weights_bytes"]) > 0
    decode = [r for r in rows if r["kind"] == "decode"]
    if graphs:
        assert all(r["graph_pool_bytes"] is not None and r["note"] == "cuda graph" for r in decode)
        assert {r["padded_seqs"] for r in decode} <= {1, 2, 4, 8}
        assert all(r["num_seqs"] == r["padded_seqs"] for r in decode)   # features of the batch that ran
        assert res.profile.cuda_graphs and res.profile_path.name.endswith(".yaml")
    assert "Memory (CUDA)" in res.profile.provenance.notes


@pytest.mark.gpu
@pytest.mark.skipif(not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()),
                    reason="MPS not available (Apple GPU only)")
def test_mps_runs(tmp_path):
    res = calibrate(tiny_config(tmp_path / "p.yaml", device="mps", dtype="fp16", matmul_n=512, copy_bytes=1 << 22))
    assert res.profile is not None


def test_cuda_graphs_need_cuda(tmp_path):
    with pytest.raises(ValueError, match="--cuda-graphs needs --device cuda"):
        tiny_config(tmp_path / "p.yaml", cuda_graphs=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message when CUDA is absent")
def test_cuda_absent_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"--device cuda: torch reports no CUDA device"):
        calibrate(tiny_config(tmp_path / "p.yaml", device="cuda"))


def test_padded_shapes_for_graphs():
    s = Shape.parse("decode:3x1@16+2x1@8")
    p = s.padded(8)
    assert p.num_seqs == 8 and p.groups[-1].text == "3x1@0"
    assert s.padded(5) is s
    assert math.isclose(s.features["pairs"], 3 * 17 + 2 * 9)
    assert COLUMNS[0] == "key"


def test_thread_clock_for_shared_cpus(tmp_path):
    res = calibrate(tiny_config(tmp_path / "p.yaml", clock="thread", shapes=TINY_SHAPES[:8]))
    pts = read_points(res.points_path)
    assert pts.meta["clock"] == "thread"
    assert all(r["wall_s"] is not None and r["time_s"] > 0 for r in pts.rows)
    assert "thread's CPU time" in res.profile.provenance.notes
    with pytest.raises(ValueError, match="--clock thread .* needs --device cpu and --threads 1"):
        calibrate(tiny_config(tmp_path / "q.yaml", clock="thread", threads=2))


def test_two_runs_cannot_write_one_points_file(tmp_path):
    import os
    import subprocess
    import sys
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (tmp_path / "p.csv.lock").write_text(str(other.pid))
        with pytest.raises(ValueError, match=rf"another calibration \(pid {other.pid}\) is writing these points"):
            calibrate(tiny_config(tmp_path / "p.yaml"))
    finally:
        other.kill()
        other.wait()
    # a lock left by a process that is gone is taken over, and released at the end
    res = calibrate(tiny_config(tmp_path / "p.yaml", shapes=TINY_SHAPES[:8]))
    assert res.profile is not None and not (tmp_path / "p.csv.lock").exists()
    assert not os.path.exists(str(res.points_path) + ".lock")


def test_attention_policy_is_checked_recorded_and_named(tmp_path):
    with pytest.raises(ValueError, match=r"--attention no-cudnn needs --device cuda"):
        tiny_config(tmp_path / "p.yaml", attention="no-cudnn")
    with pytest.raises(ValueError, match=r"--attention 'flash': expected one of torch, no-cudnn"):
        tiny_config(tmp_path / "p.yaml", attention="flash")
    hw = load_hardware("h200-sxm")
    cfg = tiny_config(tmp_path, device="cuda", attention="no-cudnn", hardware=hw, cuda_graphs=True)
    assert cfg.profile_path().name == "h200-sxm__tiny__fp32__graphs__no-cudnn.yaml"
    assert tiny_config(tmp_path, device="cuda", hardware=hw).profile_path().name == "h200-sxm__tiny__fp32.yaml"
    res = calibrate(tiny_config(tmp_path / "p.yaml", shapes=TINY_SHAPES[:4]))
    assert read_points(res.points_path).meta["attention"] == "torch"
    assert "attention: torch's SDPA choice" in res.profile.provenance.notes


def test_resume_refuses_points_of_another_attention_policy(tmp_path):
    res = calibrate(tiny_config(tmp_path / "p.yaml", max_points=1))
    text = res.points_path.read_text()
    res.points_path.write_text(text.replace("# attention=torch\n", "# attention=no-cudnn\n"))
    with pytest.raises(ValueError, match=r"attention: file 'no-cudnn', now 'torch'"):
        calibrate(tiny_config(tmp_path / "p.yaml"))
    # a points file from before the key was written means torch's choice: it resumes
    res.points_path.write_text(text.replace("# attention=torch\n", ""))
    assert calibrate(tiny_config(tmp_path / "p.yaml")).profile is not None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available: the attention policy only changes "
                                                          "which CUDA kernels serve scaled_dot_product_attention")
def test_no_cudnn_attention_runs_on_cuda(tmp_path):
    res = calibrate(tiny_config(tmp_path, device="cuda", dtype="bf16", attention="no-cudnn",
                                matmul_n=1024, copy_bytes=1 << 24))
    assert res.profile_path.name.endswith("__no-cudnn.yaml")
    assert read_points(res.points_path).meta["attention"] == "no-cudnn"
    assert all(r["status"] == "ok" for r in read_points(res.points_path).rows)
