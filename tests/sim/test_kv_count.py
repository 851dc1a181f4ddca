"""The count-only KV pool (sim.core.kv_count) gives the outputs of the block pool, byte for byte, in every run
where `counting_suffices`; and it is only chosen there."""

import random

import pytest

import sim.core.simulation as simulation
from sim.core.engine import ModelledExecutor
from sim.core.kv import BlockManager
from sim.core.kv_count import CountingBlockManager, counting_suffices
from sim.core.request import Request
from sim.core.simulation import Simulation
from tests.sim.helpers import scenario
from tests.sim.test_fast_forward import SLOW_PREFILL, light_scenario

NO_CACHE = {"block_tokens": 16, "format": "bf16", "budget": "12GiB", "prefix_caching": False}
TIGHT = {"block_tokens": 16, "format": "bf16", "budget": "300MiB", "prefix_caching": False, "admission": "on_demand"}
BUSY = {"kind": "continuous", "max_num_seqs": 64, "max_num_batched_tokens": 8192}

CASES = {
    "continuous": {"kv": NO_CACHE},
    "chunked": {"kv": NO_CACHE, "scheduler": {"kind": "chunked", "max_num_seqs": 32, "max_num_batched_tokens": 1024,
                                              "chunk_tokens": 256}},
    "fixed": {"kv": NO_CACHE, "scheduler": {"kind": "fixed", "max_num_seqs": 8}},
    "vllm-v1-null-block": {"kv": {**NO_CACHE, "admission": "on_demand"}, "scheduler": {"kind": "vllm_v1", "max_num_seqs": 16,
                                                         "max_num_batched_tokens": 512}},
    "recompute-preemption": {"kv": TIGHT, "scheduler": BUSY},
    "swap-preemption": {"kv": {**TIGHT, "preemption": "swap", "host_budget": "1GiB"}, "scheduler": BUSY},
    "swap-host-full": {"kv": {**TIGHT, "preemption": "swap", "host_budget": "20MiB"}, "scheduler": BUSY},
    "foresight-reserve": {"kv": {"block_tokens": 16, "format": "bf16", "budget": "300MiB",
                                 "prefix_index": "foresight"}},
    "foresight-cancellations": {"kv": {"block_tokens": 16, "format": "bf16", "budget": "300MiB",
                                            "prefix_index": "foresight", "preemption": "swap", "host_budget": "1GiB"},
                                     "workload": {"kind": "requests", "requests": [
                                         {"arrival_s": 0.3 * i, "prompt_tokens": 500 + 53 * i, "output_tokens": 40 + 9 * i,
                                          **({"cancel_at_s": 0.3 * i + 1.0} if i % 4 == 0 else {})}
                                         for i in range(60)]}},
    "speculative": {"kv": NO_CACHE, "scheduler": {"kind": "continuous", "max_num_seqs": 16,
                                                  "max_num_batched_tokens": 8192,
                                                  "speculative": {"draft": {"kind": "ngram"}, "num_draft_tokens": 4,
                                                                  "acceptance": {"kind": "constant", "a": 0.6}}}},
    "two-replicas-fault": {"kv": NO_CACHE, "cluster": {"replicas": 2, "router": {"kind": "round_robin"},
                                                       "faults": [{"replica": 0, "start_s": 20.0, "end_s": 35.0}]}},
    "request-list-with-prefixes": {"kv": NO_CACHE, "workload": {"kind": "requests", "requests": [
        {"arrival_s": 0.2 * i, "prompt_tokens": 300 + 41 * i, "output_tokens": 20 + 3 * i,
         "prefix": {"name": "sys" if i % 2 else "tools", "tokens": 160}} for i in range(80)]}},
    "disaggregated": {"kv": NO_CACHE, "disaggregation": {"prefill": {"replicas": 2}, "decode": {"replicas": 1},
                                                          "link": {"bandwidth_gbs": 5.0, "latency_s": 0.001}}},
}


def _outputs(sc, counting: bool, monkeypatch, pools=None) -> tuple:
    pools = [] if pools is None else pools

    def suffices(scenario, workload):
        return counting and counting_suffices(scenario, workload)

    monkeypatch.setattr(simulation, "counting_suffices", suffices)
    sim = Simulation(sc, ".")
    new_replica = sim._new_replica

    def spy(*args, **kwargs):
        replica = new_replica(*args, **kwargs)
        pools.append(replica.pool)
        return replica

    monkeypatch.setattr(sim, "_new_replica", spy)
    res = sim.run(executor=ModelledExecutor(sim.step_time))
    return res.summary, res.digest(), {type(p) for p in pools}


