"""The paged KV block manager: scripted examples with exact block ids, then chapter numbers
through simulated runs (reference sections 3 and 6)."""

import json

import pytest

from capsim.cli import main
from sim.core.kv import BlockManager
from sim.core.request import Request
from sim.workloads.workload import prefix_stream
from tests.sim.helpers import REPO_SCENARIOS, run, scenario

MiB = 2**20


def req(rid, prompt, out=1, segments=None):
    r = Request(rid, 0.0, prompt, out, 0.0)
    r.segments = segments or (((0, rid), 0, prompt),)
    return r


def with_prefix(rid, prompt, name, tokens, out=1):
    return req(rid, prompt, out, ((prefix_stream(name), 0, tokens), ((0, rid), 0, prompt - tokens)))


# ---- scripted examples (a 10-block pool of 4-token blocks) -------------------------------------

def test_allocation_hands_out_ids_in_order_and_free_returns_them():
    kv = BlockManager(10, 4, 1.0)
    a, b = req(0, 9), req(1, 13)
    assert kv.can_allocate(a, 9)
    kv.allocate(a, 9)
    kv.allocate(b, 13)
    assert a.block_table == [0, 1, 2] and b.block_table == [3, 4, 5, 6]
    assert kv.free_blocks == 3 and kv.used_blocks == 7
    kv.free(a)
    # private blocks are not indexed: straight back to the free list, tail first
    assert kv.free_ids()[-3:] == [2, 1, 0] and not kv.cached_free
    c = req(2, 8)
    kv.allocate(c, 8)
    assert c.block_table == [0, 1]  # pop() takes the most recently freed head block first


def test_prefix_hit_reuses_exact_blocks_and_lru_evicts_oldest_first():
    kv = BlockManager(6, 4, 1.0)
    a = with_prefix(0, 10, "sys", 8)
    a.shareable_tokens = 8
    kv.allocate(a, 10)
    a.computed_tokens = 10
    kv.register(a, 10, now_s=1.0)
    assert a.block_table == [0, 1, 2] and a.indexed_blocks == 2  # only the 2 full shared blocks
    kv.free(a, now_s=2.0)
    assert list(kv.cached_free) == [1, 0]  # freed tail first: block 1 is evicted before block 0
    assert kv.free_ids() == [5, 4, 3, 2]
    b = with_prefix(1, 9, "sys", 8)
    hits = kv.match(b)
    assert hits == [0, 1]
    assert kv.can_allocate(b, 9, hits)
    kv.allocate(b, 9, hits)
    assert b.block_table == [0, 1, 2] and kv.blocks[0].ref_count == 1 and not kv.cached_free
    kv.free(b, now_s=3.0)
    # fill the pool with private requests: the free list goes first, then LRU evictions
    c = req(2, 16)
    kv.allocate(c, 16)
    assert c.block_table == [2, 3, 4, 5] and kv.stats.evictions == 0
    d = req(3, 4)
    kv.allocate(d, 4)
    assert d.block_table == [1] and kv.stats.evictions == 1  # block 1 was least recently freed
    assert kv.match(with_prefix(4, 9, "sys", 8)) == [0]  # block 0 still cached; the chain stops at 1


def test_a_hit_never_covers_the_last_prompt_token():
    kv = BlockManager(8, 4, 1.0)
    a = with_prefix(0, 8, "p", 8)
    a.shareable_tokens = 8
    kv.allocate(a, 8)
    kv.register(a, 8)
    b = with_prefix(1, 8, "p", 8)
    assert kv.match(b) == [a.block_table[0]]  # 8 shared tokens, but one must be computed: 1 block


def test_paged_example_52_slots_44_with_the_shared_8():
    """Reference section 3: lengths 9, 13, 5, 15 with 4-token blocks use 52 slots; sharing A and
    B's first 8 tokens (two full blocks) brings it to 44."""
    kv = BlockManager(32, 4, 1.0)
    for i, n in enumerate((9, 13, 5, 15)):
        kv.allocate(req(i, n), n)
    assert kv.used_blocks * 4 == 52
    kv = BlockManager(32, 4, 1.0)
    a = with_prefix(0, 9, "ab", 8)
    a.shareable_tokens = 8
    kv.allocate(a, 9)
    kv.register(a, 9)
    b = with_prefix(1, 13, "ab", 8)
    kv.allocate(b, 13, kv.match(b))
    kv.allocate(req(2, 5), 5)
    kv.allocate(req(3, 15), 15)
    assert kv.used_blocks * 4 == 44


