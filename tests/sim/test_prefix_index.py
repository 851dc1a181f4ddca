"""kv.prefix_index: all (the default, vLLM: every full block cached, LRU) and foresight (only blocks a
later request will match: an upper bound). Under all, private blocks of a finished request are kept
as unhashed LRU runs (sim.core.kv.LAZY_PRIVATE); these tests check that this shortcut changes no
result against hashing every block as it fills, and that all's hits need no knowledge of the future."""

import os

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import sim.core.kv as kvmod
from sim.core.kv import BlockManager
from sim.core.request import Request
from sim.io.config import KVConfig
from sim.workloads.workload import Workload, prefix_stream
from tests.sim.helpers import REPO_SCENARIOS, run, scenario

BS = 4


def req(rid, private, prefix=None, pre=0, shareable=None):
    """A request of `pre` tokens of a named prefix, then `private` tokens of its own."""
    r = Request(rid, 0.0, pre + private, 4, 0.0)
    r.segments = (((prefix_stream(prefix), 0, pre),) if prefix else ()) + (((0, rid), 0, private),)
    r.shareable_tokens = shareable
    return r


def finish(kv, r, tokens, now):
    kv.allocate(r, tokens, kv.match(r), now)
    r.computed_tokens = tokens
    kv.register(r, tokens, now)
    kv.free(r, now)


# ---- the default ---------------------------------------------------------------------------

def test_the_default_prefix_index_is_all_as_vllm():
    """A scenario that says nothing about it gets all, and so does a bare block manager; foresight
    must be asked for."""
    assert KVConfig.model_fields["prefix_index"].default == "all"
    sc = scenario()
    assert sc.kv.prefix_index == "all"
    assert BlockManager(4, BS, 1.0).prefix_index == "all"
    assert scenario(kv={"block_tokens": 16, "budget": "12GiB", "prefix_index": "foresight"}).kv.prefix_index == "foresight"


# ---- LRU order -----------------------------------------------------------------------------

@pytest.mark.parametrize("lazy", [True, False])
def test_lru_evicts_oldest_release_first_private_tails_before_prefixes(monkeypatch, lazy):
    """Releases in time order: a (8 prefix tokens + 4 private: blocks 0, 1, 2), then b (8 private:
    blocks 3, 4); c needs the whole pool: the one empty block, then evictions oldest first, each
    request's blocks tail first: a's private 2, a's prefix 1, 0, then b's 4, 3."""
    monkeypatch.setattr(kvmod, "LAZY_PRIVATE", lazy)
    kv = BlockManager(6, BS, 1.0)
    a = req(0, 4, "p", 8, shareable=8)
    finish(kv, a, 12, 1.0)
    b = req(1, 8, shareable=0)
    finish(kv, b, 8, 2.0)
    assert list(kv.cached_free) == [2, 1, 0, 4, 3] and len(kv.cached_free) == 5
    c = req(2, 24)
    kv.allocate(c, 24, now_s=3.0)
    assert c.block_table == [5, 2, 1, 0, 4, 3] and kv.stats.evictions == 5
    assert not kv.index and not kv.cached_free


def test_a_hit_takes_a_block_out_of_the_lru_list_and_its_release_makes_it_newest():
    """a (prefix p: block 0, private: block 1), b (private: block 2), then c hits block 0: the hit
    takes it out of the list, and c's release puts it back last, after c's private block 3."""
    kv = BlockManager(8, BS, 1.0)
    a = req(0, 4, "p", 4, shareable=4)
    finish(kv, a, 8, 1.0)
    b = req(1, 4, shareable=0)
    finish(kv, b, 4, 2.0)
    assert list(kv.cached_free) == [1, 0, 2]
    c = req(2, 4, "p", 4, shareable=4)
    assert kv.match(c) == [0]
    finish(kv, c, 8, 3.0)
    assert list(kv.cached_free) == [1, 2, 3, 0] and kv.stats.evictions == 0


# ---- no foresight needed -------------------------------------------------------------------

