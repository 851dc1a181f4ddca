"""The SimPy processes of one replica: arrivals() and replica_loop(); nothing else.

The loop knows three things: ask the scheduler for a plan, let the step time pass, commit.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import simpy

from sim.request import Request, Status


def arrivals(env: simpy.Environment, workload, inbox: simpy.Store, make_request: Callable[[int], Request],
             deliver: Callable[[Request], None], scheduler, state: dict):
    """Release requests at their engine arrival times (scheduled + outside wait) through `deliver`."""
    engine_t = workload.arrival_s + workload.outside_wait_s
    for i in np.argsort(engine_t, kind="stable"):
        t = float(engine_t[i])
        if t > env.now:
            yield env.timeout(t - env.now)
        req = make_request(int(i))
        deliver(req)
        if req.cancel_at_s is not None:
            env.process(_cancel_at(env, req, scheduler))
    state["arrivals_done"] = True
    if not inbox.items:
        inbox.put(None)  # wake an idle loop so it can see that nothing more will come


def _cancel_at(env: simpy.Environment, req: Request, scheduler):
    if req.cancel_at_s > env.now:
        yield env.timeout(req.cancel_at_s - env.now)
    scheduler.cancel(req, env.now)


def replica_loop(env: simpy.Environment, inbox: simpy.Store, scheduler, cost, recorder, on_outcome, on_dropped,
                 state: dict):
    """One replica: admit arrivals, plan a step, let time pass, commit. Policy lives in `scheduler`."""
    while True:
        while inbox.items:
            req = inbox.items.pop(0)
            if req is not None:
                scheduler.admit(req, env.now)
        plan = scheduler.plan(env.now)
        on_dropped(env.now)
        if plan is None:
            if state["arrivals_done"] and not inbox.items and not scheduler.has_work:
                return
            if not scheduler.has_work:
                req = yield inbox.get()
                if req is not None:
                    scheduler.admit(req, env.now)
            continue
        pool = scheduler.pool
        start, index = env.now, scheduler.iteration
        blocks = (pool.used_blocks, len(pool.cached_free), pool.host_used_blocks)
        yield env.timeout(cost.step_s(plan))
        recorder.on_iteration(start, env.now, plan, blocks)
        outcome = scheduler.commit(plan, env.now)
        recorder.on_tokens(index, start, env.now, outcome)
        on_outcome(outcome, env.now)
        on_dropped(env.now)
