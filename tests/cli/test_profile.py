"""capsim profile compose / step: composed profiles are usable by `kind: profile` and agree with `kind: ops`."""

from __future__ import annotations

import json

import pytest

from capsim.cli import main
from sim.io.ops_schema import OpsStepTime
from sim.io.profiles import load_fitted, load_hardware, load_model
from sim.models.ops import build_ops_model
from sim.models.ops_compose import decode_plan, prefill_plan
from sim.models.spec import ModelSpec
from sim.models.step_time import EfficiencyModel, LinearModel
from tests.sim.helpers import run, scenario


@pytest.fixture(scope="module")
def composed(tmp_path_factory):
    out = tmp_path_factory.mktemp("compose") / "h100-sxm__llama-3.1-8b__bf16__ops.yaml"
    assert main(["profile", "compose", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--tp", "1",
                 "--max-batch", "128", "--out", str(out)]) == 0
    return out


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
    assert "step_time.model.tp: 3 does not divide" in capsys.readouterr().err
    assert main(["profile", "compose", "--model", "llama-3.1-8b", "--hardware", "a100-80g-sxm",
                 "--max-new-tokens", "16384", "--out", str(tmp_path / "x.yaml")]) == 2
    assert "stops at m = 8192" in capsys.readouterr().err
    assert main(["profile", "step", "--model", "llama-3.1-8b", "--hardware", "l4", "--batch", "1"]) == 2
    assert "unknown kernel table set 'l4'" in capsys.readouterr().err
