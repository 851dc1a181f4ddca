"""The vllm_v1 scheduler option: vLLM 0.32 V1's rules where they differ from `chunked` (the null block,
whole-sequence admission, running order and long_prefill_token_threshold), and `chunked` unchanged."""

import pytest

from sim.core.kv import BlockManager
from sim.core.request import Request
from sim.core.schedulers.chunked import ChunkedConfig, ChunkedPrefill
from sim.core.schedulers.vllm_v1 import VllmV1, VllmV1Config
from sim.io.errors import ConfigError
from tests.sim.helpers import run, scenario


def _req(rid: int, prompt: int, out: int = 4) -> Request:
    return Request(rid, 0.0, prompt, out, 0.0, segments=(((0, rid), 0, prompt),))


def _vllm(blocks: int, budget: int = 32, threshold: int = 0) -> VllmV1:
    pool = BlockManager(blocks, 16, 1.0)
    return VllmV1(VllmV1Config(max_num_seqs=8, max_num_batched_tokens=budget,
                               long_prefill_token_threshold=threshold), pool, "on_demand", lazy_decode=True)


def _items(plan) -> list[tuple[int, int]]:
    return [(req.rid, n) for req, n, _h in plan.items]


def test_one_block_is_the_null_block():
    s = _vllm(10)
    assert s.pool.free_blocks == 9 and s.null_block == 0
    assert not s.lazy   # every request is planned explicitly


def test_admits_only_when_the_whole_prompt_fits():
    """vLLM's scheduler_reserve_full_isl: 150 tokens = 10 blocks > 9 usable, though a 32-token chunk fits."""
    s = _vllm(10)
    s.admit(_req(0, 150), 0.0)
    assert s.plan(0.0) is None
    assert s.dropped and "does not fit" in s.dropped[0].reject_reason
    ok = _vllm(10)
    ok.admit(_req(1, 144), 0.0)           # 9 blocks: fits exactly the usable pool
    assert _items(ok.plan(0.0)) == [(1, 32)]
    # capsim's chunked policy with on_demand admission checks the first chunk only
    pool = BlockManager(10, 16, 1.0)
    ch = ChunkedPrefill(ChunkedConfig(max_num_seqs=8, max_num_batched_tokens=32, chunk_tokens=32), pool, "on_demand")
    ch.admit(_req(2, 150), 0.0)
    assert _items(ch.plan(0.0)) == [(2, 32)]


def test_second_request_waits_for_room_for_its_whole_prompt():
    s = _vllm(12, budget=64)
    s.admit(_req(0, 96), 0.0)            # 6 blocks
    s.admit(_req(1, 96), 0.0)            # 6 more would need 12 > 11 - 4 free after the first's chunk
    plan = s.plan(0.0)
    assert _items(plan) == [(0, 64)]      # the budget is used up by the first anyway
    s.commit(plan, 1.0)
    plan = s.plan(1.0)
    assert _items(plan) == [(0, 32)]      # 32 tokens left; the second does not fit (11 - 6 = 5 < 6 blocks)
    assert s.waiting[0].rid == 1


def test_long_prefill_threshold_caps_only_when_others_wait():
    alone = _vllm(100, budget=64, threshold=16)
    alone.admit(_req(0, 100), 0.0)
    assert _items(alone.plan(0.0)) == [(0, 64)]
    two = _vllm(100, budget=64, threshold=16)
    two.admit(_req(0, 100), 0.0)
    two.admit(_req(1, 100), 0.0)
    assert _items(two.plan(0.0)) == [(0, 16), (1, 16)]


def test_running_requests_are_served_in_admission_order():
    """A partial prefill admitted before a decoding request is served first (vLLM's running loop)."""
    s = _vllm(100, budget=40, threshold=16)
    s.admit(_req(0, 100), 0.0)
    s.admit(_req(1, 8), 0.0)
    plan = s.plan(0.0)
    assert _items(plan) == [(0, 16), (1, 8)]
    s.commit(plan, 1.0)                   # request 1 emitted its first token: it decodes now
    assert _items(s.plan(1.0)) == [(0, 16), (1, 1)]


def test_reserve_admission_is_refused():
    with pytest.raises(ConfigError, match="vllm_v1: needs kv.admission on_demand"):
        run(scenario(scheduler={"kind": "vllm_v1", "max_num_seqs": 8, "max_num_batched_tokens": 512}))


def test_simulates_like_chunked_when_kv_is_plentiful():
    """No KV pressure, no threshold: the rules that differ never bind, the two policies agree."""
    kv = {"block_tokens": 16, "format": "bf16", "budget": "8GiB", "admission": "on_demand"}
    wl = {"kind": "synthetic", "num_requests": 60, "arrival": {"kind": "poisson", "rate_rps": 6.0},
          "prompt_tokens": {"kind": "uniform", "low": 16, "high": 600},
          "output_tokens": {"kind": "uniform", "low": 4, "high": 40}}
    a = run(scenario(kv=kv, workload=wl, scheduler={"kind": "vllm_v1", "max_num_seqs": 16,
                                                    "max_num_batched_tokens": 256}))
    b = run(scenario(kv=kv, workload=wl, scheduler={"kind": "chunked", "max_num_seqs": 16,
                                                    "max_num_batched_tokens": 256, "chunk_tokens": 256}))
    assert a.summary["completed"] == b.summary["completed"] == 60
    assert list(a.iterations["new_tokens"]) == list(b.iterations["new_tokens"])
    assert a.requests["e2e_s"].tolist() == pytest.approx(b.requests["e2e_s"].tolist())


def test_blocks_scheduled_this_iteration_are_already_prefix_hits():
    """vLLM caches a chunk's full blocks when it schedules them: a request admitted later in the same
    iteration hits them; `chunked` indexes them only when the iteration ends."""
    shared = ((1, 7), 0, 64)

    def pair():
        return (Request(0, 0.0, 64, 4, 0.0, segments=(shared,)),
                Request(1, 0.0, 80, 4, 0.0, segments=(shared, ((0, 1), 0, 16))))
    s = _vllm(100, budget=256)
    for r in pair():
        s.admit(r, 0.0)
    assert _items(s.plan(0.0)) == [(0, 64), (1, 16)]
    pool = BlockManager(100, 16, 1.0)
    ch = ChunkedPrefill(ChunkedConfig(max_num_seqs=8, max_num_batched_tokens=256, chunk_tokens=256), pool, "on_demand")
    for r in pair():
        ch.admit(r, 0.0)
    assert _items(ch.plan(0.0)) == [(0, 64), (1, 80)]


def test_warm_prefixes_leave_it_a_null_block():
    """Warm prefixes fill blocks before the scheduler takes vLLM's null block: it takes the next empty
    one (found in review: it popped an empty free list), and the warm prefix is still hit."""
    reqs = [{"arrival_s": 0.1 * i, "prompt_tokens": 300, "output_tokens": 20, "prefix": {"name": "sys", "tokens": 256}}
            for i in range(4)]
    res = run(scenario(workload={"kind": "requests", "requests": reqs},
                       scheduler={"kind": "vllm_v1", "max_num_seqs": 8, "max_num_batched_tokens": 1024},
                       kv={"block_tokens": 16, "format": "bf16", "budget": "12GiB", "admission": "on_demand",
                           "warm_prefixes": [{"name": "sys", "tokens": 256}]}))
    assert res.summary["completed"] == 4 and (res.requests["cached_tokens"] == 256).all()
