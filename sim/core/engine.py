"""The engine loop, shared by the simulation and by real replays: arrivals() and replica_loop().

The loop knows three things: ask the scheduler for a plan, let the step pass, commit. It depends on
two things it is given:

- a clock: a SimPy environment. In simulation its time is virtual and jumps from event to event; a
  real replay drives the same environment and lets its executor line the environment's time up with
  a wall or thread clock (see calibration/replay.py).
- a step executor: `begin(now_s)` when the loop wakes up, `execute(plan, start_s) -> seconds` for an
  iteration, `committed(plan, outcome, now_s)` after it. In simulation a :class:`ModelledExecutor`
  asks a step-time model; in a replay the executor runs the plan on a real model and times it.
"""

from __future__ import annotations

import math
from typing import Callable, Protocol

import numpy as np
import simpy

from sim.core.request import Request
from sim.models.step_time import KeptShapes, shape_cache_of


class StepExecutor(Protocol):
    """What runs an iteration: a step-time model in simulation, a real model in a replay."""

    def begin(self, now_s: float) -> None:
        """The loop woke up at `now_s` (before admitting and planning)."""

    def execute(self, plan, start_s: float) -> float:
        """Run `plan`, an iteration that started at `start_s`; return how long it took (seconds)."""

    def committed(self, plan, outcome, now_s: float) -> None:
        """The scheduler committed `plan` at `now_s` with this outcome (tokens emitted, finished)."""


class ModelledExecutor:
    """Step times from a step-time model: the simulation's executor.

    With `fast_forward`, stretches of steady decode iterations (the same batch, one token longer
    each, nothing arriving) are committed without an event per iteration; the outputs are the same
    byte for byte (tests/sim/test_fast_decode.py)."""

    def __init__(self, step_time, fast_forward: bool = True):
        self.step_time = step_time
        self.fast_forward = fast_forward
        cache = shape_cache_of(step_time)
        self.shapes = None if cache is None else KeptShapes(cache)
        """The engine's kernel cache when the profile has a shape_cache (one executor per replica then)."""

    def begin(self, now_s: float) -> None:
        """Nothing to line up: simulated time is the only clock."""

    def execute(self, plan, start_s: float) -> float:
        """The model's time for this iteration (plus building its shape's kernel, if not kept)."""
        if self.shapes is None:
            return self.step_time.step_s(plan)
        return self.step_time.step_s(plan) + self.shapes.miss_s(plan)

    def committed(self, plan, outcome, now_s: float) -> None:
        """Nothing to record: the timeline and the recorder have it."""


def arrivals(env: simpy.Environment, workload, make_requests: Callable[[np.ndarray], list[Request]],
             deliver: Callable[[Request], None], cancel: Callable[[Request], None]):
    """Release requests at their engine arrival times (scheduled + outside wait) through `deliver`;
    `make_requests` turns workload rows into Requests, a block of rows at a time."""
    engine_t = workload.arrival_s + workload.outside_wait_s
    order = np.argsort(engine_t, kind="stable")
    for a in range(0, len(order), 4096):  # Python objects a block at a time (not a million at once)
        block = order[a:a + 4096]
        for req, t in zip(make_requests(block), engine_t[block].tolist()):
            if t > env.now:
                yield env.timeout(t - env.now)
            deliver(req)
            if req.cancel_at_s is not None:
                env.process(_cancel_at(env, req, cancel))