def test_a_finished_requests_block_is_hit_by_a_later_request_without_foresight():
    """Under all, request a says nothing of who may share its tokens (shareable_tokens None: it is
    not told the future); its full blocks are cached when it finishes, and a later request with the
    same first 8 tokens hits both prefix blocks. Foresight caches only what it is told a later
    request will match: told nothing of a is shared, it keeps nothing."""
    kv = BlockManager(8, BS, 1.0)
    a = req(0, 4, "sys", 8)
    finish(kv, a, 12, 1.0)
    assert list(kv.cached_free) == [2, 1, 0]
    assert kv.match(req(1, 6, "sys", 8)) == [0, 1]
    f = BlockManager(8, BS, 1.0, prefix_index="foresight")
    finish(f, req(0, 4, "sys", 8, shareable=0), 12, 1.0)
    assert f.match(req(1, 6, "sys", 8)) == [] and not f.cached_free


def _run_outputs(sc):
    res = run(sc)
    return res.summary, res.requests.to_csv(index=False)


def _shared_prefix_scenario(**kv):
    reqs = []
    for i in range(40):
        body = {"arrival_s": 0.05 * i, "prompt_tokens": 300 + 37 * (i % 7), "output_tokens": 20 + i % 5}
        if i % 3:
            body["prefix"] = {"name": "sys" if i % 2 else "tools", "tokens": 160}
        reqs.append(body)
    return scenario(kv={"block_tokens": 16, "format": "bf16", "budget": 180 * 16 * 147456, **kv},
                    workload={"kind": "requests", "requests": reqs})


def test_all_does_not_depend_on_what_the_workload_says_is_shared(monkeypatch):
    """The shortcut reads Request.shareable_tokens only to skip hashing blocks no other request's
    tokens can equal. With that fact withheld (every request: None, so every block is hashed as it
    fills) the run is byte-identical: all's hits and evictions need no foresight."""
    sc = _shared_prefix_scenario()
    base = _run_outputs(sc)
    assert base[0]["prefix_hit_tokens"] > 0 and base[0]["evictions"] > 0
    monkeypatch.setattr(Workload, "shareable_tokens", lambda self, i, extra_shared=frozenset(): None)
    assert _run_outputs(sc) == base
    foresight = _run_outputs(_shared_prefix_scenario(prefix_index="foresight"))
    assert foresight[0]["prefix_hit_tokens"] >= base[0]["prefix_hit_tokens"]  # the upper bound


@pytest.mark.parametrize("path", ["chapter8/scheme-d-6gib.yaml", "disagg-llama-3.1-70b-h100.yaml",
                                  "chapter8/sixteen-long-independent.yaml"])
def test_private_runs_give_the_results_of_hashing_every_block(monkeypatch, path):
    """Shipped scenarios (warm prefix + speculative, disaggregated with the prefill replica's holder,
    evictions): LAZY_PRIVATE on and off give identical summaries and request tables."""
    from sim.io.config import load_scenario
    sc, _ = load_scenario(REPO_SCENARIOS / path)
    lazy = _run_outputs(sc)
    monkeypatch.setattr(kvmod, "LAZY_PRIVATE", False)
    assert _run_outputs(sc) == lazy


def test_runs_are_deterministic_under_all():
    """Same scenario and seed: byte-identical outputs, run after run."""
    sc = _shared_prefix_scenario()
    assert _run_outputs(sc) == _run_outputs(sc)


# ---- the shortcut against the plain form, operation by operation ---------------------------

