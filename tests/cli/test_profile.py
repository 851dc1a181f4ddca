"""capsim profile compose / step: composed profiles are usable by `kind: profile` and agree with `kind: ops`."""

from __future__ import annotations

import json

from pathlib import Path

import pytest

from capsim.cli import main
from sim.io.ops_schema import OpsStepTime
from sim.io.profiles import load_fitted, load_hardware, load_model
from sim.models.ops import build_ops_model
from sim.models.ops_compose import decode_plan, prefill_plan
from sim.models.spec import ModelSpec
from sim.models.step_time import EfficiencyModel, LinearModel
from tests.sim.helpers import run, scenario


def _compose(tmp_path_factory, model: str, tp: int, max_batch: int):
    """`capsim profile compose` of `model` on h100-sxm at TP `tp`; the profile's path."""
    out = tmp_path_factory.mktemp("compose") / f"h100-sxm__{model}__bf16__tp{tp}.yaml"
    assert main(["profile", "compose", "--model", model, "--hardware", "h100-sxm", "--tp", str(tp),
                 "--max-batch", str(max_batch), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def composed(tmp_path_factory):
    return _compose(tmp_path_factory, "llama-3.1-8b", 1, 128)


def test_composed_profile_matches_the_composition(composed):
    prof = load_fitted(composed)
    assert prof.model == "llama-3.1-8b" and prof.hardware == "h100-sxm" and prof.dtype == "bf16"
    assert prof.valid_range.max_batch == 128 and "h100-sxm" in prof.provenance.source
    assert prof.fit.n_heldout > 0 and prof.fit.mape < 0.2
    spec, hw = ModelSpec(load_model("llama-3.1-8b")), load_hardware("h100-sxm")
    ops = build_ops_model(OpsStepTime(), spec, hw, "bf16", "bf16", False)
    eff = EfficiencyModel(prof.efficiency, spec, spec.weight_read_bytes("bf16"), spec.kv_bytes_per_token("bf16"),
                          hw.peak_flops_per_s("bf16"), False)
    for b in (1, 8, 64):  # decode table points are the composition's own decode steps
        assert eff.step_s(decode_plan(b, 1024)) == pytest.approx(ops.step_s(decode_plan(b, 1024)), rel=1e-9)
    for n in (512, 4096):  # prefill MFU points reproduce the composed prefill
        assert eff.step_s(prefill_plan(1, n)) == pytest.approx(ops.step_s(prefill_plan(1, n)), rel=1e-6)
    lin = LinearModel(prof.linear)
    assert lin.step_s(decode_plan(32, 2048)) == pytest.approx(ops.step_s(decode_plan(32, 2048)), rel=0.2)


def test_scenario_runs_on_the_composed_profile(composed):
    kw = dict(model="llama-3.1-8b", hardware="h100-sxm", workload__num_requests=40,
              scheduler={"kind": "chunked", "max_num_seqs": 64, "max_num_batched_tokens": 2048, "chunk_tokens": 2048})
    a = run(scenario(step_time={"model": {"kind": "profile", "path": str(composed), "use": "efficiency"}}, **kw))
    b = run(scenario(step_time={"model": {"kind": "ops"}}, **kw))
    ta, tb = a.requests["ttft_s"].median(), b.requests["ttft_s"].median()
    assert ta == pytest.approx(tb, rel=0.25)


def test_step_prints_components(capsys):
    assert main(["profile", "step", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--batch", "8",
                 "--context", "2048", "--prefill", "512", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["step_ms"] == pytest.approx(sum(out["components_ms"].values()), rel=1e-9)
    assert out["components_ms"]["generation_attention"] > 0 and out["components_ms"]["context_attention"] > 0


def test_bad_requests_are_clear_errors(capsys, tmp_path):
    assert main(["profile", "step", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--tp", "3", "--batch", "1"]) == 2
    assert "--tp: 3 does not divide" in capsys.readouterr().err
    assert main(["profile", "compose", "--model", "llama-3.1-8b", "--hardware", "a100-80g-sxm",
                 "--max-new-tokens", "16384", "--out", str(tmp_path / "x.yaml")]) == 2
    assert "stops at m = 8192" in capsys.readouterr().err
    assert main(["profile", "step", "--model", "llama-3.1-8b", "--hardware", "l4", "--batch", "1"]) == 2
    assert "error: --tables (default: --hardware, l4): unknown kernel table set 'l4'" in capsys.readouterr().err
    # a scenario names its own field, and where the name came from
    scenario = Path(__file__).resolve().parents[2] / "scenarios" / "parallel" / "mixtral-8x7b-tp2-h100.yaml"
    assert main(["run", str(scenario), "--set", "hardware=l40s", "--set", "step_time.model.tables=l4",
                 "--set", "weight_format=fp8", "--set", "workload.num_requests=3"]) == 2
    assert "step_time.model.tables: unknown kernel table set 'l4'" in capsys.readouterr().err


@pytest.fixture(scope="module")
def composed_moe(tmp_path_factory):
    return _compose(tmp_path_factory, "mixtral-8x7b", 2, 64)


def test_a_moe_profile_is_composed_for_its_layout(composed_moe):
    """MoE (and MLA) models compose through the replica's ops model: the profile says its layout, and
    its decode table is the composition's own decode steps."""
    from sim.models.ops_compose import build_composed_model, cli_layout
    prof = load_fitted(composed_moe)
    assert prof.parallel.model_dump() == {"tp": 2, "pp": 1, "ep": 1} and "MoE" in prof.provenance.notes
    spec, hw = ModelSpec(load_model("mixtral-8x7b")), load_hardware("h100-sxm")
    ops = build_composed_model(OpsStepTime(tp=2), spec, hw, cli_layout(spec, tp=2), "bf16")
    eff = EfficiencyModel(prof.efficiency, spec, spec.weight_read_bytes("bf16"), spec.kv_bytes_per_token("bf16"),
                          2 * hw.peak_flops_per_s("bf16"), False)
    for b in (1, 8, 64):
        assert eff.step_s(decode_plan(b, 1024)) == pytest.approx(ops.step_s(decode_plan(b, 1024)), rel=1e-9)
    # more experts are touched as the batch grows: a decode step of 64 costs more than one of 1, far less than 64
    assert ops.step_s(decode_plan(1, 1024)) < ops.step_s(decode_plan(64, 1024)) < 64 * ops.step_s(decode_plan(1, 1024))


def test_a_profile_runs_only_on_its_layout(composed_moe):
    from sim.io.errors import ConfigError
    model = {"kind": "profile", "path": str(composed_moe), "use": "linear"}
    kw = dict(model="mixtral-8x7b", hardware="h100-sxm", workload__num_requests=20)
    res = run(scenario(step_time={"model": model}, parallel={"tp": 2}, **kw))
    assert res.summary["completed"] == 20
    with pytest.raises(ConfigError, match=r"parallel: the profile's times are for a replica of tp 2, pp 1, ep 1; "
                                          r"the scenario's replica is tp 2, pp 1, ep 2"):
        run(scenario(step_time={"model": model}, parallel={"tp": 2, "ep": 2}, **kw))


def test_moe_and_mla_models_compose_on_several_gpus(tmp_path):
    out = tmp_path / "ds.yaml"
    assert main(["profile", "compose", "--model", "deepseek-v3", "--hardware", "h200-sxm", "--tp", "8", "--ep", "8",
                 "--dtype", "fp8", "--max-batch", "64", "--out", str(out)]) == 0
    prof = load_fitted(out)
    assert prof.parallel.model_dump() == {"tp": 8, "pp": 1, "ep": 8} and prof.dtype == "fp8"
    assert "MoE, MLA" in prof.provenance.notes and "expert parallel 8" in prof.provenance.notes


def test_a_layout_the_model_cannot_take_names_the_flag(capsys, tmp_path):
    assert main(["profile", "compose", "--model", "mixtral-8x7b", "--hardware", "h100-sxm", "--tp", "2", "--ep", "3",
                 "--out", str(tmp_path / "x.yaml")]) == 2
    assert "--ep: 3 does not divide mixtral-8x7b's 8 experts (allowed: [1, 2]" in capsys.readouterr().err
    assert main(["profile", "step", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--ep", "2", "--batch", "1"]) == 2
    assert "--ep: 2 on llama-3.1-8b, a dense model without experts (allowed: 1)" in capsys.readouterr().err
    assert main(["profile", "step", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--pp", "0", "--batch", "1"]) == 2
    assert "--pp: expected a positive GPU count, got 0" in capsys.readouterr().err


def test_nvfp4_composes_on_blackwell_and_is_refused_elsewhere(tmp_path, capsys):
    out = tmp_path / "b200__llama-3.1-70b__nvfp4__tp2.yaml"
    assert main(["profile", "compose", "--model", "llama-3.1-70b", "--hardware", "b200", "--tp", "2",
                 "--dtype", "nvfp4", "--max-batch", "32", "--out", str(out)]) == 0
    capsys.readouterr()
    prof = load_fitted(out)
    assert prof.dtype == "nvfp4" and prof.efficiency.peak_tflops == pytest.approx(2 * 9000)
    assert "GEMM dtype nvfp4" in prof.provenance.notes
    steps = {}
    for dtype in ("fp8", "nvfp4"):
        assert main(["profile", "step", "--model", "llama-3.1-70b", "--hardware", "b200", "--tp", "2", "--dtype",
                     dtype, "--batch", "8", "--context", "1024", "--json"]) == 0
        steps[dtype] = json.loads(capsys.readouterr().out)["step_ms"]
    assert steps["nvfp4"] < steps["fp8"]   # half the weight bytes on a memory-bound decode
    assert main(["profile", "compose", "--model", "llama-3.1-70b", "--hardware", "h100-sxm", "--tp", "2",
                 "--dtype", "nvfp4", "--out", str(tmp_path / "x.yaml")]) == 2
    assert "h100-sxm: no gemm_nvfp4.csv" in capsys.readouterr().err


def test_bad_sizes_and_outputs_are_refused_before_composing(tmp_path, capsys):
    """Negative or zero shapes, a NaN host overhead, --out a folder or an existing file: usage errors naming the flag,
    not a pydantic traceback or a silently overwritten profile."""
    base = ["--model", "qwen3-8b", "--hardware", "h100-sxm"]
    for argv, message in (
            (["profile", "step", *base, "--batch", "-8"], "argument --batch: expected an integer in 0..100,000,000"),
            (["profile", "step", *base, "--batch", "8", "--host-overhead-ms", "nan"], "argument --host-overhead-ms"),
            (["profile", "compose", *base, "--max-batch", "0", "--out", str(tmp_path / "a.yaml")],
             "argument --max-batch: expected an integer in 1..100,000,000, got '0'")):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2 and message in capsys.readouterr().err
    small = [*base, "--max-batch", "8", "--max-new-tokens", "256", "--max-context", "1024"]
    assert main(["profile", "compose", *small, "--out", str(tmp_path)]) == 2
    assert f"--out {tmp_path}: is a folder, expected a file name" in capsys.readouterr().err
    out = tmp_path / "p.yaml"
    assert main(["profile", "compose", *small, "--out", str(out)]) == 0
    first = out.read_text()
    assert main(["profile", "compose", *small, "--tp", "2", "--out", str(out)]) == 2
    assert f"--out {out}: exists; pass --force" in capsys.readouterr().err and out.read_text() == first
    assert main(["profile", "compose", *small, "--tp", "2", "--out", str(out), "--force"]) == 0
    assert out.read_text() != first


def test_compose_and_step_refuse_sizes_outside_what_they_can_do(tmp_path, capsys):
    """--max-new-tokens below 128 had failed in the fit (a traceback at 1, a profile 374% off at 16); a
    --prefill-seqs of millions ran for minutes."""
    for n in ("1", "16", "127"):
        with pytest.raises(SystemExit) as stop:
            main(["profile", "compose", "--model", "qwen3-8b", "--hardware", "h100-sxm", "--max-new-tokens", n,
                  "--out", str(tmp_path / "p.yaml")])
        assert stop.value.code == 2
        assert f"--max-new-tokens: expected an integer in 128..100,000,000, got '{n}'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["profile", "step", "--model", "qwen3-8b", "--hardware", "h100-sxm", "--prefill", "1000",
              "--prefill-seqs", "10000000", "--allow-extrapolation"])
    assert stop.value.code == 2 and "expected an integer in 1..65,536" in capsys.readouterr().err
    assert not (tmp_path / "p.yaml").exists()


def test_out_of_range_names_the_commands_own_flags(capsys, tmp_path):
    """The tables' range error had told these commands' users to set a scenario field (and compose has no such
    switch at all)."""
    assert main(["profile", "step", "--model", "qwen3-8b", "--hardware", "h100-sxm", "--prefill", "100000000"]) == 2
    err = capsys.readouterr().err
    assert "beyond the measured range" in err and err.rstrip().endswith(
        "keep --batch, --context and --prefill within the tables or pass --allow-extrapolation (in proportion to the "
        "work)") and "step_time.allow_extrapolation" not in err
    assert main(["profile", "compose", "--model", "qwen3-8b", "--hardware", "h100-sxm", "--max-context", "100000000",
                 "--out", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.rstrip().endswith("keep --max-batch, --max-new-tokens and --max-context within the tables (a profile "
                                 "is composed from measurements only)") and not (tmp_path / "p.yaml").exists()
