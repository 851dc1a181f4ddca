"""Hypothesis stateful test of the block manager: random admissions, chunks, tokens, preemptions
and finishes against the invariants of its state model (sim/core/kv.py)."""

import os
from collections import Counter

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sim.core.kv import BlockManager
from sim.core.request import Request
from sim.workloads.workload import prefix_stream

BS = 4
PREFIXES = ["a", "b"]


class BlockManagerMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.kv = BlockManager(24, BS, 1.0)
        self.live: list[Request] = []
        self.next_rid = 0
        self.now = 0.0

    def _tick(self):
        self.now += 1.0
        return self.now

    @rule(prefix=st.sampled_from(PREFIXES + [None]), pre=st.integers(1, 12), private=st.integers(1, 10),
          out=st.integers(1, 6))
    def admit(self, prefix, pre, private, out):
        rid = self.next_rid
        self.next_rid += 1
        r = Request(rid, 0.0, (pre if prefix else 0) + private, out, 0.0)
        segs = (((prefix_stream(prefix), 0, pre),) if prefix else ()) + (((0, rid), 0, private),)
        r.segments = segs
        r.shareable_tokens = pre if prefix else 0
        hits = self.kv.match(r)
        need = r.prompt_tokens
        if not self.kv.can_allocate(r, need, hits):
            return
        refs_before = [self.kv.blocks[b].ref_count for b in hits]
        self.kv.allocate(r, need, hits, self._tick())
        # admission reuses exactly the cached blocks it reported, one more reference each
        assert r.block_table[:len(hits)] == hits
        assert [self.kv.blocks[b].ref_count for b in hits] == [c + 1 for c in refs_before]
        r.computed_tokens = len(hits) * BS
        self.live.append(r)

    @precondition(lambda self: self.live)
    @rule(k=st.integers(0, 10), n=st.integers(1, 8))
    def compute_chunk(self, k, n):
        r = self.live[k % len(self.live)]
        n = min(n, r.prompt_tokens + r.output_tokens - r.computed_tokens)
        if n <= 0:
            return
        r.computed_tokens += n
        self.kv.register(r, min(r.computed_tokens, r.prompt_tokens), self._tick())
        if r.computed_tokens == r.prompt_tokens + r.output_tokens and not r.done:
            r.output_tokens += 1

    @precondition(lambda self: self.live)
    @rule(k=st.integers(0, 10))
    def append_token(self, k):
        r = self.live[k % len(self.live)]
        if r.done or r.computed_tokens < r.prompt_tokens + r.output_tokens - 1:
            return
        need = r.computed_tokens + 1
        if self.kv.can_allocate(r, need):
            self.kv.allocate(r, need, now_s=self._tick())
            r.computed_tokens += 1
            r.output_tokens += 1

    @precondition(lambda self: self.live)
    @rule(k=st.integers(0, 10))
    def preempt(self, k):
        r = self.live.pop(k % len(self.live))
        self.kv.register(r, r.computed_tokens, self._tick(), own_reuse=True)
        self.kv.free(r, self.now)

    @precondition(lambda self: self.live)
    @rule(k=st.integers(0, 10))
    def finish(self, k):
        r = self.live.pop(k % len(self.live))
        self.kv.register(r, r.computed_tokens, self._tick())
        self.kv.free(r, self.now)

    @invariant()
    def pool_is_partitioned(self):
        kv = self.kv
        free = kv.free_ids()
        assert len(free) + kv.used_blocks + len(kv.cached_free) == kv.num_blocks
        assert len(free) == kv.empty_blocks
        assert len(set(free)) == len(free)
        assert not set(free) & set(kv.cached_free)

    @invariant()
    def ref_counts_match_holders(self):
        # a private block (one holder, past its indexed prefix, neither indexed nor a duplicate) keeps
        # its one reference implicit: ref_count 0 (sim/core/kv.py, state model)
        holders = Counter(b for r in self.live for b in r.block_table)
        private = {b for r in self.live for b in r.block_table[r.indexed_blocks:]
                   if self.kv.blocks[b].content_hash is None and self.kv.blocks[b].dup_of is None}
        for blk in self.kv.blocks:
            if blk.block_id in private:
                assert holders[blk.block_id] == 1 and blk.ref_count == 0
            else:
                assert blk.ref_count == holders[blk.block_id]
        assert self.kv.used_blocks == len(holders)

    @invariant()
    def index_entries_match_content(self):
        for h, bid in self.kv.index.items():
            assert self.kv.blocks[bid].content_hash == h
            assert bid not in self.kv.free_ids()

    @invariant()
    def computed_blocks_of_live_requests_are_indexed(self):
        for r in self.live:
            for b in range(r.indexed_blocks):
                assert r.block_hashes[b] in self.kv.index

    @invariant()
    def lru_order_follows_sim_time(self):
        times = [self.kv.last_used(b) for b in self.kv.cached_free]
        assert times == sorted(times)

    def teardown(self):
        for r in self.live:
            self.kv.free(r, self.now)
        assert self.kv.used_blocks == 0  # no leak once every request is gone
        assert all(b.ref_count == 0 for b in self.kv.blocks)


# thousands of examples in CI; CAPSIM_HYPOTHESIS_EXAMPLES raises it for a nightly run
BlockManagerMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("CAPSIM_HYPOTHESIS_EXAMPLES", "1000")), stateful_step_count=40, deadline=None)
TestBlockManager = BlockManagerMachine.TestCase
