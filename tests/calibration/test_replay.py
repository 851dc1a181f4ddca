"""The real replay engine: the simulator's scheduler driving the reference model, in capsim run's tables;
the simulator fed the measured iteration times makes the same plans, iteration by iteration."""

from __future__ import annotations

import time

import numpy as np
import pytest
import yaml

torch = pytest.importorskip("torch", reason="the replay runs the reference model in torch")

from calibration.replay import (ReplayConfig, Replayer, check_replayable, ngram_propose,  # noqa: E402
                                prompt_token_ids, replay)
from calibration.shapes import tiny_model_profile  # noqa: E402
from calibration.step_checks import MeasuredSteps, plans_check  # noqa: E402
from sim.io.config import load_scenario  # noqa: E402
from sim.core.metrics import ITERATION_COLUMNS, REQUEST_COLUMNS  # noqa: E402
from sim.core.simulation import Simulation  # noqa: E402


def write_scenario(tmp_path, scheduler: dict, workload: dict | None = None, **over) -> tuple:
    """A tiny-model scenario (model YAML beside it) and its loaded form."""
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(tiny_model_profile().model_dump(mode="json")))
    sc = {"name": "tiny-replay", "seed": 3, "model": "tiny.yaml", "hardware": "l4",
          "kv": {"budget": "64MiB", "block_tokens": 16, "format": "bf16"},
          "scheduler": scheduler,
          "step_time": {"model": {"kind": "linear", "constant_s": 0.001, "per_new_token_s": 1e-5, "per_pair_s": 0.0}},
          "workload": workload or {"kind": "synthetic", "num_requests": 14,
                                   "arrival": {"kind": "poisson", "rate_rps": 400},
                                   "prompt_tokens": {"kind": "uniform", "low": 3, "high": 40},
                                   "output_tokens": {"kind": "uniform", "low": 1, "high": 12}}}
    for k, v in over.items():
        sc[k] = v
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(sc))
    return load_scenario(path)


CONTINUOUS = {"kind": "continuous", "max_num_seqs": 4, "max_num_batched_tokens": 64}
CHUNKED = {"kind": "chunked", "max_num_seqs": 4, "max_num_batched_tokens": 24, "chunk_tokens": 16}


@pytest.fixture(scope="module")
def replayer():
    return Replayer(tiny_model_profile(), ReplayConfig(threads=1, warmup=1))


def test_tables_have_capsim_runs_format(tmp_path, replayer):
    scenario, base = write_scenario(tmp_path, CONTINUOUS)
    run = replayer.run(scenario, base)
    sim = Simulation(scenario, base).run()
    res = run.result
    assert list(res.requests.columns) == list(REQUEST_COLUMNS) == list(sim.requests.columns)
    assert list(res.iterations.columns) == list(ITERATION_COLUMNS) == list(sim.iterations.columns)
    assert dict(res.requests.dtypes) == dict(sim.requests.dtypes)
    assert set(sim.summary) <= set(res.summary) and res.summary["replay"]["clock"] == "wall"
    assert (res.requests["status"] == "finished").all()
    np.testing.assert_array_equal(res.requests["output_tokens"], sim.requests["output_tokens"])
    # the iterations ran back to back while busy; every duration is the measured forward plus host time
    its, det = res.iterations, run.detail
    np.testing.assert_allclose(det["duration_s"], its["duration_s"])
    np.testing.assert_allclose(det["host_s"] + det["forward_s"], det["duration_s"], rtol=1e-9, atol=1e-12)
    assert (its["duration_s"] > 0).all() and (det["forward_s"] > 0).all()
    np.testing.assert_allclose(det["forward_wall_s"], det["forward_s"], rtol=0.05, atol=2e-4)   # wall clock
    assert (det["forward_cpu_s"] > 0).all()
    # every output token came from the model, and a request's first token after the prompt's prefill
    for rid, out in run.outputs.items():
        assert len(out) == res.requests.loc[rid, "output_tokens"]
    assert (res.requests["first_token_s"] >= res.requests["arrival_s"]).all()
    run.write(tmp_path / "out")
    assert (tmp_path / "out" / "requests.csv").exists() and (tmp_path / "out" / "replay_iterations.csv").exists()


