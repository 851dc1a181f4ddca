"""Attention data-parallel ranks that queue apart: each request bound to one rank when it arrives.

By default (`parallel.attention_dp_routing: shared_queue`) a replica of attention_dp ranks has one scheduler whose
limits are the replica's, and the step-time model spreads each pass evenly over the ranks (ceil(n / attention_dp) of
its prompts and decodes on the busiest). Real engines bind a request to a rank when it arrives, and it stays there:

- SGLang's disaggregated workers send a request to rank `bootstrap_room % dp_size`, the room a random 63-bit number
  its router draws for the request (its data-parallel controller in disaggregation mode): `random`;
- SGLang's aggregated data-parallel controller deals requests to the ranks in turn: `round_robin`;
- `least_loaded`: the rank with the fewest requests waiting or running (lowest index on ties), as a balancing
  dispatcher does.

Bound, each rank queues apart: one rank may wait with a full batch while another idles, and a pass waits for its
busiest rank, which may hold more than an even share. RankedScheduler runs one scheduler per rank, of the replica's
policy, each with the scheduler's limits / attention_dp (max_num_seqs, max_num_batched_tokens; a chunk stays a rank's),
in lockstep: every iteration each rank plans its own requests, the plans are summed into the replica's StepPlan, and
StepPlan.rank_loads carries each rank's part so that the step-time model costs the busiest rank's actual load
(sim.models.parallel_ops). The ranks share the replica's KV blocks (an engine's per-rank KV limit is not modelled):
a rank with nothing running whose next request does not fit the free blocks waits while another rank holds them,
rather than being refused. Steady decode stretches are not fast-forwarded (each rank's batch changes on its own).
"""

from __future__ import annotations

import itertools

import numpy as np

from sim.core.step import RANK_LOAD_FIELDS, Outcome, StepPlan

ROUTINGS = ("random", "round_robin", "least_loaded")
"""parallel.attention_dp_routing values that bind requests to ranks (shared_queue does not)."""

_SUMMED = ("num_seqs", "new_tokens", "pairs", "prefill_tokens", "prefill_pairs", "prefill_logits", "prefill_seqs",
           "decode_seqs", "decode_kv_tokens", "kv_tokens_read", "shared_kv_tokens", "hit_kv_tokens", "lazy_decodes",
           "decode_positions", "decode_pairs", "decode_logits", "swap_bytes")


class _Joined:
    """The ranks' queues (deques of requests) or running maps (rid -> request) read as one, without copying."""

    __slots__ = ("parts",)

    def __init__(self, parts: list):
        self.parts = parts

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    def __bool__(self) -> bool:
        return any(self.parts)

    def __iter__(self):
        return itertools.chain.from_iterable(self.parts)

    def __contains__(self, item) -> bool:
        return any(item in p for p in self.parts)

    def values(self):
        """A running map's requests, rank after rank."""
        return itertools.chain.from_iterable(p.values() for p in self.parts)


def split_limits(config, ranks: int, where: str = "scheduler") -> object:
    """A rank's scheduler settings: the replica's max_num_seqs and max_num_batched_tokens / `ranks`. Raises ValueError
    naming the field when `ranks` does not divide one (a silent rounding would lose requests or tokens)."""
    update = {}
    for key in ("max_num_seqs", "max_num_batched_tokens"):
        value = getattr(config, key, None)
        if value is None:
            continue
        if value % ranks:
            raise ValueError(f"{where}.{key}: {value} is the replica's over its {ranks} attention-DP ranks bound to "
                             f"their requests (parallel.attention_dp_routing), so attention_dp must divide it; "
                             f"allowed: a multiple of {ranks}")
        update[key] = value // ranks
    return config.model_copy(update=update)


