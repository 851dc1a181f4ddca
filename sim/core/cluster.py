"""Replicas behind a router: routing policies, health checks, and faults.

Routers are small policies with one method, `choose(req, candidates) -> Replica | None`, over the
replicas the router believes healthy (health checks mark a replica down `timeout` seconds after
a check finds it down, and up at the first check that finds it up).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from sim.io.schema import MAX_REPLICAS, StrictModel


class RouterConfig(StrictModel):
    """How requests are spread over replicas, and how fast health checks notice a replica going down."""
    kind: Literal["round_robin", "least_outstanding", "affinity"] = "least_outstanding"
    health_check_interval_s: float = Field(5.0, ge=1e-3, description="Seconds between health checks (at least 1 ms: "
                                         "each check is an event for as long as requests are in flight)")
    health_check_timeout_s: NonNegativeFloat = Field(2.0, description="A down replica is marked down this long after a check")


class Fault(StrictModel):
    """One replica down from start_s to end_s: its requests and KV are lost."""
    replica: NonNegativeInt
    start_s: NonNegativeFloat
    end_s: PositiveFloat

    @model_validator(mode="after")
    def _order(self):
        if self.end_s <= self.start_s:
            raise ValueError(f"end_s ({self.end_s}) must be after start_s ({self.start_s})")
        return self


class ClusterConfig(StrictModel):
    """Replicas of one deployment behind a router, with injected faults and what a lost request does."""
    replicas: PositiveInt = Field(1, le=MAX_REPLICAS, description="Replicas behind the router")
    router: RouterConfig = Field(default_factory=RouterConfig)
    faults: list[Fault] = Field(default_factory=list, description="Replicas down for an interval (state lost)")
    on_failure: Literal["fail", "retry"] = Field(
        "retry", description="A request on a failed replica fails, or is routed again (not to a replica that failed it)")
    frontend_latency_s: NonNegativeFloat = Field(
        0.0, description="Time from a client's send to the engine receiving the request (HTTP, API server, tokenizer): "
                         "counted in every latency from the send (TTFT, E2E); closed-loop users wait for it too. "
                         "Default 0: the engines' own time only. docs/fidelity.md sizes it in published benchmarks "
                         "(20-155 ms per collection)")

    @model_validator(mode="after")
    def _faults(self):
        for i, f in enumerate(self.faults):
            if f.replica >= self.replicas:
                raise ValueError(f"faults.{i}.replica ({f.replica}) must be < replicas ({self.replicas})")
        spans = sorted((f.replica, f.start_s, f.end_s, i) for i, f in enumerate(self.faults))
        for (r0, _, end0, i0), (r1, start1, _, i1) in zip(spans, spans[1:]):
            if r0 == r1 and start1 <= end0:  # the replica is still down: the later fault would do nothing
                raise ValueError(f"faults.{i1} (replica {r1}, start_s {start1}) starts before faults.{i0} of the "
                                 f"same replica has ended (end_s {end0}); give one fault for the whole interval")
        return self


class Router:
    """A routing policy: choose(req, candidates) picks one of the replicas believed healthy."""
    kind: ClassVar[str]

    def choose(self, req, candidates: list):  # pragma: no cover - interface
        """The replica to send `req` to, among `candidates` (None when there is none)."""
        raise NotImplementedError


class RoundRobin(Router):
    """Next replica in turn among the healthy ones."""

    kind = "round_robin"

    def __init__(self):
        self._next = 0

    def choose(self, req, candidates):
        """The healthy replica after the last one chosen, in index order."""
        if not candidates:
            return None
        pick = min(candidates, key=lambda r: ((r.index - self._next) % (1 << 30)))
        self._next = pick.index + 1
        return pick


class LeastOutstanding(Router):
    """The healthy replica with the fewest requests in it (first one on ties)."""

    kind = "least_outstanding"

    def choose(self, req, candidates):
        """The healthy replica holding the fewest requests (lowest index on ties)."""
        if len(candidates) == 1:
            return candidates[0]
        return min(candidates, key=lambda r: (r.outstanding, r.index), default=None)


class PrefixAffinity(Router):
    """Send a request where its prefix is cached: the replica with the longest cached match; when
    nothing is cached yet, where the same first shared stream (system prompt, session) went last;
    otherwise least outstanding."""

    kind = "affinity"

    def __init__(self):
        self._sticky: dict = {}

    def choose(self, req, candidates):
        """The replica with the longest cached prefix of `req`, else where its first shared stream went."""
        if not candidates:
            return None
        best = max(candidates, key=lambda r: (len(r.pool.match(req)), -r.outstanding, -r.index))
        key = req.segments[0][0] if (req.segments and req.shareable_tokens != 0) else None
        if not best.pool.match(req):
            sticky = self._sticky.get(key)
            best = sticky if sticky in candidates else min(candidates, key=lambda r: (r.outstanding, r.index))
        if key is not None:
            self._sticky[key] = best
        return best


ROUTERS = {cls.kind: cls for cls in (RoundRobin, LeastOutstanding, PrefixAffinity)}


class Replica:
    """One serving instance: its KV pool, scheduler, inbox and iteration timeline."""

    def __init__(self, index: int, pool, scheduler, inbox, timeline):
        self.index = index
        self.pool = pool
        self.scheduler = scheduler
        self.inbox = inbox
        self.timeline = timeline
        self.process = None
        self.up = True
        self.marked_up = True
        self.incarnation = 0
        self.retired: list[Replica] = []  # earlier incarnations (before a fault), for their stats
        self.idle_get = None  # the inbox.get an idle loop waits on: its request is in neither inbox nor scheduler
        self.busy_until = 0.0  # when the iteration running (or the last one) ends (sim.core.engine.replica_loop)
        self.waiters: list | None = None
        """Callbacks `taken(now_s)` of requests announced to this replica before they arrive (a disaggregated decode
        replica that pre-allocates: sim.core.handoff), each called at the first pass that takes arrivals (engine.
        RecvGate); None where nothing is announced."""
        self.gated_inbox = True
        """Whether the inbox waits for a pass that takes arrivals (False where what lands there was announced before:
        a pre-allocating decode replica takes transferred requests at every pass)."""
        self.balance_ranks = 1
        """Attention-DP ranks whose balance gates arrivals (scheduler.attention_dp_balance_iters; engine.BalanceGate)."""
        self.reserved = 0
        """Requests announced here (pre-allocated) and not yet in its inbox (counted as outstanding)."""

    @property
    def outstanding(self) -> int:
        """Requests routed here and not done: queued at the door, waiting or running."""
        s = self.scheduler
        return len(self.inbox.items) + len(s.waiting) + len(s.running) + self.reserved

    def requests(self) -> list:
        """Everything this replica holds (for a fault): inbox, running (admission order), waiting, and a
        request handed to its idle loop that the loop has not taken yet (a fault in the same instant)."""
        s = self.scheduler
        got = self.idle_get
        handed = [got.value] if got is not None and got.triggered else []
        return handed + list(self.inbox.items) + list(s.running.values()) + list(s.waiting)


def unlink_finished(env, replicas: list[Replica]) -> None:
    """Break the reference cycles a finished run's replicas are in, so that a run's structures, and its tables'
    spill files, go with its result without waiting for the cyclic collector (which runs rarely while runs go on:
    sim.core.simulation.fewer_collections). A replica's engine loop still waits for work when the run ends, and
    that wait (SimPy's get request, which keeps the process that made it) holds the loop: each waiting loop is
    interrupted, so it returns, and its wait is dropped; a timeline and the recorder hold each other: the timeline
    lets go (it records nothing more). Runs with faults or closed-loop users keep other processes in cycles; the
    collector takes those."""
    waiting = [r.process for r in replicas if r.process is not None and r.process.is_alive]
    for p in waiting:
        p.interrupt("the run is over")
    if waiting:
        env.run()  # only the interrupts are due: each loop returns (engine.replica_loop)
    for r in replicas:
        r.process = r.idle_get = None
        r.inbox.get_queue.clear()
        r.timeline.rec = None