def test_four_branches_416_references_131_blocks(tmp_path):
    """Reference section 3: four branches over a 95-block prompt, 9 private blocks each."""
    bs = 16
    reqs = [{"arrival_s": 0.0, "prompt_tokens": 95 * bs, "output_tokens": 9 * bs + 1, "n": 4}]
    res = run(scenario(workload={"kind": "requests", "requests": reqs},
                       kv={"block_tokens": bs, "format": "bf16", "budget": "4GiB"}))
    s, r = res.summary, res.requests
    assert s["completed"] == 4
    assert s["peak_kv_blocks"] == 131
    refs = sum((p + o - 1) // bs for p, o in zip(r["prompt_tokens"], r["output_tokens"]))
    assert refs == 416
    assert (r["first_token_s"] == r["first_token_s"].iloc[0]).all()  # forked from one prefill
    assert s["cow_copies"] == 0  # 95 full blocks: no partly filled tail to copy


def test_fork_copies_a_partly_filled_tail_block():
    bs = 4
    reqs = [{"arrival_s": 0.0, "prompt_tokens": 7, "output_tokens": 3, "n": 2}]
    res = run(scenario(workload={"kind": "requests", "requests": reqs},
                       kv={"block_tokens": bs, "format": "bf16", "budget": "64MiB"}))
    # each branch stores 7 + 3 - 1 = 9 tokens: 1 shared full block + its own 2 (tail copy + new)
    assert res.summary["peak_kv_blocks"] == 1 + 2 * 2
    assert res.summary["cow_copies"] == 1


def test_snapshots_round_reuse_down():
    """Reference section 6: a match to token 10,752 with snapshots at 4096 and 8192 restores 8192."""
    kv = BlockManager(2000, 16, 1.0, snapshot_tokens=4096)
    a = with_prefix(0, 10752, "doc", 10752)
    a.shareable_tokens = 10752
    kv.allocate(a, 10752)
    kv.register(a, 10752)
    b = with_prefix(1, 12000, "doc", 10752)
    hits = kv.match(b)
    assert len(hits) * 16 == 8192
    assert 12000 - 8192 - (12000 - 10752) == 2560  # recomputed part of the shared 10,752


# ---- chapter numbers through simulated runs -------------------------------------------------------

def test_sixteen_long_shared_peaks_at_6048_mib(tmp_path):
    out = tmp_path / "shared"
    assert main(["run", str(REPO_SCENARIOS / "chapter8" / "sixteen-long-shared.yaml"), "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["peak_kv_bytes"] == 6048 * MiB
    assert s["prefix_hit_tokens"] == 16 * 6144
    assert s["iterations"] and s["memory_fit"]
    reqs = (out / "requests.csv").read_text()
    assert reqs.count(",6144,0.75,") == 16  # cached tokens and hit rate of every request
    its = __import__("pandas").read_csv(out / "iterations.csv")
    assert its.loc[0, "prefill_tokens"] == 16 * 2048  # only the private 2048 of each are prefilled


def test_sixteen_long_independent_needs_19008_mib_and_waits(tmp_path):
    out = tmp_path / "indep"
    assert main(["run", str(REPO_SCENARIOS / "chapter8" / "sixteen-long-independent.yaml"), "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["peak_kv_bytes"] == 10 * 1188 * MiB  # floor(12288 / 1188) = 10 at once
    assert not s["memory_fit"] and s["kv_limited_requests"] >= 1
    assert s["prefix_hit_tokens"] == 0


@pytest.mark.parametrize("admission", ["reserve", "on_demand"])
def test_35_shared_long_requests_fit_12gib_36_do_not(admission):
    def go(n):
        reqs = [{"arrival_s": 0.0, "prompt_tokens": 8192, "output_tokens": 256,
                 "prefix": {"name": "sys", "tokens": 6144}} for _ in range(n)]
        return run(scenario(
            workload={"kind": "requests", "requests": reqs},
            scheduler={"kind": "continuous", "max_num_seqs": 64, "max_num_batched_tokens": 131072},
            kv={"block_tokens": 16, "format": "bf16", "budget": "12GiB", "admission": admission,
                "warm_prefixes": [{"name": "sys", "tokens": 6144}]}))
    fit, over = go(35), go(36)
    assert fit.summary["memory_fit"] and fit.summary["peak_kv_bytes"] == (864 + 35 * 324) * MiB
    assert not over.summary["memory_fit"]
    if admission == "reserve":  # the 36th waits for blocks
        assert over.summary["kv_limited_requests"] == 1 and over.summary["preemptions"] == 0
        assert (over.requests["admitted_s"] > 0).sum() == 1
    else:  # all 36 start; growing KV runs out and the newest is preempted
        assert over.summary["preemptions"] >= 1 and over.summary["recomputed_tokens"] > 0
    assert over.summary["completed"] == 36


def test_swap_preemption_moves_kv_over_the_host_link():
    kv = {"block_tokens": 16, "format": "bf16", "budget": "700MiB", "admission": "on_demand",
          "preemption": "swap", "host_budget": "8GiB"}
    res = run(scenario(kv=kv))
    s, its = res.summary, res.iterations
    assert s["swap_outs"] > 0 and s["swap_ins"] == s["swap_outs"] and s["recomputed_tokens"] == 0
    assert s["completed"] == s["requests"]
    moved = its["swap_bytes"].sum()
    assert moved == pytest.approx(s["swapped_bytes"])
    assert its["host_blocks"].max() > 0


def test_prefix_hit_shortens_ttft_on_a_multi_turn_session():
    turn1 = {"arrival_s": 0.0, "prompt_tokens": 4000, "output_tokens": 100}
    turn2 = {"arrival_s": 10.0, "prompt_tokens": 4200, "output_tokens": 100, "context_of": 0}
    res = run(scenario(workload={"kind": "requests", "requests": [turn1, turn2]}))
    r = res.requests.set_index("id")
    assert r.loc[1, "cached_tokens"] == (4100 // 16) * 16  # prompt + outputs of turn 1, full blocks
    alone = run(scenario(workload={"kind": "requests", "requests": [
        turn1, {**turn2, "context_of": None}]})).requests.set_index("id")
    assert alone.loc[1, "cached_tokens"] == 0
    assert r.loc[1, "ttft_s"] < alone.loc[1, "ttft_s"] / 5


def _hot_cold_requests():
    hot = {"prompt_tokens": 1100, "output_tokens": 2, "prefix": {"name": "hot", "tokens": 1024}}
    reqs = [{"arrival_s": 0.0, **hot}, {"arrival_s": 10.0, **hot}, {"arrival_s": 20.0, **hot},
            {"arrival_s": 30.0, "prompt_tokens": 1100, "output_tokens": 2, "prefix": {"name": "cold", "tokens": 1024}},
            {"arrival_s": 40.0, "prompt_tokens": 1100, "output_tokens": 2},
            {"arrival_s": 50.0, **hot},
            {"arrival_s": 60.0, "prompt_tokens": 1100, "output_tokens": 2, "prefix": {"name": "cold", "tokens": 1024}}]
    return {"workload": {"kind": "requests", "requests": reqs}}


def test_value_eviction_keeps_the_prefix_with_more_value():
    """A one-off request needs room while two 1024-token prefixes are cached: LRU evicts the hot
    prefix (used less recently), value per byte evicts the cold one (never hit). Pinned to
    prefix_index foresight (only the prefixes are cached), the set-up the chapter's arithmetic uses."""
    budget = 168 * 16 * 147456  # both prefixes (2 x 64 blocks) + 40 free: the one-off (69) must evict 29
    common = _hot_cold_requests()
    kv = {"block_tokens": 16, "format": "bf16", "budget": budget, "prefix_index": "foresight"}
    lru = run(scenario(kv=kv, **common))
    val = run(scenario(kv={**kv, "eviction": "value"}, **common))
    assert lru.summary["evictions"] == val.summary["evictions"] == 29
    assert lru.requests.loc[5, "cached_tokens"] == (64 - 29) * 16
    assert val.requests.loc[5, "cached_tokens"] == 1024


def test_value_eviction_under_prefix_index_all_drops_private_blocks_first():
    """The same requests under the default prefix_index all (vLLM): every full block stays cached,
    private ones too. Each 1,102-token request fills 68 blocks (64 prefix + 4 private) and a partial
    one. Before the one-off request (69 blocks) the pool holds 64 hot + 64 cold + 4 x 4 private
    cached blocks and 24 empty ones, so it evicts 45. LRU takes the oldest: the three hot requests'
    12 private blocks, then 33 hot prefix blocks (tail first), leaving request 5 a 31-block hit; value
    per byte drops never-hit blocks first and request 5 hits the whole hot prefix."""
    budget = 168 * 16 * 147456
    common = _hot_cold_requests()
    kv = {"block_tokens": 16, "format": "bf16", "budget": budget}
    lru = run(scenario(kv=kv, **common))
    val = run(scenario(kv={**kv, "eviction": "value"}, **common))
    assert lru.requests.loc[5, "cached_tokens"] == (64 - 33) * 16
    assert val.requests.loc[5, "cached_tokens"] == 1024
    # request 5 then evicts 37 (1 empty block, 69 - 31 needed): the cold request's 4 private and 33 cold prefix blocks
    assert lru.requests.loc[6, "cached_tokens"] == (64 - 33) * 16
    assert val.summary["evictions"] < lru.summary["evictions"]  # value keeps the hot prefix: fewer misses


def test_chain_hashes_walk_streams_like_block_pieces():
    """The cursor walk over many segments gives the per-block definition's hashes."""
    import random

    from sim.core.kv import block_pieces, chain_hashes
    rng = random.Random(1)
    for _ in range(200):
        segs = tuple(((2, rng.randint(0, 5)), rng.randint(0, 3), rng.randint(1, 40)) for _ in range(rng.randint(1, 8)))
        streams = segs + (((3, 1), 0, 1 << 62),)
        bs = rng.choice([1, 4, 16])
        n = (sum(x[2] for x in segs) + 50) // bs
        head = chain_hashes(streams, bs, rng.randint(0, n), [])
        got = chain_hashes(streams, bs, n, list(head))
        prev, want = 0, []
        for k in range(n):
            prev = hash((prev, block_pieces(streams, k * bs, (k + 1) * bs)))
            want.append(prev)
        assert got == want


def test_an_evicted_block_hands_its_content_to_a_live_duplicate():
    """Two requests computed the same block concurrently: one is indexed, the other a duplicate.
    When the indexed copy is evicted, the live duplicate becomes findable (as vLLM keeps both)."""
    kv = BlockManager(4, 4, 1.0)
    a, b = with_prefix(0, 5, "p", 4), with_prefix(1, 5, "p", 4)
    a.shareable_tokens = b.shareable_tokens = 4
    kv.allocate(a, 5)
    kv.allocate(b, 5)   # admitted before a registered: no hit, its own copy
    kv.register(a, 5)
    kv.register(b, 5)
    assert kv.index == {a.block_hashes[0]: a.block_table[0]} and kv.blocks[b.block_table[0]].dup_of is not None
    kv.free(a)          # a's copy is cached-free; b still holds its duplicate
    kv.allocate(req(2, 8), 8)  # needs both free blocks + evicts a's copy
    assert kv.index == {b.block_hashes[0]: b.block_table[0]}
    assert kv.match(with_prefix(3, 5, "p", 4)) == [b.block_table[0]]


def test_prefix_index_all_caches_private_blocks_lru_and_foresight_does_not():
    """all (vLLM): every full block of a finished request stays cached, LRU, even a private one that
    nobody will ever match; foresight indexes only what a later request will match."""
    for policy, cached in (("all", [1, 0]), ("foresight", [])):
        kv = BlockManager(6, 4, 1.0, prefix_index=policy)
        a = req(0, 10)
        a.shareable_tokens = 0  # nothing of it is shared
        kv.allocate(a, 10)
        a.computed_tokens = 10
        kv.register(a, 10, now_s=1.0)
        assert max(a.indexed_blocks, a.full_blocks) == (2 if policy == "all" else 0)  # cached at release
        kv.free(a, now_s=2.0)
        assert list(kv.cached_free) == cached
        assert kv.free_blocks == 6
        b = req(1, 24)  # needs every block: under all, the cached ones are evicted oldest first
        kv.allocate(b, 24, now_s=3.0)
        assert kv.stats.evictions == len(cached) and not kv.cached_free and not kv.index
    with pytest.raises(ValueError, match="prefix index"):
        BlockManager(6, 4, 1.0, prefix_index="oracle")


def test_duplicates_outlive_the_eviction_of_the_block_they_duplicate():
    """Requests that computed the same prefix block at once hold duplicates of the one indexed; when
    it is evicted one duplicate takes its place, and the others stay its duplicates, so releasing them
    later finds them (found in review: a duplicate made after the takeover hid them, and releasing one
    raised ValueError)."""
    kv = BlockManager(10, 4, 1.0)
    a, b, c, g = (with_prefix(i, 5, "sys", 4) for i in range(4))
    for r in (a, b, c, g):
        r.shareable_tokens = 4
        kv.allocate(r, 5)  # all before any registers: none can hit the others' block
    for r in (a, b, c):
        kv.register(r, 5)
    h = a.block_hashes[0]
    assert kv.index[h] == a.block_table[0] and kv._dups[h] == [b.block_table[0], c.block_table[0]]
    kv.free(a)  # a's prefix block is cached-free; a large request evicts it: b's duplicate takes over
    kv.allocate(req(9, 16), 16)
    assert kv.index[h] == b.block_table[0] and kv._dups[h] == [c.block_table[0]]
    kv.register(g, 5)  # a duplicate made after the takeover joins c's
    assert kv._dups[h] == [c.block_table[0], g.block_table[0]]
    kv.free(c)
    kv.free(g)
    assert h not in kv._dups and kv.index[h] == b.block_table[0]
