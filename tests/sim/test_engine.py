"""Engine and scheduler properties: determinism, conservation, budgets, cancellation, admission, padding."""

import hashlib
import subprocess
import sys

import numpy as np
import pytest

from capsim.cli import main
from sim.core.metrics import stats, weighted_stats
from sim.core.schedulers import SCHEDULERS, AnySchedulerConfig
from tests.sim.helpers import run, scenario

POLICIES = {
    "fixed": {"kind": "fixed", "max_num_seqs": 8},
    "continuous": {"kind": "continuous", "max_num_seqs": 24, "max_num_batched_tokens": 6000},
    "chunked": {"kind": "chunked", "max_num_seqs": 24, "max_num_batched_tokens": 1024, "chunk_tokens": 512},
    "vllm_v1": {"kind": "vllm_v1", "max_num_seqs": 24, "max_num_batched_tokens": 1024},
}


def test_registry_matches_union():
    members = AnySchedulerConfig.__args__[0].__args__  # Annotated[Union[...], Field(discriminator="kind")]
    assert sorted(m.model_fields["kind"].default for m in members) == sorted(SCHEDULERS)
    for kind, (cfg, cls) in SCHEDULERS.items():
        assert cls.kind == kind == cfg.model_fields["kind"].default
    assert set(POLICIES) == set(SCHEDULERS), "add the new scheduler to the contract tests"


@pytest.mark.parametrize("admission", ["reserve", "on_demand"])
@pytest.mark.parametrize("kind", sorted(SCHEDULERS))
def test_scheduler_contract(kind, admission):
    """Every registered scheduler: budgets and pool respected, all finish, TTFT <= E2E, tokens conserved."""
    if kind == "vllm_v1" and admission == "reserve":
        pytest.skip("vllm_v1 allocates on demand only, as vLLM V1 (reserve is refused: tests/sim/test_vllm_v1.py)")
    sc = scenario(scheduler=POLICIES[kind], kv={"block_tokens": 16, "format": "bf16", "budget": "1GiB",
                                                   "admission": admission})
    res = run(sc)
    req, its, s = res.requests, res.iterations, res.summary
    assert (req["status"] == "finished").all(), req["status"].value_counts()
    assert (req["ttft_s"] <= req["e2e_s"] + 1e-12).all()
    assert its["kv_blocks_in_use"].max() <= s["kv_capacity_blocks"]
    assert its["batch_size"].max() <= POLICIES[kind]["max_num_seqs"]
    if kind != "fixed":
        assert its["new_tokens"].max() <= POLICIES[kind]["max_num_batched_tokens"]
    # token conservation: every stored token computed once, plus what preemption made us recompute
    computed = its["new_tokens"].sum()
    expected = (req["prompt_tokens"] + req["output_tokens"] - 1 + req["recomputed_tokens"]).sum()
    assert computed == expected
    assert (req["output_tokens"] >= 1).all()
    if admission == "reserve":
        assert s["preemptions"] == 0


def test_on_demand_preempts_and_recomputes_in_a_small_pool():
    sc = scenario(kv={"block_tokens": 16, "format": "bf16", "budget": "700MiB", "admission": "on_demand"},
                  scheduler=POLICIES["continuous"])
    s = run(sc).summary
    assert s["preemptions"] > 0 and s["recomputed_tokens"] > 0
    assert s["completed"] == s["requests"]


@pytest.mark.parametrize("kind", sorted(SCHEDULERS))
def test_same_seed_same_bytes(kind, tmp_path):
    path = tmp_path / "s.yaml"
    import yaml
    extra = {"kv__admission": "on_demand"} if kind == "vllm_v1" else {}   # vllm_v1 allocates on demand only
    path.write_text(yaml.safe_dump(scenario(scheduler=POLICIES[kind], **extra).model_dump(mode="json")))
    digests = []
    for i in range(2):
        out = tmp_path / f"out{i}"
        assert main(["run", str(path), "--out", str(out)]) == 0
        digests.append([hashlib.sha256((out / f).read_bytes()).hexdigest()
                        for f in ("summary.json", "requests.csv", "iterations.csv")])
    assert digests[0] == digests[1]
    out2 = tmp_path / "other-seed"
    assert main(["run", str(path), "--set", "seed=8", "--out", str(out2)]) == 0
    assert hashlib.sha256((out2 / "requests.csv").read_bytes()).hexdigest() != digests[0][1]


