"""The SimPy processes: arrivals() and replica_loop(); nothing else.

The loop knows three things: ask the scheduler for a plan, let the step time pass, commit.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import simpy

from sim.core.request import Request


def arrivals(env: simpy.Environment, workload, make_request: Callable[[int], Request],
             deliver: Callable[[Request], None], cancel: Callable[[Request], None]):
    """Release requests at their engine arrival times (scheduled + outside wait) through `deliver`."""
    engine_t = workload.arrival_s + workload.outside_wait_s
    for i in np.argsort(engine_t, kind="stable"):
        t = float(engine_t[i])
        if t > env.now:
            yield env.timeout(t - env.now)
        req = make_request(int(i))
        deliver(req)
        if req.cancel_at_s is not None:
            env.process(_cancel_at(env, req, cancel))


def _cancel_at(env: simpy.Environment, req: Request, cancel):
    if req.cancel_at_s > env.now:
        yield env.timeout(req.cancel_at_s - env.now)
    cancel(req)


def replica_loop(env: simpy.Environment, inbox: simpy.Store, scheduler, cost, timeline, on_outcome, on_dropped):
    """One replica: admit arrivals, plan a step, let time pass, commit. Policy lives in `scheduler`.

    Idle, it waits for the next arrival; the run ends when no process has anything left to do.
    A fault interrupts it (simpy.Interrupt): it stops where it is, the in-flight iteration lost.
    """
    try:
        while True:
            while inbox.items:
                scheduler.admit(inbox.items.pop(0), env.now)
            plan = scheduler.plan(env.now)
            on_dropped(env.now)
            if plan is None:
                if not scheduler.has_work:
                    scheduler.admit((yield inbox.get()), env.now)
                continue
            pool = scheduler.pool
            start, index = env.now, scheduler.iteration
            blocks = (pool.used_blocks, len(pool.cached_free), pool.host_used_blocks)
            yield env.timeout(cost.step_s(plan))
            timeline.on_iteration(start, env.now, plan, blocks)
            outcome = scheduler.commit(plan, env.now)
            timeline.on_tokens(index, start, env.now, outcome)
            on_outcome(outcome, env.now)
            on_dropped(env.now)
    except simpy.Interrupt:
        return