@pytest.mark.parametrize("case", list(CASES))
def test_counting_gives_the_block_pools_outputs(case, monkeypatch):
    sc = light_scenario(CASES[case])
    summary, digest, kinds = _outputs(sc, True, monkeypatch)
    assert kinds == {CountingBlockManager}
    block_summary, block_digest, block_kinds = _outputs(sc, False, monkeypatch)
    assert block_kinds == {BlockManager}
    assert (summary, digest) == (block_summary, block_digest)
    if case.endswith("preemption"):  # (the cases preempt: held blocks are given back and taken again)
        assert summary["preemptions"] > 0


def test_the_swap_case_swaps(monkeypatch):
    pools = []
    _outputs(light_scenario(CASES["swap-preemption"]), True, monkeypatch, pools)
    assert sum(p.stats.swap_outs for p in pools) > 0 and sum(p.stats.swap_ins for p in pools) > 0


SHARED = {"kind": "requests", "requests": [
    {"arrival_s": 0.1 * i, "prompt_tokens": 200, "output_tokens": 5, "prefix": {"name": "sys", "tokens": 160}}
    for i in range(4)]}


@pytest.mark.parametrize("overrides,expected", [
    ({"kv": NO_CACHE}, True),
    ({}, False),  # prefix caching on, every block indexed (vLLM): a later request may match any of them
    ({"kv__prefix_index": "foresight"}, True),
    ({"kv__prefix_index": "foresight", "kv__admission": "on_demand"}, False),  # recompute indexes its own blocks
    ({"kv__prefix_index": "foresight", "workload": SHARED}, False),
    ({"kv": NO_CACHE, "workload": SHARED}, True),
    ({"kv__prefix_index": "foresight", "kv__warm_prefixes": [{"name": "sys", "tokens": 160}]}, False),
    ({"kv__prefix_index": "foresight", "accuracy": {"p_correct": 0.5, "max_retries": 2}}, False),
    ({"kv__prefix_index": "foresight", "accuracy": {"p_correct": 0.5, "max_retries": 0}}, True),
    ({"kv": NO_CACHE, "workload": {"kind": "requests", "requests": [
        {"arrival_s": 0.0, "prompt_tokens": 30, "output_tokens": 10, "n": 3}]}}, False),  # branches share a prompt
])
def test_counting_is_chosen_only_where_no_block_can_be_shared(overrides, expected):
    sim = Simulation(scenario(**overrides), ".")
    assert counting_suffices(sim.scenario, sim.workload) is expected


def test_counts_follow_allocate_free_and_swap():
    pool = CountingBlockManager(10, 16, 1.0, host_blocks=4)
    a, b = Request(0, 0.0, 40, 10, 0.0), Request(1, 0.0, 100, 10, 0.0)
    assert pool.match(a) == [] and pool.can_allocate(a, 40)
    pool.allocate(a, 40)
    assert (a.num_blocks, pool.used_blocks, pool.free_blocks) == (3, 3, 7)
    pool.allocate(a, 48)  # still three blocks
    pool.allocate(a, 49)
    assert (a.num_blocks, pool.used_blocks) == (4, 4)
    assert not pool.can_allocate(b, 16 * 7) and pool.can_allocate(b, 16 * 6)
    with pytest.raises(RuntimeError, match="request 1: allocate 7 blocks with 6 free"):
        pool.allocate(b, 16 * 7)
    assert pool.can_swap_out(a)
    assert pool.swap_out(a, 1.0) == 4.0
    assert (a.num_blocks, a.swapped_blocks, pool.used_blocks, pool.host_used_blocks) == (0, 4, 0, 4)
    pool.allocate(b, 16 * 10)
    assert pool.peak_blocks == 10 and pool.free_blocks == 0
    pool.free(b)
    assert (b.num_blocks, pool.used_blocks, pool.free_blocks, pool.peak_blocks) == (0, 0, 10, 10)
    assert pool._take_empty(1) == [0] and pool.free_blocks == 9 and pool.empty_blocks == 9


def test_what_a_counting_pool_cannot_do_is_refused():
    pool = CountingBlockManager(10, 16, 1.0)
    with pytest.raises(RuntimeError, match="parallel sampling"):
        pool.share_tail(Request(0, 0.0, 40, 10, 0.0))
    with pytest.raises(RuntimeError, match="warm prefixes"):
        pool.warm(((("p", 1), 0, 32),), 32)
    with pytest.raises(RuntimeError, match="take 11 blocks with 10 free"):
        pool._take_empty(11)


