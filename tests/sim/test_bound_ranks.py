"""Attention-DP ranks bound to their requests (parallel.attention_dp_routing, sim.core.schedulers.ranked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.core.schedulers.ranked import RankedScheduler
from sim.core.simulation import Simulation
from sim.core.step import RANK_LOAD_FIELDS, StepPlan
from sim.io.config import load_scenario
from sim.io.errors import ConfigError


def _scenario(tmp_path: Path, routing: str | None, name: str = "s", users: int | None = None, rate: float = 6.0,
              max_num_seqs: int = 64, seed: int = 0) -> Path:
    route = f", attention_dp_routing: {routing}" if routing else ""
    arrival = (f"kind: closed_loop\n  users: {users}" if users else
               f"kind: synthetic\n  arrival: {{kind: poisson, rate_rps: {rate}}}")
    p = tmp_path / f"{name}.yaml"
    p.write_text(f"""name: {name}
seed: {seed}
model: qwen3-235b-a22b
hardware: h100-sxm
weight_format: fp8
parallel: {{tp: 1, ep: 8, attention_dp: 8{route}}}
kv: {{budget: {{gpu_memory_utilization: 0.9}}}}
scheduler: {{kind: chunked, max_num_seqs: {max_num_seqs}, max_num_batched_tokens: 32768, chunk_tokens: 4096}}
step_time: {{model: {{kind: ops}}, allow_extrapolation: true}}
workload:
  {arrival}
  num_requests: 160
  prompt_tokens: {{kind: fixed, value: 2048}}
  output_tokens: {{kind: fixed, value: 32}}