class ArrivalFeed:
    """The arrivals of `arrivals`, released by the one engine loop of a run instead of by a process of their own.

    A run whose only SimPy processes would be `arrivals` and one `replica_loop` (one replica, open-loop arrivals,
    nothing cancelled, no faults, a modelled executor) gives the loop this feed: the loop releases each request
    itself at the time `arrivals` would have, one event less per request, with the same results byte for byte
    (tests/sim/test_arrival_feed.py).

    Same times: `arrivals` waits `t - now` from the time of the request before it, so a request is released at
    `prev + (t - prev)` in floats (`next_fire`), and at once with the one before when `t <= prev`: a *group*,
    released in one step. Same order: where a group and the loop's iteration end at the same instant, SimPy
    takes the event scheduled first. The feed keeps that order with one counter (`tick`) that both sides draw
    from when they would schedule: the loop when it would wait for an iteration, the feed when it would wait for
    its next group (`next_seq`); a group is released before the loop's iteration ends when it fires earlier, or
    at the same instant and was scheduled first.

    After the last group `next_fire` is inf, where `arrivals` would still end at that instant (one more event);
    nothing waits on that end, so only the loop's idle fast-forward sees the difference, and it is exact either
    way. The first group is counted at construction: the loop schedules nothing before the feed is made. The
    executor must not schedule SimPy events of its own: the run gives the feed to the model's own executor only
    (`ModelledExecutor` itself; a subclass, a replay's executor, keeps the `arrivals` process)."""

    __slots__ = ("env", "_make_requests", "_deliver", "_times", "_order", "_reqs", "_block_times",
                 "_k", "_a", "next_fire", "next_seq", "_seq")

    def __init__(self, env: simpy.Environment, workload, make_requests: Callable[[np.ndarray], list[Request]],
                 deliver: Callable[[Request], None]):
        self.env, self._make_requests, self._deliver = env, make_requests, deliver
        self._times = workload.arrival_s + workload.outside_wait_s
        self._order = np.argsort(self._times, kind="stable")
        self._reqs: list[Request] = []
        self._block_times: list[float] = []
        self._k = self._a = 0
        self._seq = 0
        self.next_fire = math.inf
        """When the next group is released (inf: none is left)."""
        self.next_seq = 0
        """When it was scheduled (the counter's value then)."""
        # `arrivals` starts at the clock's time and waits for its first request unless it is due already
        now = env.now
        t = self._peek()
        if t is not None:
            self.next_fire = now + (t - now) if t > now else now
            self.next_seq = self.tick()

    def tick(self) -> int:
        """The next value of the shared counter (something is scheduled)."""
        self._seq += 1
        return self._seq

    def _peek(self) -> float | None:
        """The next request's engine time (its block made into Requests when reached), None when none is left."""
        if self._k == len(self._block_times):
            if self._order is None or self._a >= len(self._order):
                self._times = self._order = None  # all released: the run's tables may use the memory
                return None
            block = self._order[self._a:self._a + 4096]  # Python objects a block at a time, as `arrivals` makes them
            self._a += len(block)
            self._reqs = self._make_requests(block)
            self._block_times = self._times[block].tolist()
            self._k = 0
        return self._block_times[self._k]

    def release(self) -> None:
        """Release the next group at `next_fire` (the clock is set there): its requests go through `deliver` in
        order, and the group after it is scheduled."""
        deliver = self._deliver
        fire = self.next_fire
        self.env._now = fire
        while True:
            k = self._k
            deliver(self._reqs[k])
            self._k = k = k + 1
            t = self._block_times[k] if k < len(self._block_times) else self._peek()  # (_peek inside a block)
            if t is None:
                self.next_fire = math.inf
                return
            if t > fire:
                self.next_fire = fire + (t - fire)
                self._seq = self.next_seq = self._seq + 1  # (tick(), inline: once per group)
                return

    def release_until(self, end_s: float, seq: int) -> None:
        """The loop waits for an iteration ending at `end_s`, scheduled as `seq`: release every group SimPy would
        run before the loop resumes."""
        while self.next_fire < end_s or (self.next_fire == end_s and self.next_seq < seq):
            self.release()


class RecvGate:
    """When an engine takes what has arrived (scheduler.recv_interval, SGLang's --scheduler-recv-interval): every
    pass counts, a pass after a decode-only iteration 1 and any other pass `every` (SGLang's recv skipper weighs a
    decode forward 1 and an extend 1000), and the pass whose count reaches `every` takes the arrivals and starts
    counting again. An engine coming out of idle takes them at once (its idle passes are cheap). A pre-allocating
    decode replica that takes transferred requests in a pass takes arrivals in it too: SGLang 0.5.x runs them as a
    prebuilt batch, a pass without a forward that counts 1000, so the pass right after it receives."""

    __slots__ = ("every", "count")

    def __init__(self, every: int):
        self.every = every
        self.count = 0

    def passed(self, plan) -> bool:
        """A pass after an iteration (`plan`'s): True when it takes the arrivals."""
        self.count += 1 if plan.prefill_tokens == 0 else self.every
        if self.count >= self.every:
            self.count = 0
            return True
        return False

    @staticmethod
    def of(replica) -> tuple[RecvGate | None, bool, bool]:
        """(the gate of `replica`'s scheduler, None at an interval of 1; whether every pass takes arrivals and nothing
        is announced to it; whether its inbox waits for the gate)."""
        cfg = replica.scheduler.config
        every, balance = cfg.recv_interval, getattr(cfg, "attention_dp_balance_iters", 0)
        gate = RecvGate(every) if every > 1 else None
        if balance and replica.balance_ranks > 1:
            gate = BalanceGate(replica.balance_ranks, balance, replica.inbox.items)
        if getattr(cfg, "batch_wait_iters", 0):
            gate = BatchWaitGate(cfg.batch_wait_iters, cfg.batch_wait_tokens, replica.inbox.items,
                                 replica.scheduler.running)
        return gate, gate is None and replica.waiters is None, replica.gated_inbox

    def opened(self) -> bool:
        """A pass out of idle (or the first): it takes the arrivals."""
        self.count = 0
        return True


