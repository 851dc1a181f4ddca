"""The lazy decode set gives byte-identical results to stepping every request every iteration."""

import pytest

from sim.core.schedulers import SCHEDULERS
from sim.core.simulation import Simulation
from tests.sim.helpers import scenario

POLICIES = {
    "fixed": {"kind": "fixed", "max_num_seqs": 8},
    "continuous": {"kind": "continuous", "max_num_seqs": 24, "max_num_batched_tokens": 6000},
    "chunked": {"kind": "chunked", "max_num_seqs": 24, "max_num_batched_tokens": 1024, "chunk_tokens": 512},
    "vllm_v1": {"kind": "vllm_v1", "max_num_seqs": 24, "max_num_batched_tokens": 1024},   # always explicit
}
CASES = {
    "reserve": {},
    "on-demand-preempting": {"kv": {"block_tokens": 16, "format": "bf16", "budget": "700MiB", "admission": "on_demand"}},
    "retries-p99-slo": {"accuracy": {"p_correct": 0.7, "max_retries": 1},
                        "slo": {"ttft_s": 1.0, "itl_s": 0.05, "itl_stat": "p99"}},
    "graphs-efficiency": {"step_time": {"graph_sizes": [1, 2, 4, 8, 16, 32], "model": {
        "kind": "efficiency", "prefill_mfu": 0.6, "decode_table": [{"bytes": 1.5e10, "time_s": 0.026},
                                                                    {"bytes": 3.5e10, "time_s": 0.03}]}}},
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("kind", sorted(SCHEDULERS))
def test_lazy_decode_equals_stepping(kind, case):
    over = dict(CASES[case])
    if kind == "vllm_v1" and "kv" not in over:   # vllm_v1 allocates on demand only
        over["kv"] = {"block_tokens": 16, "format": "bf16", "budget": "12GiB", "admission": "on_demand"}
    sc = scenario(scheduler=POLICIES[kind], **over)
    fast = Simulation(sc, ".", lazy_decode=True).run()
    slow = Simulation(sc, ".", lazy_decode=False).run()
    assert fast.summary == slow.summary
    assert fast.requests.to_csv() == slow.requests.to_csv()
    assert fast.iterations.to_csv() == slow.iterations.to_csv()
    if case == "on-demand-preempting":
        assert fast.summary["preemptions"] > 0


def test_lazy_decode_equals_stepping_with_cancellations():
    reqs = [{"arrival_s": 0.01 * i, "prompt_tokens": 300 + 37 * i, "output_tokens": 40 + 7 * i,
             **({"cancel_at_s": 0.3 + 0.05 * i} if i % 3 == 0 else {})} for i in range(30)]
    for kind in SCHEDULERS:
        sc = scenario(scheduler=POLICIES[kind], workload={"kind": "requests", "requests": reqs},
                      kv={"block_tokens": 16, "format": "bf16", "budget": "300MiB", "admission": "on_demand"})
        fast = Simulation(sc, ".", lazy_decode=True).run()
        slow = Simulation(sc, ".", lazy_decode=False).run()
        assert fast.summary == slow.summary, kind
        assert fast.requests.to_csv() == slow.requests.to_csv(), kind
        assert fast.summary["cancelled"] > 0


def test_a_recompute_chunk_one_token_short_is_not_stranded():
    """on_demand preemption, then a recompute chunk that leaves exactly one token: the request must
    get that token next iteration in the lazy mode too (it is neither prefilling nor in the set)."""
    sc = scenario(model="llama-3.1-8b", hardware="h100-sxm",
                  kv={"block_tokens": 16, "budget": 10 * 16 * 131072, "admission": "on_demand", "prefix_caching": False},
                  scheduler={"kind": "chunked", "max_num_seqs": 8, "max_num_batched_tokens": 256, "chunk_tokens": 32},
                  step_time={"model": {"kind": "linear", "constant_s": 0.01, "per_new_token_s": 1e-5}},
                  workload={"kind": "requests", "requests": [{"arrival_s": 0.0, "prompt_tokens": 100, "output_tokens": 60},
                                                               {"arrival_s": 0.0, "prompt_tokens": 63, "output_tokens": 20}]})
    fast = Simulation(sc, ".", lazy_decode=True).run()
    slow = Simulation(sc, ".", lazy_decode=False).run()
    assert fast.summary["completed"] == 2 and fast.summary["preemptions"] > 0
    assert fast.summary == slow.summary
    assert fast.iterations.to_csv() == slow.iterations.to_csv()
