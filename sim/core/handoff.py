"""Disaggregated serving's front end: requests are prefilled in the prefill pool, their KV is sent
over the link, and the decode pool finishes them.

A request the workload sends (the *original*) is first served as a one-token *prefill leg* in the
prefill pool: prompt and first token. When the leg finishes, the original takes its state (prompt
computed, one output, first-token time, cache hits, preemptions) and its prompt's KV goes over the
:class:`KVLink` from the leg's prefill replica; only when the last byte has arrived is the original
put in a decode replica's inbox, where admission allocates blocks for the transferred KV without
computing it (Request.remote_kv_tokens). Everything the recorder sees is the original.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import numpy as np
import simpy

from sim.core.cluster import Replica
from sim.core.frontend import Frontend
from sim.core.request import Request, Status

HANDOFF_COLUMNS = ("prefill_replica", "prefill_done_s", "kv_transfer_bytes", "transfer_start_s", "transfer_end_s",
                   "decode_admitted_s", "prefill_response_s")
"""Extra requests.csv columns of a disaggregated run (NaN / -1 where a request never got there)."""


class KVLink:
    """The link from each prefill replica to the decode pool: per sending replica, `channels` transfers at a time
    (one per attention data-parallel rank, each with its own GPUs' links; FIFO), each taking
    latency_s + bytes / (per-GPU bandwidth x lanes).

    `lanes` is 1 / sim.models.parallel.kv_transfer_share: the request's KV over the bytes its busiest GPU link
    carries. GQA KV split by heads over several GPUs goes out over as many links at once (lanes > 1); an MLA
    latent that several receiving GPUs each need whole can load one link with several copies (lanes < 1)."""

    def __init__(self, bytes_per_s_per_gpu: float, latency_s: float, lanes: float, senders: int, channels: int = 1):
        self.bytes_per_s = bytes_per_s_per_gpu * lanes
        self.latency_s = latency_s
        self.lanes = lanes
        self.channels = channels
        self._free_at = [[0.0] * channels for _ in range(senders)]

    def transfer_s(self, nbytes: float) -> float:
        """Seconds one transfer of `nbytes` takes on an idle link."""
        return self.latency_s + nbytes / self.bytes_per_s

    def book(self, sender: int, nbytes: float, now_s: float) -> tuple[float, float]:
        """Queue a transfer from prefill replica `sender` (index in its pool) at `now_s` on its channel free
        soonest: (start, end) of the transfer; the channel is busy from start to end - latency."""
        free = self._free_at[sender]
        k = min(range(self.channels), key=free.__getitem__)
        start = max(now_s, free[k])
        busy = nbytes / self.bytes_per_s
        free[k] = start + busy
        return start, start + busy + self.latency_s


@dataclass
class Handoff:
    """One request's way through the two pools."""

    original: Request
    leg: Request
    prefill_replica: int = -1
    prefill_admitted_s: float | None = None
    prefill_done_s: float = math.nan
    kv_bytes: float = math.nan
    transfer_start_s: float = math.nan
    transfer_end_s: float = math.nan
    decode_admitted_s: float = math.nan
    decode_replica: object = None
    """The decode replica chosen at arrival (DisaggregationConfig.decode_preallocation), None where it is chosen
    after the transfer."""
    announced_s: float = math.nan
    """When that replica took the request (pre-allocated), letting the prefill start."""
    reserved: bool = False
    """Counted in that replica's `reserved` (until the request is in its inbox, or leaves)."""
    prefill_response_s: float = math.nan
    """When the prefill replica answered (DisaggregationConfig.wait_for_prefill_response): the end of its iteration
    running when the transfer ended, or the transfer's end if it was idle."""


class DisaggFrontend(Frontend):
    """The front end of two pools: routes into the prefill pool (`replicas`), hands off to the decode
    pool (`decode_replicas`, chosen by `decode_router`) after the KV transfer."""

    def __init__(self, env: simpy.Environment, scenario, workload, replicas: list[Replica], router,
                 decode_replicas: list[Replica], decode_router, link: KVLink, kv_bytes_of, recorder,
                 progress=None, link_bytes_of=None):
        super().__init__(env, scenario, workload, replicas, router, recorder, progress)
        self.decode_replicas = decode_replicas
        self.decode_router = decode_router
        self.link = link
        self.kv_bytes_of = kv_bytes_of  # a request's KV bytes from its token count (ModelSpec.kv_bytes_of_sequence)
        # the bytes the link is timed with, where parts of them spread over the GPUs unlike the KV (a linear-attention
        # model's state: sim.core.pools.state_link_bytes); the KV's own bytes otherwise
        self.link_bytes_of = link_bytes_of or kv_bytes_of
        self._first_decode = decode_replicas[0].index if decode_replicas else 0
        self.first_token = scenario.disaggregation.first_token
        self.wait_for_prefill_response = scenario.disaggregation.wait_for_prefill_response
        self.preallocate = scenario.disaggregation.decode_preallocation
        if self.preallocate:
            for r in decode_replicas:
                r.waiters, r.gated_inbox = [], False
        self.handoffs: dict[int, Handoff] = {}   # rid -> the latest attempt's way through the pools

    # ---- into the prefill pool -------------------------------------------------------------
    def route(self, req: Request) -> None:
        """An original request (or an accuracy retry) starts as a one-token leg in the prefill pool."""
        leg = Request(req.rid, req.arrival_s, req.prompt_tokens, 1, req.engine_arrival_s, deadline_s=req.deadline_s,
                      attempt=req.attempt, preemptions=req.preemptions, recomputed_tokens=req.recomputed_tokens,
                      segments=req.segments, shareable_tokens=req.shareable_tokens, adapter=req.adapter)
        leg.hash_all = True  # a holder takes its cached prompt blocks by reference (_hold_kv): the block
        # manager must hash them all, not treat its private ones as nobody else's (sim.core.kv)
        h = self.handoffs[req.rid] = Handoff(req, leg)
        if not self.preallocate:
            super().route(leg)
            return
        replica = self.decode_router.choose(req, [r for r in self.decode_replicas if r.marked_up])
        h.decode_replica, h.reserved = replica, True
        replica.reserved += 1
        if replica.idle_get is not None:  # its loop waits for work: it takes the request at once
            self._announced(h, self.env.now)
        else:
            replica.waiters.append(partial(self._announced, h))

    def _announced(self, h: Handoff, now_s: float) -> None:
        """The decode replica has taken the request (pre-allocated): its leg may enter the prefill pool."""
        h.announced_s = now_s
        if h.leg.status is not Status.CANCELLED:  # (a request cancelled meanwhile has left: cancel)
            super().route(h.leg)

    @staticmethod
    def _unreserve(h: Handoff) -> None:
        """The announced request is in its decode replica's inbox now, or will never be: no longer reserved there."""
        if h.reserved:
            h.decode_replica.reserved -= 1
            h.reserved = False

    def _handoff_of_leg(self, req: Request) -> Handoff | None:
        h = self.handoffs.get(req.rid)
        return h if h is not None and h.leg is req else None

    def _judge(self, req: Request, now_s: float) -> None:
        h = self._handoff_of_leg(req)
        if h is None:  # an original, finished in the decode pool
            self._after_prefill_response(req)
            super()._judge(req, now_s)
        else:
            self._prefilled(h, now_s)

    def _after_prefill_response(self, req: Request) -> None:
        """With wait_for_prefill_response, the tokens the client would have had before the prefill replica answered
        reach it then, at once: its first token (and, for an output done sooner, its last) move to the answer."""
        h = self.handoffs.get(req.rid)
        if h is None or h.original is not req or req.first_token_s is None or not h.prefill_response_s > req.first_token_s:
            return
        req.first_token_s = h.prefill_response_s
        if req.finish_s is not None and req.finish_s < h.prefill_response_s:
            req.finish_s = req.last_token_s = h.prefill_response_s

    def leave(self, req: Request, now_s: float) -> None:
        """A leg that leaves early (rejected, cancelled) takes its original with it; an original
        leaves with its prefill admission as `admitted_s` (the decode pool's is kept apart)."""
        h = self._handoff_of_leg(req)
        if h is not None:
            self._unreserve(h)
            o = h.original
            o.status, o.reject_reason, o.finish_s = req.status, req.reject_reason, req.finish_s
            o.admitted_s, o.first_token_s, o.replica = req.admitted_s, req.first_token_s, req.replica
            o.cached_tokens, o.preemptions, o.recomputed_tokens = req.cached_tokens, req.preemptions, req.recomputed_tokens
            o.kv_waited = req.kv_waited
            h.prefill_replica = -1 if req.replica is None else req.replica
            super().leave(o, now_s)
            return
        h = self.handoffs.get(req.rid)
        if h is not None and h.original is req and h.prefill_admitted_s is not None:
            if req.admitted_s is not None and not math.isnan(h.transfer_end_s):
                h.decode_admitted_s = req.admitted_s
            req.admitted_s = h.prefill_admitted_s
        super().leave(req, now_s)

    # ---- the handoff -----------------------------------------------------------------------
    def _prefilled(self, h: Handoff, now_s: float) -> None:
        """The leg has its first token: the original takes its state; its KV goes to the decode pool."""
        leg, o = h.leg, h.original
        h.prefill_replica, h.prefill_admitted_s, h.prefill_done_s = leg.replica, leg.admitted_s, now_s
        o.output_tokens, o.computed_tokens = 1, leg.prompt_tokens
        o.first_token_s = o.last_token_s = leg.first_token_s
        o.cached_tokens, o.preemptions, o.recomputed_tokens = leg.cached_tokens, leg.preemptions, leg.recomputed_tokens
        o.kv_waited, o.max_itl_s, o.last_iteration = leg.kv_waited, 0.0, None
        if o.done or o.status is Status.CANCELLED:  # it will not reach the decode pool
            self._unreserve(h)
        if o.done:  # one-token outputs never reach the decode pool
            o.status, o.finish_s, o.replica, o.admitted_s = Status.FINISHED, now_s, leg.replica, leg.admitted_s
            super()._judge(o, now_s)
            return
        if o.status is Status.CANCELLED:  # the client gave up while the leg was finishing
            o.finish_s, o.replica = now_s, leg.replica
            super().leave(o, now_s)
            return
        o.status, o.admitted_s, o.remote_kv_tokens = Status.WAITING, None, o.computed_tokens
        h.kv_bytes, link_bytes = self.kv_bytes_of(o.computed_tokens), self.link_bytes_of(o.computed_tokens)
        if self.first_token != "prefill":  # the client's first token comes from the decode pool
            o.first_token_s = o.last_token_s = None
            o.first_token_on_admit = self.first_token == "decode_admission"
            if self.first_token == "decode_recompute":  # the last prompt token is computed there again
                o.output_tokens = 0
                o.computed_tokens = o.remote_kv_tokens = o.computed_tokens - 1
        h.transfer_start_s, h.transfer_end_s = self.link.book(leg.replica, link_bytes, now_s)
        self.env.process(self._deliver_after_transfer(h, self._hold_kv(leg, now_s)))

    def _hold_kv(self, leg: Request, now_s: float) -> tuple[object, Request]:
        """The prefill replica keeps the prompt's KV until it has been sent: the leg's scheduler freed
        its blocks at the first token (this commit), so a holder takes as many back at once, its
        cached prefix blocks by reference (they stay matchable) and the rest fresh."""
        pool = self.replicas[leg.replica].pool
        holder = Request(leg.rid, leg.arrival_s, leg.prompt_tokens, 1, leg.engine_arrival_s, output_tokens=1,
                         computed_tokens=leg.prompt_tokens, segments=leg.segments,
                         shareable_tokens=leg.shareable_tokens, adapter=leg.adapter)
        hits = pool.match(holder)
        pool.allocate(holder, leg.prompt_tokens, hits, now_s)
        return pool, holder

    def _deliver_after_transfer(self, h: Handoff, held: tuple[object, Request]):
        o = h.original
        yield self.env.timeout(h.transfer_end_s - self.env.now)
        pool, holder = held
        pool.free(holder, self.env.now)  # sent: the prefill replica's blocks are free again
        self._unreserve(h)
        if self.wait_for_prefill_response:  # it answers between its iterations
            h.prefill_response_s = max(self.env.now, self.replicas[h.leg.replica].busy_until)
        if o.status is Status.CANCELLED:  # cancelled in flight: nothing to decode
            o.finish_s = self.env.now
            super().leave(o, self.env.now)
            return
        replica = h.decode_replica or self.decode_router.choose(o, [r for r in self.decode_replicas if r.marked_up])
        o.replica = replica.index
        replica.inbox.put(o)

    def cancel(self, req: Request) -> None:
        """The client gave up: before its decode replica took it (it leaves at once), on the prefill leg, in transfer
        (dropped when it lands), or in decode."""
        h = self.handoffs.get(req.rid)
        if h is None or h.original is not req or req.status in (Status.FINISHED, Status.REJECTED, Status.FAILED):
            return
        if h.reserved and math.isnan(h.announced_s):  # not yet taken by its decode replica: it leaves now
            h.leg.status, h.leg.finish_s = Status.CANCELLED, self.env.now
            self.leave(h.leg, self.env.now)
        elif math.isnan(h.prefill_done_s):  # still the leg's
            if h.leg.replica is not None and self.replicas[h.leg.replica].up:
                self.replicas[h.leg.replica].scheduler.cancel(h.leg, self.env.now)
            else:
                req.status = Status.CANCELLED
        elif req.replica is None:  # in transfer: it leaves when it lands
            req.status = Status.CANCELLED
        else:
            self.decode_replicas[req.replica - self._first_decode].scheduler.cancel(req, self.env.now)

    # ---- the per-request table -------------------------------------------------------------
    def columns(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """HANDOFF_COLUMNS for the requests `ids` (requests.csv order)."""
        rows = [self.handoffs.get(int(i)) for i in ids]

        def col(f, missing):
            return np.array([missing if h is None else f(h) for h in rows], dtype=float)
        return {"prefill_replica": col(lambda h: h.prefill_replica, -1).astype(np.int64),
                "prefill_done_s": col(lambda h: h.prefill_done_s, math.nan),
                "kv_transfer_bytes": col(lambda h: h.kv_bytes, math.nan),
                "transfer_start_s": col(lambda h: h.transfer_start_s, math.nan),
                "transfer_end_s": col(lambda h: h.transfer_end_s, math.nan),
                "decode_admitted_s": col(lambda h: h.decode_admitted_s, math.nan),
                "prefill_response_s": col(lambda h: h.prefill_response_s, math.nan)}