""")
    return p


def _sim(path: Path) -> Simulation:
    sc, base = load_scenario(path)
    return Simulation(sc, base)


def test_bound_routing_needs_ranks_and_limits_the_ranks_share_evenly(tmp_path):
    p = _scenario(tmp_path, "random")
    p.write_text(p.read_text().replace("attention_dp: 8, ", "").replace("ep: 8", "ep: 1"))
    with pytest.raises(ConfigError, match=r"parallel\.attention_dp_routing: attention_dp_routing random binds requests "
                                          r"to attention data-parallel ranks, and attention_dp 1 has one; allowed"):
        load_scenario(p)
    with pytest.raises(ConfigError, match=r"scheduler\.max_num_seqs: 60 is the replica's over its 8 attention-DP ranks"
                                          r".*allowed: a multiple of 8"):
        load_scenario(_scenario(tmp_path, "round_robin", max_num_seqs=60))
    load_scenario(_scenario(tmp_path, None, max_num_seqs=60))  # one shared queue: any limit


def test_each_bound_rank_keeps_its_share_of_the_batch(tmp_path):
    """64 users at once on 8 ranks of 2 running each (max_num_seqs 16): round-robin puts 8 on every rank, so each
    runs 2 and queues 6, never more than 2 at once; the shared queue runs 16 of them whatever their rank."""
    sim = _sim(_scenario(tmp_path, "round_robin", users=64, max_num_seqs=16))
    seen = []
    orig = RankedScheduler.plan

    def spy(self, now_s):
        plan = orig(self, now_s)
        seen.append([len(r.running) for r in self.ranks])
        return plan

    RankedScheduler.plan = spy
    try:
        res = sim.run()
    finally:
        RankedScheduler.plan = orig
    assert res.summary["completed"] == 160
    assert seen and max(max(s) for s in seen) == 2 and max(sum(s) for s in seen) == 16


def test_random_ranks_queue_apart_and_repeat_from_the_seed(tmp_path):
    """Random ranks collide: some hold more than their share while others idle, so prompts wait longer than with one
    queue or with requests dealt in turn; the same seed gives the same requests byte for byte, another seed others."""
    ttft = {}
    for routing in ("shared_queue", "round_robin", "random"):
        res = _sim(_scenario(tmp_path, routing, name=routing, rate=12.0)).run()
        assert res.summary["completed"] == 160
        ttft[routing] = res.requests["ttft_s"].mean()
    assert ttft["random"] > 1.3 * ttft["shared_queue"]  # (measured 481 ms against 308)
    assert ttft["round_robin"] < 1.2 * ttft["shared_queue"]
    a = _sim(_scenario(tmp_path, "random", name="a")).run().requests
    b = _sim(_scenario(tmp_path, "random", name="b")).run().requests
    c = _sim(_scenario(tmp_path, "random", name="c", seed=1)).run().requests
    assert a.to_csv(index=False) == b.to_csv(index=False)
    assert a.to_csv(index=False) != c.to_csv(index=False)


def test_least_loaded_binds_to_the_rank_holding_fewest(tmp_path):
    sched = _sim(_scenario(tmp_path, "least_loaded"))._new_replica(*_replica_args()).scheduler
    assert isinstance(sched, RankedScheduler) and len(sched.ranks) == 8
    assert sched.ranks[0].config.max_num_seqs == 8 and sched.ranks[0].config.max_num_batched_tokens == 4096
    from sim.core.request import Request
    reqs = [Request(i, 0.0, 100, 4, 0.0) for i in range(10)]
    for r in reqs:
        sched.admit(r, 0.0)
    assert [len(r.waiting) for r in sched.ranks] == [2, 2, 1, 1, 1, 1, 1, 1]
    assert len(sched.waiting) == 10 and reqs[9] in sched.waiting


def _replica_args():
    import simpy
    from sim.core.metrics import Recorder
    from sim.io.config import SLOConfig
    return simpy.Environment(), 0, Recorder(SLOConfig(), track_request_gaps=False), None, 0


def test_a_pass_waits_for_the_busiest_bound_rank(tmp_path):
    """Two 4,096-token prompts on one rank of eight cost that rank's two prompts (its attention and GEMMs on 8,192
    tokens, the routed experts on the pass's); spread by the shared rule (ceil(2 / 8) = 1 per rank) they cost one
    each: the same tokens, the bound pass is the longer. Bound on two ranks, they cost what the shared rule says."""
    m = _sim(_scenario(tmp_path, "random")).step_time
    while not hasattr(m, "busiest_rank"):
        m = m.inner
    pairs = 4096 * 4097 // 2
    shared = StepPlan(num_seqs=2, new_tokens=8192, prefill_tokens=8192, prefill_seqs=2, prefill_pairs=2 * pairs,
                      prefill_logits=2)
    one_rank = (8192, 2, 2 * pairs, 2, 0, 0, 0, 0)
    bound = StepPlan(num_seqs=2, new_tokens=8192, prefill_tokens=8192, prefill_seqs=2, prefill_pairs=2 * pairs,
                     prefill_logits=2, rank_loads=(one_rank,) + ((0,) * len(RANK_LOAD_FIELDS),) * 7)
    two_ranks = ((4096, 1, pairs, 1, 0, 0, 0, 0),) * 2 + ((0,) * len(RANK_LOAD_FIELDS),) * 6
    apart = StepPlan(num_seqs=2, new_tokens=8192, prefill_tokens=8192, prefill_seqs=2, prefill_pairs=2 * pairs,
                     prefill_logits=2, rank_loads=two_ranks)
    from sim.models.parallel_ops import RankLoad
    busiest = RankLoad(8192, 2, 2 * pairs, 0, 0, 2)
    assert m.step_s(bound) == pytest.approx(m.host_s + 2 * m.host_seq_s + m.stage_s(0, 8192, busiest))
    assert m.step_s(bound) > 1.3 * m.step_s(shared)  # (measured 442 ms against 316: the experts' share is the same)
    assert m.step_s(apart) == pytest.approx(m.step_s(shared))


def test_a_pool_of_bound_ranks_splits_its_own_limits(tmp_path):
    """A disaggregated pool's own scheduler is split over its own bound ranks: a limit its ranks do not divide is
    refused naming the pool's field; divisible, the pools run."""
    p = _scenario(tmp_path, None, rate=2.0)
    pool = ("    parallel: {tp: 1, ep: 8, attention_dp: 8, attention_dp_routing: random}\n"
            "    scheduler: {kind: chunked, max_num_seqs: SEQS, max_num_batched_tokens: 65536, chunk_tokens: 8192}\n")
    text = p.read_text() + ("disaggregation:\n  prefill:\n    replicas: 1\n  decode:\n    replicas: 1\n" + pool)
    p.write_text(text.replace("SEQS", "60"))
    with pytest.raises(ConfigError, match=r"disaggregation\.decode\.scheduler\.max_num_seqs: 60 is the replica's over "
                                          r"its 8 attention-DP ranks"):
        load_scenario(p)
    p.write_text(text.replace("SEQS", "64"))
    res = _sim(p).run()
    assert res.summary["completed"] == 160