@pytest.mark.parametrize("scheduler,kv", [
    (CONTINUOUS, {}),
    (CHUNKED, {}),
    # on-demand KV in a small pool: preemptions (recompute) must replay identically too
    (dict(CHUNKED, max_num_seqs=6), {"budget": 6 * 16 * 2 * 2 * 2 * 16 * 2, "admission": "on_demand"}),
], ids=["continuous", "chunked", "chunked-preempting"])
def test_simulator_with_measured_step_times_makes_the_same_plans(tmp_path, replayer, scheduler, kv):
    scenario, base = write_scenario(tmp_path, scheduler)
    if kv:
        scenario = scenario.model_copy(update={"kv": scenario.kv.model_copy(update=kv)})
    run = replayer.run(scenario, base)
    if kv:
        assert run.result.summary["preemptions"] > 0
    sim = Simulation(scenario, base, lazy_decode=False)
    cost = MeasuredSteps(run.result.iterations["duration_s"].tolist(), fallback=sim.step_time)
    sim.step_time = cost
    res = sim.run()
    # iteration by iteration: the same requests with the same new and cached tokens
    assert cost.plans == [[(it[0].rid, it[1], it[2]) for it in p.items] for p in run.plans]
    a, b = res.iterations, run.result.iterations
    for c in ("prefill_tokens", "decode_sequences", "pairs", "kv_blocks_in_use", "batch_size", "new_tokens"):
        np.testing.assert_array_equal(a[c], b[c], err_msg=c)
    np.testing.assert_allclose(a["start_s"], b["start_s"], rtol=0, atol=1e-9)
    for c in ("admitted_s", "first_token_s", "finish_s", "ttft_s", "e2e_s", "tpot_s", "max_itl_s"):
        np.testing.assert_allclose(res.requests[c], run.result.requests[c], rtol=0, atol=1e-9, err_msg=c)
    for key in ("ttft_s", "itl_s", "tpot_s", "e2e_s"):
        for st in ("mean", "median", "p90", "p99"):
            assert res.summary[key][st] == pytest.approx(run.result.summary[key][st], abs=1e-9)
    check = plans_check(run, scenario, base)
    assert check["identical"] and check["max_abs_metric_difference"] < 1e-9


def test_thread_clock_skips_idle_time(tmp_path):
    reqs = [{"arrival_s": 30.0 * i, "prompt_tokens": 8, "output_tokens": 3} for i in range(3)]
    scenario, base = write_scenario(tmp_path, CONTINUOUS, {"kind": "requests", "requests": reqs})
    t0 = time.perf_counter()
    run = replay(scenario, base, ReplayConfig(threads=1, clock="thread", warmup=0))
    assert time.perf_counter() - t0 < 20       # 60 s of idle trace, jumped over
    r = run.result.requests
    np.testing.assert_allclose(r["arrival_s"], [0.0, 30.0, 60.0])
    assert (r["admitted_s"] == r["arrival_s"]).all()      # idle engine: planned at the arrival
    assert (r["e2e_s"] < 5).all() and run.result.summary["replay"]["clock"] == "thread"
    with pytest.raises(ValueError, match="needs device cpu and threads 1"):
        torch.set_num_threads(2)
        try:
            replay(scenario, base, ReplayConfig(threads=2, clock="thread", warmup=0))
        finally:
            torch.set_num_threads(1)


def test_ngram_speculation_runs_for_real_and_keeps_greedy_outputs(tmp_path, replayer):
    spec = {"draft": {"kind": "ngram"}, "num_draft_tokens": 3, "acceptance": {"kind": "constant", "a": 0.5}}
    wl = {"kind": "synthetic", "num_requests": 8, "arrival": {"kind": "poisson", "rate_rps": 400},
          "prompt_tokens": {"kind": "uniform", "low": 4, "high": 24},
          "output_tokens": {"kind": "uniform", "low": 6, "high": 16}}
    plain_sc, base = write_scenario(tmp_path, CONTINUOUS, wl)
    spec_sc, _ = write_scenario(tmp_path, dict(CONTINUOUS, speculative=spec), wl)
    plain = replayer.run(plain_sc, base)
    fast = replayer.run(spec_sc, base)
    rep = fast.result.summary["speculative"]
    assert rep["rounds"] > 0 and rep["draft_tokens"] >= rep["accepted_tokens"] > 0
    assert fast.detail["spec_rounds"].sum() > 0
    # verification keeps greedy decoding's tokens: speculation changes when they come, not what they are
    assert fast.outputs == plain.outputs
    assert (fast.result.requests["output_tokens"] == plain.result.requests["output_tokens"]).all()
    assert fast.result.summary["iterations"] < plain.result.summary["iterations"]
    # the simulator given the measured times and the replay's drafts and acceptances makes the same plans
    check = plans_check(fast, spec_sc, base)
    assert check["identical"] and check["max_abs_metric_difference"] < 1e-9


def test_ngram_lookup():
    assert ngram_propose([5, 6, 7, 8, 5, 6], 2, 1, 3) == [7, 8]
    assert ngram_propose([1, 2, 3, 4], 3, 1, 3) == []
    assert ngram_propose([9, 9, 9], 4, 1, 2) == [9]          # first occurrence of the longest suffix
    assert ngram_propose([1, 2, 1, 3, 1, 2], 3, 2, 2) == [1, 3, 1]