@pytest.mark.parametrize("cancel, outside, finish", [(0.012, 0.0, 0.012), (0.5, 1.0, 1.01), (0.01, 0.0, 0.01)])
def test_a_request_cancelled_at_the_replicas_door_leaves_from_there(cancel, outside, finish):
    """Cancelled before its replica took it from the inbox (the replica busy, or the cancel due before it reached
    the engine): it leaves cancelled, never admitted. The cancel had stopped the run with a KeyError."""
    reqs = [{"arrival_s": 0.0, "prompt_tokens": 3000, "output_tokens": 50},
            {"arrival_s": 0.01, "prompt_tokens": 100, "output_tokens": 5, "cancel_at_s": cancel,
             "outside_wait_s": outside},
            {"arrival_s": 0.02, "prompt_tokens": 100, "output_tokens": 5}]
    req = run(scenario(workload={"kind": "requests", "requests": reqs})).requests.set_index("id")
    assert req["status"].tolist() == ["finished", "cancelled", "finished"]
    assert np.isnan(req.loc[1, "admitted_s"]) and req.loc[1, "finish_s"] == pytest.approx(finish)


def test_cancel_before_arrival_is_refused():
    from sim.io.config import ExplicitRequest
    with pytest.raises(ValueError, match=r"cancel_at_s \(1.0\) is before arrival_s \(5.0\)"):
        ExplicitRequest(arrival_s=5.0, prompt_tokens=100, output_tokens=5, cancel_at_s=1.0)


