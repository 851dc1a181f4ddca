"""Fault injection and health checks: a replica goes down for an interval (its state lost) and comes
back empty; the router learns of it only through periodic health checks."""

from __future__ import annotations

from typing import Callable

import simpy

from sim.core.cluster import ClusterConfig, Replica
from sim.core.frontend import Frontend


class FaultInjector:
    """Takes replicas down and up as `cluster.faults` says, and runs the router's health checks.

    `new_replica(index, incarnation)` builds a fresh, empty replica; `start(replica)` runs its loop.
    """

    def __init__(self, env: simpy.Environment, cluster: ClusterConfig, frontend: Frontend,
                 new_replica: Callable[[int, int], Replica], start: Callable[[Replica], None]):
        self.env, self.cluster, self.frontend = env, cluster, frontend
        self.replicas = frontend.replicas
        self.new_replica, self.start = new_replica, start

    def begin(self) -> None:
        """Schedule every fault, then the health checks (in this order: it fixes SimPy's event order)."""
        for f in self.cluster.faults:
            self.env.process(self._fault(f))
        self.env.process(self._health_checks())

    def _fault(self, f):
        env = self.env
        yield env.timeout(f.start_s - env.now) if f.start_s > env.now else env.timeout(0)
        old = self.replicas[f.replica]
        if not old.up:
            return
        old.up = False
        old.process.interrupt()
        lost = old.requests()
        yield env.timeout(0)  # let the interrupted loop unwind first
        for req in lost:
            if self.frontend.fail_or_retry(req, old):
                self.frontend.route(req)
        yield env.timeout(f.end_s - env.now)
        fresh = self.new_replica(f.replica, old.incarnation + 1)
        fresh.incarnation = old.incarnation + 1
        fresh.marked_up = old.marked_up
        fresh.timeline = old.timeline  # one iteration log per replica index
        fresh.scheduler.timeline = old.timeline
        fresh.scheduler.iteration = old.timeline.iterations  # iteration indices continue the log
        fresh.retired = old.retired + [old]
        self.replicas[f.replica] = fresh
        self.start(fresh)

    def _health_checks(self):
        """Every interval, find each replica up or down; a down one is marked down after the timeout."""
        rc = self.cluster.router
        while self.frontend.finished < self.frontend.total:
            for r in self.replicas:
                if r.up:
                    r.marked_up = True
                elif r.marked_up:
                    self.env.process(self._mark_down(r.index, rc.health_check_timeout_s))
            yield self.env.timeout(rc.health_check_interval_s)

    def _mark_down(self, index: int, delay: float):
        yield self.env.timeout(delay)
        if not self.replicas[index].up:
            self.replicas[index].marked_up = False