def test_shared_prefixes_share_token_ids():
    seg_a = (((1, 77), 0, 8), ((0, 0), 0, 4))
    seg_b = (((1, 77), 0, 8), ((0, 1), 0, 4))
    a, b = prompt_token_ids(seg_a, 1000, {}), prompt_token_ids(seg_b, 1000, {})
    assert a[:8] == b[:8] and a[8:] != b[8:] and len(a) == 12
    # a later turn continuing request 0 gets request 0's real outputs
    c = prompt_token_ids((((3, 0), 0, 3),), 1000, {0: [11, 12, 13]})
    assert c == [11, 12, 13]


def test_unsupported_scenarios_are_refused(tmp_path):
    spec = {"draft": {"kind": "draft_model", "model": "qwen3-0.6b"}, "num_draft_tokens": 2,
            "acceptance": {"kind": "constant", "a": 0.5}}
    sc, _ = write_scenario(tmp_path, dict(CONTINUOUS, speculative=spec), cluster={"replicas": 2})
    with pytest.raises(ValueError, match="cluster.*draft_model"):
        check_replayable(sc)


def _accelerators():
    out = []
    for dev in ("cuda", "mps"):
        ok = torch.cuda.is_available() if dev == "cuda" else bool(
            getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
        out.append(pytest.param(dev, marks=[pytest.mark.gpu, pytest.mark.skipif(
            not ok, reason=f"{dev.upper()} not available")]))
    return out


@pytest.mark.parametrize("device", _accelerators())
def test_replay_on_an_accelerator(tmp_path, device):
    scenario, base = write_scenario(tmp_path, CHUNKED)
    run = replay(scenario, base, ReplayConfig(device=device, warmup=1))
    assert (run.result.requests["status"] == "finished").all()
    assert run.result.summary["replay"]["device"] == device
    check = plans_check(run, scenario, base)
    assert check["identical"] and check["max_abs_metric_difference"] < 1e-9


@pytest.mark.parametrize("scheduler", [CONTINUOUS, CHUNKED], ids=["continuous", "chunked"])
def test_batched_decode_attention_gives_the_per_request_paths_tokens(tmp_path, scheduler):
    # all at once: the plans do not depend on the measured durations, so the two replays plan alike
    wl = {"kind": "synthetic", "num_requests": 10, "arrival": {"kind": "all_at_once"},
          "prompt_tokens": {"kind": "uniform", "low": 3, "high": 40},
          "output_tokens": {"kind": "uniform", "low": 2, "high": 12}}
    scenario, base = write_scenario(tmp_path, scheduler, wl)
    runs = {b: Replayer(tiny_model_profile(), ReplayConfig(threads=1, warmup=1, batched_decode=b)).run(scenario, base)
            for b in (False, True)}
    assert runs[True].result.summary["replay"]["batched_decode"] is True
    assert runs[False].result.summary["replay"]["batched_decode"] is False
    assert runs[True].outputs == runs[False].outputs and len(runs[True].outputs) == 10
    assert [p.items for p in runs[True].plans] == [p.items for p in runs[False].plans]
    assert max(runs[True].detail["decode_seqs"]) >= 2     # the batched path ran


def test_batched_decode_attention_equals_one_call_per_request():
    from calibration.model import KVCache, ReferenceModel
    from calibration.replay import _decode_rows
    from calibration.replay_slots import KVSlots
    from calibration.shapes import Group, Shape
    torch.manual_seed(0)
    model = ReferenceModel(tiny_model_profile(), "fp32", "cpu")
    slots = KVSlots(model, capacity=48)
    slots.reserve(4)
    for k, v in slots.slabs:
        k.normal_()
        v.normal_()
    # three decodes of different lengths around a prefill chunk of 6 tokens after a 9-token prefix
    items = [(0, 1, 5), (1, 6, 9), (2, 1, 17), (3, 1, 30)]     # (slab row, new, cached)
    shape = Shape(tuple(Group(1, n, h) for _, n, h in items))
    x = torch.randn(sum(n for _, n, _ in items), model.profile.hidden_size)

    def views(r, n, h):
        return [(k[r:r + 1, :, :h + n], v[r:r + 1, :, :h + n]) for k, v in slots.slabs]

    per_layer = list(zip(*[views(*it) for it in items]))
    want = model.run_layers(x, model.prepare(shape), KVCache([list(g) for g in per_layer]))
    batch = model.prepare(shape)
    batch.decode = _decode_rows([(0, 0, 5), (7, 2, 17), (8, 3, 30)], {0, 2, 3}, "cpu")
    mixed = [[None, views(1, 6, 9)[layer], None, None] for layer in range(model.num_layers)]
    got = model.run_layers(x, batch, KVCache(mixed, slots.slabs))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