class BalanceGate:
    """TensorRT-LLM's attention-DP balance (scheduler.attention_dp_balance_iters; attention_dp_config enable_balance,
    timeout_iters): new prompts wait until every rank has one, so the ranks prefill together instead of one rank's
    prefill stalling the others' decodes. A pass takes the arrivals when they are at least one a rank, or when fewer
    sequences than ranks decode (some rank idles), or after `timeout` passes of holding them; the engine takes them at
    once coming out of idle (RecvGate's interface)."""

    __slots__ = ("ranks", "timeout", "held", "waited")

    def __init__(self, ranks: int, timeout: int, held: list):
        self.ranks, self.timeout, self.held, self.waited = ranks, timeout, held, 0

    def passed(self, plan) -> bool:
        """A pass after `plan`'s iteration: True when it takes the arrivals."""
        if len(self.held) >= self.ranks or plan.decode_seqs < self.ranks or self.waited + 1 >= self.timeout:
            self.waited = 0
            return True
        self.waited += 1 if self.held else 0
        return False

    def opened(self) -> bool:
        """A pass out of idle (or the first): it takes the arrivals."""
        self.waited = 0
        return True


class BatchWaitGate:
    """TensorRT-LLM's batch waiting (scheduler.batch_wait_iters, batch_wait_tokens; its batch_wait_timeout_iters and
    batch_wait_max_tokens_ratio x max_num_tokens, PyExecutor._waiting_requests): while sequences decode, new prompts
    are held so that several prefill in one pass instead of each stalling the decodes. A pass holding prompts takes
    them once the held prompts' tokens and the running sequences' decode tokens reach `tokens`, or after `iters`
    passes of holding (the count carries over until a pass takes them); a pass with nothing running takes them at
    once, and so does an engine coming out of idle (RecvGate's interface). Held prompts count all their tokens
    (prefix-cache hits included, as the engines that set it run without block reuse)."""

    __slots__ = ("iters", "tokens", "held", "running", "waited")

    def __init__(self, iters: int, tokens: int, held: list, running):
        self.iters, self.tokens, self.held, self.running, self.waited = iters, tokens, held, running, 0

    def passed(self, plan) -> bool:
        """A pass after `plan`'s iteration: True when it takes the arrivals."""
        if not self.held or not self.running:  # nothing to hold, or nothing decoding: no hold, the count unchanged
            return True
        per_seq = plan.decode_positions / plan.decode_seqs if plan.decode_seqs else 1.0  # 1 + drafts
        tokens = sum(r.prompt_tokens for r in self.held) + len(self.running) * per_seq
        if self.waited >= self.iters or tokens >= self.tokens:
            self.waited = 0
            return True
        self.waited += 1
        return False

    def opened(self) -> bool:
        """A pass out of idle (or the first): it takes the arrivals."""
        return True


def _take_arrivals(replica, gate: RecvGate | BalanceGate | BatchWaitGate | None, stepped: bool, plan, now: float) -> bool:
    """Whether this pass takes the requests that arrived (its gate's rule), serving the replica's waiters then
    (callbacks of requests a disaggregated front end has announced: Replica.waiters)."""
    if gate is None:
        take = True
    elif not stepped or (not replica.gated_inbox and replica.inbox.items):  # out of idle, or transfers: at once
        take = gate.opened()
    else:
        take = gate.passed(plan)
    if take and replica.waiters:
        waiters = replica.waiters[:]
        replica.waiters.clear()
        for taken in waiters:
            taken(now)
    return take


def _take_held(replica, gate: RecvGate | BalanceGate | BatchWaitGate | None, admit, now: float) -> bool:
    """An engine about to go idle takes at once the arrivals its gate held and the requests announced to it: True
    when there were any."""
    arrived = replica.inbox.items
    if not (arrived or replica.waiters):
        return False
    _take_arrivals(replica, gate, False, None, now)
    for req in arrived:
        admit(req, now)
    arrived.clear()
    return True


def _cancel_at(env: simpy.Environment, req: Request, cancel):
    if req.cancel_at_s > env.now:
        yield env.timeout(req.cancel_at_s - env.now)
    cancel(req)


def _delay_to(now_s: float, t_s: float) -> float:
    """The delay whose timeout from `now_s` lands exactly on `t_s` (now + delay == t_s in floats)."""
    d = t_s - now_s
    for _ in range(64):
        if now_s + d < t_s:
            d = math.nextafter(d, math.inf)
        elif now_s + d > t_s:
            d = math.nextafter(d, -math.inf)
        else:
            return d
    # no float delay lands exactly (now + d rounds half-to-even past t_s both ways): the nearest one,
    # one unit in the last place from t_s, instead of stopping the run
    return max(t_s - now_s, 0.0)