class LazyVersusEager(RuleBasedStateMachine):
    """Two block managers under all, one with private runs (LAZY_PRIVATE) and one hashing every
    block, driven by the same admissions, chunks, output tokens, preemptions (the request comes back
    for its own blocks), finishes and retries (same id and tokens): every observable must agree."""

    def __init__(self):
        super().__init__()
        saved = kvmod.LAZY_PRIVATE
        kvmod.LAZY_PRIVATE = True
        self.lazy = BlockManager(20, BS, 1.0)
        kvmod.LAZY_PRIVATE = False
        self.eager = BlockManager(20, BS, 1.0)
        kvmod.LAZY_PRIVATE = saved
        self.live: list[tuple[Request, Request]] = []
        self.back: list[tuple[Request, Request]] = []   # preempted, to be admitted again
        self.done: list[tuple[Request, Request]] = []   # finished, may be retried
        self.next_rid = 0
        self.now = 0.0

    def _pair(self, rid, prefix, pre, private):
        return tuple(req(rid, private, prefix, pre if prefix else 0, shareable=pre if prefix else 0)
                     for _ in range(2))

    def _admit(self, pair):
        self.now += 1.0
        (a, b) = pair
        ha, hb = self.lazy.match(a), self.eager.match(b)
        assert ha == hb
        ok = self.lazy.can_allocate(a, a.prompt_tokens, ha)
        assert ok == self.eager.can_allocate(b, b.prompt_tokens, hb)
        if not ok:
            return False
        self.lazy.allocate(a, a.prompt_tokens, ha, self.now)
        self.eager.allocate(b, b.prompt_tokens, hb, self.now)
        a.computed_tokens = b.computed_tokens = len(ha) * BS
        self.live.append(pair)
        return True

    @rule(prefix=st.sampled_from(["a", "b", None]), pre=st.integers(1, 10), private=st.integers(1, 10))
    def admit(self, prefix, pre, private):
        self.next_rid += 1
        self._admit(self._pair(self.next_rid, prefix, pre, private))

    @precondition(lambda self: self.back)
    @rule(k=st.integers(0, 10))
    def come_back(self, k):
        pair = self.back[k % len(self.back)]
        for r in pair:
            r.block_hashes = []
        if self._admit(pair):
            self.back.remove(pair)

    @precondition(lambda self: self.live)
    @rule(k=st.integers(0, 10), n=st.integers(1, 8))
    def compute(self, k, n):
        a, b = self.live[k % len(self.live)]
        n = min(n, a.prompt_tokens - a.computed_tokens)
        if n <= 0:
            return
        self.now += 1.0
        for kv, r in ((self.lazy, a), (self.eager, b)):
            r.computed_tokens += n
            kv.register(r, r.computed_tokens, self.now)

    @precondition(lambda self: self.live)
    @rule(k=st.integers(0, 10))
    def decode(self, k):
        a, b = self.live[k % len(self.live)]
        if a.computed_tokens < a.prompt_tokens + a.output_tokens:
            return
        need = a.computed_tokens + 1
        ok = self.lazy.can_allocate(a, need)
        assert ok == self.eager.can_allocate(b, need)
        if ok:
            self.now += 1.0
            for kv, r in ((self.lazy, a), (self.eager, b)):
                kv.allocate(r, need, now_s=self.now)
                r.computed_tokens += 1
                r.output_tokens += 1
                kv.register(r, r.computed_tokens, self.now)

    @precondition(lambda self: self.live)
    @rule(k=st.integers(0, 10), own=st.booleans())
    def release(self, k, own):
        pair = self.live.pop(k % len(self.live))
        self.now += 1.0
        for kv, r in ((self.lazy, pair[0]), (self.eager, pair[1])):
            kv.register(r, r.computed_tokens, self.now, own_reuse=own)
            kv.free(r, self.now)
            if not own:
                r.output_tokens = 0
            r.computed_tokens = 0
        (self.back if own else self.done).append(pair)

    @precondition(lambda self: self.done)
    @rule(k=st.integers(0, 10))
    def retry(self, k):
        """The same request sent again (a wrong answer retried): same id and tokens, attempt 2."""
        old = self.done.pop(k % len(self.done))
        pair = tuple(Request(r.rid, 0.0, r.prompt_tokens, 4, 0.0, attempt=2, segments=r.segments,
                             shareable_tokens=r.shareable_tokens) for r in old)
        self._admit(pair)

    @invariant()
    def same_state(self):
        lz, eg = self.lazy, self.eager
        assert list(lz.cached_free) == list(eg.cached_free)
        assert lz.free_ids() == eg.free_ids()
        assert lz.used_blocks == eg.used_blocks and lz.stats.evictions == eg.stats.evictions
        assert [a.block_table for a, _ in self.live] == [b.block_table for _, b in self.live]
        assert len(lz.cached_free) + lz.used_blocks + lz.empty_blocks == lz.num_blocks


LazyVersusEager.TestCase.settings = settings(
    max_examples=int(os.environ.get("CAPSIM_HYPOTHESIS_EXAMPLES", "300")), stateful_step_count=40, deadline=None)
TestLazyVersusEager = LazyVersusEager.TestCase