def test_cancellation_frees_blocks_after_the_in_flight_iteration():
    reqs = [{"arrival_s": 0.0, "prompt_tokens": 2048, "output_tokens": 200, "cancel_at_s": 1.0},
            {"arrival_s": 0.0, "prompt_tokens": 2048, "output_tokens": 100}]
    res = run(scenario(workload={"kind": "requests", "requests": reqs}))
    req, its = res.requests.set_index("id"), res.iterations
    assert req.loc[0, "status"] == "cancelled"
    assert req.loc[1, "status"] == "finished"
    # freed at the end of the iteration in flight at t = 1.0 s, not at 1.0 s itself
    ends = its["start_s"] + its["duration_s"]
    in_flight = its[(its["start_s"] <= 1.0) & (ends > 1.0)].index[0]
    assert req.loc[0, "finish_s"] == pytest.approx(ends[in_flight])
    assert its.loc[in_flight, "batch_size"] == 2
    assert its.loc[in_flight + 1, "batch_size"] == 1
    blocks_each = -(-(2048 + 200 - 1) // 16)
    assert its.loc[in_flight, "kv_blocks_in_use"] - its.loc[in_flight + 1, "kv_blocks_in_use"] == blocks_each


def test_admission_control_rejects_hopeless_requests():
    reqs = [{"arrival_s": 0.0, "prompt_tokens": 2048, "output_tokens": 256},
            {"arrival_s": 0.0, "prompt_tokens": 2048, "output_tokens": 256}]
    sc = scenario(scheduler={"kind": "fixed", "max_num_seqs": 1}, slo={"e2e_s": 7.0},
                  admission_control={"reject_late": True}, workload={"kind": "requests", "requests": reqs})
    req = run(sc).requests.set_index("id")
    # the first needs 0.095 + 255 x ~26.3 ms ~ 6.8 s; the second would start after it: hopeless
    assert req.loc[0, "status"] == "finished" and req.loc[0, "met_slo"]
    assert req.loc[1, "status"] == "rejected"


def test_wrong_answers_retry_and_count_from_first_arrival():
    sc = scenario(accuracy={"p_correct": 0.5, "max_retries": 2})
    req = run(sc).requests
    assert (req["attempts"] > 1).any()
    assert req["attempts"].max() <= 3
    retried = req[req["attempts"] > 1]
    assert (retried["e2e_s"] > retried["ttft_s"]).all()
    n_correct = int(req["correct"].sum())
    assert 0 < n_correct < len(req)


def test_graph_padding_runs_the_next_captured_shape():
    base = {"kind": "linear", "constant_s": 0.01, "per_new_token_s": 1e-3}
    reqs = [{"arrival_s": 0.0, "prompt_tokens": 16, "output_tokens": 3} for _ in range(17)]
    plain = run(scenario(step_time={"model": base}, workload={"kind": "requests", "requests": reqs}))
    padded = run(scenario(step_time={"model": base, "graph_sizes": [1, 2, 4, 8, 16, 32]},
                          workload={"kind": "requests", "requests": reqs}))
    dec_plain = plain.iterations[plain.iterations["prefill_tokens"] == 0]["duration_s"]
    dec_pad = padded.iterations[padded.iterations["prefill_tokens"] == 0]["duration_s"]
    assert dec_plain.tolist() == pytest.approx([0.01 + 17e-3] * 2)
    assert dec_pad.tolist() == pytest.approx([0.01 + 32e-3] * 2)  # 17 rows run the 32-row graph
    reqs16 = reqs[:16]
    pad16 = run(scenario(step_time={"model": base, "graph_sizes": [16, 32]}, workload={"kind": "requests", "requests": reqs16}))
    assert pad16.iterations[pad16.iterations["prefill_tokens"] == 0]["duration_s"].tolist() == pytest.approx([0.026] * 2)


def test_weighted_stats_equal_expanded_percentiles():
    rng = np.random.default_rng(3)
    values = rng.random(200)
    weights = rng.integers(1, 9, size=200)
    w = weighted_stats(values, weights)
    e = stats(np.repeat(values, weights))
    for key in ("median", "p90", "p99", "max"):
        assert w[key] == e[key]
    assert w["mean"] == pytest.approx(e["mean"], rel=1e-12)


def test_sim_never_imports_torch():
    code = ("import sys, sim, sim.api, capsim.cli, sim.core.simulation, sim.models.memory, sim.models.roofline\n"
            "from capsim.cli import main\n"
            "assert 'torch' not in sys.modules, 'sim imported torch'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_sim_profile_does_not_pull_simpy():
    code = "import sys, sim.io.profiles, sim.models.roofline, sim.models.spec\nassert 'simpy' not in sys.modules\n"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_continuous_refuses_a_prompt_longer_than_the_token_budget_at_the_door():
    reqs = [{"arrival_s": 0.0, "prompt_tokens": 9000, "output_tokens": 5},
            {"arrival_s": 0.0, "prompt_tokens": 100, "output_tokens": 5}]
    res = run(scenario(workload={"kind": "requests", "requests": reqs}))
    r = res.requests.set_index("id")
    assert r.loc[0, "status"] == "rejected" and r.loc[1, "status"] == "finished"
    assert r.loc[1, "ttft_s"] < 0.1  # not stuck behind it
    assert res.summary["kv_rejected_requests"] == 0 and res.summary["memory_fit"]


def test_fitted_profile_range_is_enforced_or_warned_once(tmp_path, capsys):
    """The simulator refuses shapes beyond a fitted profile's valid_range unless allowed, then warns once."""
    import yaml

    from sim.io.errors import ConfigError
    from sim.core.simulation import Simulation
    prof = {"schema_version": 1, "model": "qwen3-8b", "dtype": "bf16",
            "linear": {"kind": "linear", "constant_s": 0.02, "per_new_token_s": 1e-5, "per_pair_s": 0.0},
            "valid_range": {"max_batch": 4, "max_new_tokens": 4096, "max_context_tokens": 8192},
            "provenance": {"source": "test"}}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(prof))
    wl = {"kind": "requests", "requests": [{"arrival_s": 0.0, "prompt_tokens": 100, "output_tokens": 20}] * 6}
    sc = scenario(step_time={"model": {"kind": "profile", "path": str(path)}}, workload=wl)
    with pytest.raises(ConfigError, match=r"tiny.yaml: valid_range: iteration with batch 6 > max_batch 4"):
        Simulation(sc, tmp_path).run()
    sc = scenario(step_time={"model": {"kind": "profile", "path": str(path)}, "allow_extrapolation": True}, workload=wl)
    res = Simulation(sc, tmp_path).run()
    assert res.summary["completed"] == 6
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "extrapolating beyond valid_range (batch 6 > max_batch 4)" in err


@pytest.mark.parametrize("kind", ["continuous", "chunked"])
def test_async_scheduling_holds_a_request_that_arrives_mid_iteration_back_one_iteration(kind, tmp_path):
    """Iterations of 0.1 s. A arrives on an idle engine at 0; B at 0.15, while iteration 2 runs: without async
    scheduling it joins iteration 3 (first token at 0.3); with it, iteration 3 was planned while 2 ran, so B joins
    iteration 4 (0.4). C arrives at 0.45, during the last iteration with work: nothing else is planned after it, the
    engine plans again at once and C runs in the next iteration either way; D finds the engine idle."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,16,5\n0.15,16,2\n0.45,16,1\n2.0,16,1\n")
    ttft = {}
    for ahead in (False, True):
        sched = dict(POLICIES[kind], async_scheduling=ahead)
        sc = scenario(scheduler=sched, workload={"kind": "trace", "path": str(trace), "format": "csv"},
                      step_time={"model": {"kind": "linear", "constant_s": 0.1, "per_new_token_s": 0.0,
                                           "per_pair_s": 0.0}})
        req = run(sc).requests.sort_values("arrival_s")
        assert (req["status"] == "finished").all()
        ttft[ahead] = [round(x, 9) for x in req["ttft_s"]]
    assert ttft[False] == [0.1, 0.15, 0.15, 0.1]
    assert ttft[True] == [0.1, 0.25, 0.15, 0.1]


@pytest.mark.parametrize("admission", ["reserve", "on_demand"])
def test_separate_prefill_batches_never_mix_and_keep_the_contract(admission):
    """scheduler.prefill_batches: separate (SGLang's default): no iteration holds prefill tokens and decodes, every
    request finishes, tokens are conserved, and the decodes wait while prompts run (a longer E2E than mixed)."""
    kv = {"block_tokens": 16, "format": "bf16", "budget": "1GiB", "admission": admission}
    out = {}
    for batches in ("mixed", "separate"):
        res = run(scenario(scheduler=dict(POLICIES["chunked"], prefill_batches=batches), kv=kv))
        req, its = res.requests, res.iterations
        assert (req["status"] == "finished").all()
        computed = its["new_tokens"].sum()
        assert computed == (req["prompt_tokens"] + req["output_tokens"] - 1 + req["recomputed_tokens"]).sum()
        assert its["new_tokens"].max() <= POLICIES["chunked"]["max_num_batched_tokens"]
        out[batches] = (((its["prefill_tokens"] > 0) & (its["decode_sequences"] > 0)).sum(), req["e2e_s"].mean())
    assert out["mixed"][0] > 100
    # on_demand preempts and recomputes; a recompute's last chunk of one token is counted as a decode sequence
    # in iterations.csv though the scheduler ran it as prefill work: at most that, in a handful of iterations
    assert out["separate"][0] == 0 if admission == "reserve" else out["separate"][0] <= 5
    assert out["separate"][1] > out["mixed"][1]


def test_separate_prefill_batches_hold_the_decodes_back_one_iteration(tmp_path):
    """Iterations of 0.1 s. A (5 outputs) arrives at 0, B (2 outputs) at 0.15. Mixed: B's prompt rides with A's
    third token (0.3), A ends at 0.5. Separate: the iteration from 0.2 runs B's prompt alone, A's tokens 3-5 come at
    0.4, 0.5, 0.6; B's first token is at 0.3 either way."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,16,5\n0.15,16,2\n")
    e2e = {}
    for batches in ("mixed", "separate"):
        sc = scenario(scheduler=dict(POLICIES["chunked"], prefill_batches=batches),
                      workload={"kind": "trace", "path": str(trace), "format": "csv"},
                      step_time={"model": {"kind": "linear", "constant_s": 0.1, "per_new_token_s": 0.0,
                                           "per_pair_s": 0.0}})
        req = run(sc).requests.sort_values("arrival_s")
        assert [round(x, 9) for x in req["ttft_s"]] == [0.1, 0.15]
        e2e[batches] = [round(x, 9) for x in req["e2e_s"]]
    assert e2e == {"mixed": [0.5, 0.25], "separate": [0.6, 0.25]}


def test_separate_prefill_batches_never_evict_a_decode_for_a_prompt(monkeypatch):
    """SGLang keeps room for its running decodes: under `separate`, a prompt's chunk that finds no free blocks waits
    (the decodes run) instead of evicting a decoding request; only when nothing else can run may it evict, as in a
    mixed iteration. Recorded: every eviction made while prompts are being planned, and the victim's phase."""
    from sim.core.schedulers.base import Scheduler
    from sim.core.schedulers.chunked import ChunkedPrefill
    evictions = []
    planning, preempt = ChunkedPrefill._schedule_prefills, Scheduler._preempt

    def schedule_prefills(self, plan, now_s, preempt=True):
        self._planning_prompts = True
        try:
            return planning(self, plan, now_s, preempt)
        finally:
            self._planning_prompts = False

    def record(self, req):
        if getattr(self, "_planning_prompts", False):
            evictions.append((self.config.prefill_batches, req.in_prefill, req.rid))
        return preempt(self, req)

    monkeypatch.setattr(ChunkedPrefill, "_schedule_prefills", schedule_prefills)
    monkeypatch.setattr(Scheduler, "_preempt", record)
    kv = {"block_tokens": 16, "format": "bf16", "budget": "300MiB", "admission": "on_demand"}
    for batches in ("mixed", "separate"):
        res = run(scenario(scheduler=dict(POLICIES["chunked"], prefill_batches=batches), kv=kv))
        assert res.summary["preemptions"] > 0
    # mixed plans the decodes first, so a prompt can only evict other prompts; separate plans prompts first and must
    # not take a decode's blocks either (when the decodes cannot run, none is left running to evict)
    assert evictions and all(victim_in_prefill for _, victim_in_prefill, _ in evictions)


def test_a_separate_chunked_scheduler_steps_its_decodes_explicitly_however_built():
    from sim.core.kv import BlockManager
    from sim.core.schedulers.chunked import ChunkedConfig, ChunkedPrefill
    pool = BlockManager(64, 16, 1024)
    for batches, lazy in (("mixed", True), ("separate", False)):
        cfg = ChunkedConfig(max_num_seqs=4, max_num_batched_tokens=256, chunk_tokens=128, prefill_batches=batches)
        assert ChunkedPrefill(cfg, pool, "reserve", lazy_decode=True).lazy is lazy