def test_a_preempted_requests_own_blocks_are_refused_where_caching_is_on():
    """(counting_suffices rules this out by reserve admission; a scheduler that preempted anyway would be told.)"""
    caching = CountingBlockManager(10, 16, 1.0, prefix_caching=True)
    req = Request(0, 0.0, 40, 10, 0.0)
    caching.register(req, 32)  # nothing to index
    with pytest.raises(RuntimeError, match="cannot index a preempted request's blocks"):
        caching.register(req, 32, own_reuse=True)
    CountingBlockManager(10, 16, 1.0).register(req, 32, own_reuse=True)  # prefix caching off: nothing is indexed


def test_block_ids_are_refused():
    pool = CountingBlockManager(10, 16, 1.0)
    with pytest.raises(RuntimeError, match="free_ids needs BlockManager"):
        pool.free_ids()
    with pytest.raises(RuntimeError, match="last_used needs BlockManager"):
        pool.last_used(0)


def _random_mix(seed: int) -> dict:
    """A small run drawn at random among the settings under which counting_suffices holds."""
    rnd = random.Random(seed)
    kv = {"block_tokens": rnd.choice([8, 16, 32]), "format": "bf16",
          "budget": rnd.choice(["150MiB", "300MiB", "2GiB"])}
    cached = rnd.random() < 0.4
    if cached:
        kv["prefix_index"] = "foresight"
    else:
        kv.update(prefix_caching=False, admission=rnd.choice(["reserve", "on_demand"]))
        if kv["admission"] == "on_demand" and rnd.random() < 0.5:
            kv.update(preemption="swap", host_budget=rnd.choice(["20MiB", "1GiB"]))
    kind = rnd.choice(["continuous", "chunked", "fixed"] + (["vllm_v1"] if kv.get("admission") == "on_demand" else []))
    sched = {"kind": kind, "max_num_seqs": rnd.choice([4, 16, 64])}
    if kind != "fixed":
        sched["max_num_batched_tokens"] = max(rnd.choice([512, 2048, 8192]), sched["max_num_seqs"])
    if kind == "chunked":
        sched["chunk_tokens"] = min(256, sched["max_num_batched_tokens"])
    if kind in ("continuous", "chunked") and rnd.random() < 0.25:
        sched["speculative"] = {"draft": {"kind": "ngram"}, "num_draft_tokens": 3,
                                "acceptance": {"kind": "constant", "a": 0.5}}
    requests = []
    for _ in range(150):
        r = {"arrival_s": round(rnd.uniform(0, 30), 3), "prompt_tokens": rnd.randint(20, 1500),
             "output_tokens": rnd.randint(1, 300)}
        if rnd.random() < 0.2:
            r["cancel_at_s"] = r["arrival_s"] + round(rnd.uniform(0, 5), 3)
        if not cached and rnd.random() < 0.2:
            r["prefix"] = {"name": rnd.choice(["a", "b"]), "tokens": min(64, r["prompt_tokens"])}
        requests.append(r)
    mix = {"kv": kv, "scheduler": sched, "step_time": {"model": SLOW_PREFILL},
           "workload": {"kind": "requests", "requests": requests}}
    if "speculative" not in sched and rnd.random() < 0.25:
        mix["disaggregation"] = {"prefill": {"replicas": rnd.choice([1, 2])}, "decode": {"replicas": rnd.choice([1, 2])},
                                 "link": {"bandwidth_gbs": 0.5, "latency_s": 0.01},
                                 "first_token": rnd.choice(["prefill", "decode_admission", "decode_step",
                                                            "decode_recompute"])}
        return mix
    replicas = rnd.choice([1, 2, 3])
    mix["cluster"] = {"replicas": replicas, "router": {"kind": rnd.choice(["round_robin", "least_outstanding"])}}
    if replicas > 1 and rnd.random() < 0.6:
        mix["cluster"].update(faults=[{"replica": 0, "start_s": 5.0, "end_s": 25.0}],
                              on_failure=rnd.choice(["retry", "fail"]))
    if not cached and rnd.random() < 0.3:
        mix["accuracy"] = {"p_correct": 0.6, "max_retries": 2}
    return mix


@pytest.mark.parametrize("seed", range(8))
def test_random_mixes_give_the_block_pools_outputs(seed, monkeypatch):
    sc = scenario(**_random_mix(seed))
    summary, digest, kinds = _outputs(sc, True, monkeypatch)
    assert kinds == {CountingBlockManager}
    assert (summary, digest) == _outputs(sc, False, monkeypatch)[:2]
