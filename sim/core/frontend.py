"""The front end of a serving system: where requests enter and leave.

It turns workload rows into Requests, sends them through the router to a replica, and takes them
back when they leave: finished (a wrong answer is retried while attempts remain), dropped by a
scheduler, or lost with a failed replica (failed, or routed again). Parallel-sampling branches wait
here for their prompt's prefill and then fork from it. Every arrival and departure is recorded.
"""

from __future__ import annotations

import math
from itertools import repeat
from typing import Callable

import numpy as np
import simpy

from sim.core import engine
from sim.core.cluster import Replica
from sim.core.metrics import Recorder
from sim.core.request import FINISHED, Request, Status, arriving
from sim.workloads.closed_loop import closed_loop_clients
from sim.workloads.workload import prefix_stream


class Frontend:
    """Routes requests to `replicas` (a list the fault injector may replace entries of) and records them."""

    def __init__(self, env: simpy.Environment, scenario, workload, replicas: list[Replica], router,
                 recorder: Recorder, progress: Callable[[int, int], None] | None = None):
        self.env, self.scenario, self.workload = env, scenario, workload
        self.replicas, self.router, self.rec, self.progress = replicas, router, recorder, progress
        self.finished = 0
        self.fault_retries = 0
        self.total = len(workload)
        self.clients = None
        self._acc_rng = np.random.default_rng(scenario.seed).spawn(4)[3]
        self._warm = frozenset(prefix_stream(wp.name) for wp in scenario.kv.warm_prefixes)
        self._retried = scenario.accuracy.retries
        self._always_right = scenario.accuracy.p_correct >= 1
        self._leaders = workload.leader  # parallel sampling: each row's leader (-1: none), or None
        self._held: dict[int, list[Request]] = {}   # parallel sampling: branches waiting for their prompt's prefill
        self._forked: set[int] = set()
        # one replica and a router whose choice among one candidate touches nothing (affinity matches
        # prefixes, which may hash cached blocks): route without asking it
        self._sole = len(replicas) == 1 and router.kind != "affinity"
        # deliver and on_outcome do route's one-replica case and _judge + leave of a right answer inline, where a
        # subclass (handoff.DisaggFrontend) keeps those methods
        self._direct = self._sole and type(self).route is Frontend.route
        self._plain_leave = (self._always_right and type(self)._judge is Frontend._judge
                             and type(self).leave is Frontend.leave)

    # ---- entering ---------------------------------------------------------------------------
    def open(self, feed: engine.ArrivalFeed | None = None) -> None:
        """Start the arrivals: closed-loop users, or the workload's own arrival times (released by the engine loop
        when it was given `feed`, see `arrival_feed`)."""
        if feed is not None:
            return
        self.clients = closed_loop_clients(self.env, self.workload, self.make_request, self.deliver)
        if self.clients is None:
            self.env.process(engine.arrivals(self.env, self.workload, self.make_requests, self.deliver, self.cancel))

    def arrival_feed(self) -> engine.ArrivalFeed | None:
        """The arrivals as a feed the one engine loop releases itself (engine.ArrivalFeed), when nothing but them and
        that loop would be scheduled: one replica, open-loop arrivals, no cancellation, no parallel-sampling branch
        waiting for its prompt. None otherwise (the caller also rules out faults and executors other than the model)."""
        wl = self.workload
        if (len(self.replicas) != 1 or wl.closed_users or (wl.leader is not None and (wl.leader >= 0).any())
                or not np.isnan(wl.cancel_at_s).all()):
            return None
        return engine.ArrivalFeed(self.env, wl, self.make_requests, self.deliver)

    def _shareable(self, i: int) -> int | None:
        wl = self.workload
        # a retried request re-sends its prompt: all of it may be hit again (and its outputs, when a
        # later turn continues them)
        shareable = wl.shareable_tokens(i, self._warm)
        return int(wl.prompt_tokens[i]) if self._retried and shareable is not None else shareable

    def make_request(self, i: int, sent_s: float | None = None) -> Request:
        """Workload row i as a Request (closed loop: sent at `sent_s`, when a user frees up)."""
        wl = self.workload
        a = float(wl.arrival_s[i]) if sent_s is None else sent_s
        cancel = float(wl.cancel_at_s[i])
        dl = float(wl.deadline_s[i])
        adapter = int(wl.adapter[i]) if wl.adapter is not None and wl.adapter[i] >= 0 else None
        return Request(i, a, int(wl.prompt_tokens[i]), int(wl.output_tokens[i]), a + float(wl.outside_wait_s[i]),
                       adapter=adapter,
                       deadline_s=None if math.isnan(dl) else dl, cancel_at_s=None if math.isnan(cancel) else cancel,
                       segments=wl.segments_of(i), shareable_tokens=self._shareable(i))

    def make_requests(self, rows: np.ndarray) -> list[Request]:
        """Workload rows `rows` as Requests, the same as make_request of each (columns read once)."""
        wl = self.workload
        arrival, outside = wl.arrival_s[rows].tolist(), wl.outside_wait_s[rows].tolist()
        cancel, deadline = wl.cancel_at_s[rows].tolist(), wl.deadline_s[rows].tolist()
        prompt, output = wl.prompt_tokens[rows].tolist(), wl.output_tokens[rows].tolist()
        adapter = wl.adapter[rows].tolist() if wl.adapter is not None else None
        own = wl.segments is None  # every prompt its own private stream
        plain = own and not wl.shared_streams and not self._warm  # nothing shared: shareable_tokens 0
        out = []
        append, retried = out.append, self._retried
        for i, a, p, o, w, c, d, ad in zip(rows.tolist(), arrival, prompt, output, outside, cancel, deadline,
                                           repeat(-1) if adapter is None else adapter):
            if plain:
                shareable = p if retried else 0
            else:
                shareable = self._shareable(i)
            append(arriving(i, a, p, o, a + w, None if d != d else d, None if c != c else c,
                            (((0, i), 0, p),) if own else wl.segments_of(i), shareable, ad if ad >= 0 else None))
        return out

    def deliver(self, req: Request) -> None:
        """A request reaches the front end: held for its leader's prefill (parallel sampling) or routed."""
        self.rec.on_enter(req, self.env._now)  # (env.now without the property's call)
        lead = int(self._leaders[req.rid]) if self._leaders is not None else -1
        if lead >= 0 and lead not in self._forked:
            self._held.setdefault(lead, []).append(req)
        elif self._direct and not req.avoid and (replica := self.replicas[0]).marked_up and replica.up:
            req.replica = replica.index  # (route's one-replica case, without its call)
            if replica.inbox.get_queue:
                replica.inbox.put(req)
            else:
                replica.inbox.items.append(req)
        else:
            self.route(req)

    def route(self, req: Request) -> None:
        """Send a request to a replica the router believes healthy; a replica that is actually down
        refuses it (it fails, or is routed again without that replica)."""
        while True:
            if self._sole and not req.avoid:  # one replica: no choice to make (and no router state to keep)
                replica = self.replicas[0] if self.replicas[0].marked_up else None
            else:
                replica = self.router.choose(req, [r for r in self.replicas if r.marked_up and r.index not in req.avoid])
            if replica is None:
                self._fail(req, "cluster: no healthy replica")
                return
            if replica.up:
                req.replica = replica.index
                inbox = replica.inbox
                if inbox.get_queue:  # its loop waits for work: the put wakes it
                    inbox.put(req)
                else:  # its loop takes the inbox's items when it next plans; a put event would do nothing
                    inbox.items.append(req)
                return
            if not self.fail_or_retry(req, replica):
                return

    def cancel(self, req: Request) -> None:
        """The client gave up on `req`: its replica drops it (if it is still there)."""
        if req.replica is not None and self.replicas[req.replica].up:
            self.replicas[req.replica].scheduler.cancel(req, self.env.now)

    # ---- leaving ----------------------------------------------------------------------------
    def leave(self, req: Request, now_s: float) -> None:
        """`req` leaves for good: recorded, reported to closed-loop users and to progress."""
        self.rec.on_leave(req, now_s)
        self.finished += 1
        if self.clients is not None:
            self.clients.on_leave(req)
        if self.progress is not None:
            self.progress(self.finished, self.total)

    def _fail(self, req: Request, reason: str) -> None:
        req.status = Status.FAILED
        req.reject_reason = reason
        req.finish_s = self.env.now
        self.leave(req, self.env.now)
        if self.workload.leader is not None:  # parallel-sampling branches, waiting or still to come, wait
            self._forked.add(req.rid)         # for a prefill that will not happen: they go on their own
            for branch in self._held.pop(req.rid, []):
                self.route(branch)

    def fail_or_retry(self, req: Request, replica: Replica) -> bool:
        """A request lost on a failed replica: True when it should be routed again."""
        req.avoid = req.avoid + (replica.index,)
        if self.scenario.cluster.on_failure == "retry" and len(req.avoid) < len(self.replicas):
            self.fault_retries += 1
            req.reset_for_retry()
            return True
        self._fail(req, f"cluster: replica {replica.index} failed")
        return False

    def _judge(self, req: Request, now_s: float) -> None:
        """A finished request: right (it leaves) or wrong (sent again while attempts remain)."""
        if self._always_right:  # it leaves
            req.correct = True
            self.leave(req, now_s)
            return
        acc = self.scenario.accuracy
        req.correct = bool(self._acc_rng.random() < acc.p_correct)
        if not req.correct and req.attempt <= acc.max_retries:
            self.route(Request(req.rid, req.arrival_s, req.prompt_tokens, req.max_output_tokens, now_s,
                               deadline_s=req.deadline_s, attempt=req.attempt + 1, preemptions=req.preemptions,
                               recomputed_tokens=req.recomputed_tokens, segments=req.segments,
                               shareable_tokens=req.shareable_tokens, adapter=req.adapter))
            return
        self.leave(req, now_s)

    # ---- one replica's callbacks ------------------------------------------------------------
    def start(self, replica: Replica, executor, feed: engine.ArrivalFeed | None = None) -> None:
        """Run `replica`'s engine loop with `executor`, its outcomes coming back here (the arrivals through it with
        `feed`)."""
        on_outcome, on_dropped = self._handlers(replica)
        replica.process = self.env.process(engine.replica_loop(self.env, replica, executor, on_outcome, on_dropped,
                                                               feed))

    def _handlers(self, replica: Replica):
        scheduler = replica.scheduler
        finished_forks: list[Request] = []

        def release(lead: int, leader: Request | None = None) -> None:
            """The leader's prompt is computed: its branches fork from it (or queue on their own)."""
            self._forked.add(lead)
            for r in self._held.pop(lead, []):
                if leader is not None and scheduler.can_fork(r, leader):
                    r.replica = replica.index
                    scheduler.fork(r, leader, self.env.now)
                    if r.status is Status.FINISHED:
                        finished_forks.append(r)
                else:
                    self.route(r)

        def on_outcome(outcome, now_s: float) -> None:
            if self._held:
                for req in outcome.emitted:
                    if req.rid in self._held and req.output_tokens == 1:
                        release(req.rid, req)
            finished, emitted = outcome.finished_decodes, outcome.emitted
            if (finished or emitted) and self._plain_leave and self.clients is None and self.progress is None:
                left = 0  # each finished request just leaves: _judge and leave, inline
                on_leave = self.rec.on_leave
                for group in (finished, emitted):
                    for req in group:
                        if req.status is FINISHED:
                            req.correct = True
                            on_leave(req, now_s)
                            left += 1
                self.finished += left
            elif finished or emitted:
                for group in (finished, emitted):
                    for req in group:
                        if req.status is FINISHED:
                            self._judge(req, now_s)
            if finished_forks:
                for req in finished_forks:
                    if req.status is FINISHED:
                        judge(req, now_s)
                finished_forks.clear()

        def on_dropped(now_s: float) -> None:
            for req in scheduler.dropped:
                if req.rid in self._held:
                    release(req.rid)
                if req.finish_s is None:
                    req.finish_s = now_s
                self.leave(req, now_s)
            scheduler.dropped.clear()

        return on_outcome, on_dropped