class RankedScheduler:
    """attention_dp schedulers, one per rank, run in lockstep as one replica's (see the module). Offers the engine
    loop, routers and front ends what a Scheduler does: admit, plan, commit, cancel, fork, the queues and the pool."""

    steady_decodes_only = False

    def __init__(self, ranks: list, routing: str, seed: list[int]):
        if routing not in ROUTINGS:
            raise ValueError(f"attention_dp_routing {routing!r}: allowed {list(ROUTINGS)}")
        self.ranks, self.routing = ranks, routing
        first = ranks[0]
        self.kind, self.config, self.pool = first.kind, first.config, first.pool
        self.dropped = first.dropped
        for r in ranks[1:]:
            r.dropped = self.dropped  # one list: the loop and front ends drain it in place
        self.waiting = _Joined([r.waiting for r in ranks])
        self.running = _Joined([r.running for r in ranks])
        self.speculator = None
        self.iteration = 0
        self._rng = np.random.default_rng(seed)
        self._turn = 0
        self._rank_of: dict[int, int] = {}
        self._timeline = None

    @property
    def timeline(self):
        return self._timeline

    @timeline.setter
    def timeline(self, value) -> None:
        self._timeline = value
        for r in self.ranks:
            r.timeline = value

    @property
    def kv_demand_peak_blocks(self) -> int:
        return max(r.kv_demand_peak_blocks for r in self.ranks)

    @property
    def has_work(self) -> bool:
        return any(r.has_work for r in self.ranks)

    def _choose(self) -> int:
        n = len(self.ranks)
        if self.routing == "random":
            return int(self._rng.integers(n))
        if self.routing == "round_robin":
            k, self._turn = self._turn, (self._turn + 1) % n
            return k
        return min(range(n), key=lambda k: (len(self.ranks[k].waiting) + len(self.ranks[k].running), k))

    def admit(self, req, now_s: float) -> None:
        """Bind `req` to a rank (once: a request preempted or handed back stays where it was) and queue it there."""
        k = self._rank_of.get(req.rid)
        if k is None:
            k = self._rank_of[req.rid] = self._choose()
        self.ranks[k].admit(req, now_s)

    def cancel(self, req, now_s: float) -> None:
        """Cancel `req` on its rank."""
        self.ranks[self._rank_of.get(req.rid, 0)].cancel(req, now_s)

    def can_fork(self, follower, leader) -> bool:
        """Whether `follower` can fork from `leader` on the leader's rank."""
        return self.ranks[self._rank_of.get(leader.rid, 0)].can_fork(follower, leader)

    def fork(self, follower, leader, now_s: float) -> None:
        """Fork `follower` from `leader` on the leader's rank (where the prompt's KV is)."""
        k = self._rank_of[follower.rid] = self._rank_of.get(leader.rid, 0)
        self.ranks[k].fork(follower, leader, now_s)

    def _waits_for_blocks(self, rank) -> bool:
        """A rank with nothing running whose next request does not fit the blocks other ranks hold now: it waits
        (its own scheduler would refuse the request as one that can never start)."""
        if rank.running or not rank.waiting or not any(r.running for r in self.ranks):
            return False
        return self.pool.blocks_for(rank._kv_tokens_to_start(rank.waiting[0])) > self.pool.free_blocks

    def plan(self, now_s: float) -> StepPlan | None:
        """Each rank's plan for this iteration, summed, with the ranks' parts in rank_loads; None when no rank has
        anything to run."""
        i = self.iteration
        plans = []
        for r in self.ranks:
            r.iteration = i  # a rank idle last iteration is at the replica's iteration again (it held no decodes)
            plans.append(r.plan(now_s) if r.has_work and not self._waits_for_blocks(r) else None)
        if all(p is None for p in plans):
            return None
        self._plans = plans
        return _summed(plans).freeze()

    def commit(self, plan: StepPlan, now_s: float) -> Outcome:
        """Each rank commits its own plan; the outcomes are joined."""
        emitted, finished, decode_tokens, output_tokens = [], [], 0, 0
        for r, p in zip(self.ranks, self._plans):
            if p is None:
                continue
            o = r.commit(p, now_s)
            emitted.extend(o.emitted)
            finished.extend(o.finished_decodes)
            decode_tokens += o.decode_tokens
            output_tokens += o.output_tokens
        self.iteration += 1
        return Outcome(emitted, finished, decode_tokens, output_tokens)

    def fast_forward(self, plan, start_s: float, step_s: float, horizon_s: float, step_time, timeline, blocks):
        """No steady stretch is skipped (see the module): the iteration as planned."""
        return start_s, step_s


def _summed(plans: list) -> StepPlan:
    """One StepPlan holding every rank's work, and each rank's part (zeros for a rank with nothing) in rank_loads."""
    out = StepPlan()
    items, spec_items, adapters = [], [], set()
    loads = []
    for p in plans:
        if p is None:
            loads.append((0,) * len(RANK_LOAD_FIELDS))
            continue
        for f in _SUMMED:
            setattr(out, f, getattr(out, f) + getattr(p, f))
        out.max_context = max(out.max_context, p.max_context)
        out.draft_s = max(out.draft_s, p.draft_s)
        out.draft_overlapped = out.draft_overlapped or p.draft_overlapped
        items.extend(p.items)
        spec_items.extend(p.spec_items)
        adapters.update(p.adapters)
        loads.append(tuple(getattr(p, f) for f in RANK_LOAD_FIELDS))
    if items:
        out.items = items
    if spec_items:
        out.spec_items = spec_items
    if adapters:
        out.adapters = adapters
    out.rank_loads = tuple(loads)
    return out
