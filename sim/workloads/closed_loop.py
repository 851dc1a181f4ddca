"""Closed-loop clients: N users, each sending its next request when its previous one has left the
system (finished, rejected, failed or cancelled), after an optional think time. This is how
`vllm bench serve --max-concurrency N`, genai-perf's concurrency mode and most published serving
results load an engine.

Request i is the i-th request sent, whichever user sends it; its lengths and the think time before
it are fixed by the workload (drawn from the scenario seed), so a run is deterministic.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import simpy


class ClosedLoopClients:
    """Releases the workload's requests: the first wave at the users' start times, then one per departure.

    The simulation calls `on_leave(req)` whenever a request leaves for good; `start()` is the
    SimPy process that sends the first wave.
    """

    def __init__(self, env: simpy.Environment, users: int, first_s: np.ndarray, think_s: np.ndarray, total: int,
                 send: Callable[[int, float], None]):
        self.env = env
        self.users = users
        self.first_s = first_s
        self.think_s = think_s
        self.total = total
        self.send = send
        self.sent = min(users, total)  # the first wave's indices are the users'; departures claim the next

    def start(self):
        """SimPy process: user u sends its first request at first_s[u] (all at start_s without a ramp)."""
        for i in range(min(self.users, self.total)):
            t = float(self.first_s[i])
            if t > self.env.now:
                yield self.env.timeout(t - self.env.now)
            self.send(i, self.env.now)

    def on_leave(self, _req=None) -> None:
        """A user's request left: that user thinks, then sends the next request (if any are left)."""
        if self.sent >= self.total:
            return
        i = self.sent
        self.sent += 1
        self.env.process(self._after(i, float(self.think_s[i])))

    def _after(self, i: int, delay: float):
        yield self.env.timeout(delay)
        self.send(i, self.env.now)


def closed_loop_clients(env: simpy.Environment, workload, make_request: Callable, deliver: Callable):
    """Start the clients of a closed-loop workload (their first wave) and return them, so the
    simulation can report departures to `on_leave`; None for an open-loop workload."""
    if not workload.closed_users:
        return None
    outside = workload.outside_wait_s

    def send(i: int, t: float) -> None:
        req = make_request(i, t)   # latency counts from the send; the engine sees it after the outside wait
        wait = float(outside[i])
        if wait > 0:
            env.process(_deliver_after(env, wait, req, deliver))
        else:
            deliver(req)

    clients = ClosedLoopClients(env, workload.closed_users, workload.arrival_s, workload.think_s, len(workload), send)
    env.process(clients.start())
    return clients


def _deliver_after(env: simpy.Environment, wait: float, req, deliver: Callable):
    yield env.timeout(wait)
    deliver(req)


def think_times(n: int, users: int, mean_s: float, distribution: str, rng: np.random.Generator) -> np.ndarray:
    """Think time before each request: 0 for the first wave, then fixed or exponential with mean_s."""
    out = np.zeros(n)
    later = max(n - users, 0)
    if later and mean_s > 0:
        out[users:] = mean_s if distribution == "fixed" else rng.exponential(mean_s, size=later)
    return out