def replica_loop(env: simpy.Environment, replica, executor: StepExecutor, on_outcome, on_dropped,
                 feed: ArrivalFeed | None = None):
    """One replica: admit arrivals (when its RecvGate lets it), plan a step, let it pass, commit. Policy lives in the
    scheduler. Idle, it waits for the next arrival; the run ends when no process has anything left to do. A fault
    interrupts it (simpy.Interrupt): it stops where it is, the in-flight iteration lost. With `feed` (the run's only
    other process would have been `arrivals`) it releases the arrivals itself: nothing else is scheduled, so the next
    event of the run is the feed's next group. replica.busy_until: its iteration's end."""
    inbox, scheduler, timeline = replica.inbox, replica.scheduler, replica.timeline
    arrived, pool, dropped = inbox.items, scheduler.pool, scheduler.dropped  # (lists the others fill and drain in place)
    admit, plan_next, commit = scheduler.admit, scheduler.plan, scheduler.commit  # (bound once: called every pass)
    on_iteration, on_tokens = timeline.on_iteration, timeline.on_tokens
    gate, plain, gated = RecvGate.of(replica)
    # a modelled step without a gate (which counts every pass): skip steady decode stretches (a replay runs each one)
    fast_forward = scheduler.fast_forward if getattr(executor, "fast_forward", False) and gate is None else None
    steady_step = executor.step_time.step_s if fast_forward is not None else None  # (the model's, without shapes)
    ahead = scheduler.config.async_scheduling  # the next iteration was planned while the last one ran
    # the model's own executor: its begin and committed do nothing and execute is the model's step_s (no frames)
    modelled = type(executor) is ModelledExecutor and executor.shapes is None
    model_step = executor.step_time.step_s if modelled else None
    stepped, plan = False, None
    try:
        while True:
            now = env._now  # (env.now without the property's call: this loop sets _now itself below)
            if not modelled:
                executor.begin(now)
            if not (plain or _take_arrivals(replica, gate, stepped, plan, now) or not gated):
                plan = plan_next(now)  # the gate holds the arrivals
            elif ahead and stepped and arrived:
                plan = _plan_ahead(scheduler, arrived, now)
            else:
                for req in arrived:
                    admit(req, now)
                arrived.clear()
                plan = plan_next(now)
            stepped = False
            if dropped:
                on_dropped(now)
            if plan is None:
                if not scheduler.has_work and (plain or not _take_held(replica, gate, admit, now)):
                    if feed is not None and feed.next_fire != math.inf:  # idle until the next group arrives
                        feed.release()
                        continue
                    replica.idle_get = inbox.get()
                    req = yield replica.idle_get
                    replica.idle_get = None
                    admit(req, env.now)
                continue
            start, index = now, scheduler.iteration
            blocks = (pool.used_blocks, pool.cached_free.count, pool.host_used_blocks)
            step = model_step(plan) if modelled else executor.execute(plan, start)
            horizon = env.peek() if feed is None else feed.next_fire  # the run's next event
            end = start + step
            if fast_forward is not None and not plan.items and end < horizon:  # (else no steady stretch follows)
                start, step = fast_forward(plan, start, step, horizon, steady_step, timeline, blocks)
                index, end = scheduler.iteration, start + step
            replica.busy_until = end
            if fast_forward is not None and end < horizon:
                # nothing else is scheduled before the step ends: pass the time without an event, to exactly start
                # + step (a timeout's callbacks and event order, fewer events; exact where a timeout may be 1 ulp off)
                env._now = now = end
            else:
                delay = step if start == now else _delay_to(now, end)
                if feed is None:
                    yield env.timeout(delay)
                    now = env.now
                else:  # the groups due before the timeout would fire, then the time it would fire at
                    now += delay
                    feed.release_until(now, feed.tick())
                    env._now = now
            on_iteration(start, now, plan, blocks)
            outcome = commit(plan, now)
            on_tokens(index, start, now, outcome)
            if not modelled:
                executor.committed(plan, outcome, now)
            on_outcome(outcome, now)
            stepped = True
            if dropped:
                on_dropped(now)
    except simpy.Interrupt:
        return


def _plan_ahead(scheduler, arrived: list, now: float):
    """Async scheduling, an iteration just ended: the next one was planned while it ran, before the requests that
    arrived meanwhile (`arrived`) were seen; they are queued after the plan and join the iteration after it. With
    nothing planned the engine was about to go idle: it plans again at once, with them."""
    held = arrived[:]
    arrived.clear()
    plan = scheduler.plan(now)
    for req in held:
        scheduler.admit(req, now)
    return plan if plan is not None or not held else scheduler.plan(now)
