"""Scheduler mechanics shared by every policy: queues, KV admission, budgets, plan and commit.

State model (read once here, not in each policy):
- A Request carries two counters: tokens that exist (prompt + outputs) and computed_tokens.
  A policy only decides how many of `tokens_to_compute` each request gets this iteration.
- `plan(now_s)` picks the work of one iteration and reserves KV for it (asking the block pool
  with can_* before mutating); it returns a StepPlan or None when there is nothing to run.
- `commit(plan, now_s)` applies the outcome once the iteration's time has passed: counters move,
  a request whose tokens are all computed emits one output token, finished and cancelled
  requests free their blocks. Freeing at commit is the deferred free of reference section 3:
  blocks read by the in-flight iteration are released only when it ends.
- The running list is in admission order; on_demand preemption takes the most recently
  admitted request (recompute), as vLLM does.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Literal

from pydantic import Field, PositiveInt

from sim.kv import BlockPool
from sim.request import Request, Status
from sim.schema import StrictModel


class SchedulerConfig(StrictModel):
    max_num_seqs: PositiveInt = Field(256, description="Most requests running at once")


@dataclass(slots=True)
class StepPlan:
    """One iteration's work: (request, new tokens, cached tokens before) and batch aggregates."""

    items: list[tuple[Request, int, int]] = field(default_factory=list)
    new_tokens: int = 0
    pairs: int = 0
    prefill_tokens: int = 0
    prefill_pairs: int = 0
    prefill_logits: int = 0
    prefill_seqs: int = 0
    decode_seqs: int = 0
    decode_kv_tokens: int = 0
    kv_tokens_read: int = 0
    max_context: int = 0

    def add(self, req: Request, n: int) -> None:
        h = req.computed_tokens
        pairs = n * h + n * (n + 1) // 2
        self.items.append((req, n, h))
        self.new_tokens += n
        self.pairs += pairs
        self.kv_tokens_read += h
        if h + n > self.max_context:
            self.max_context = h + n
        if n == 1 and not req.in_prefill:
            self.decode_seqs += 1
            self.decode_kv_tokens += h
        else:
            self.prefill_seqs += 1
            self.prefill_tokens += n
            self.prefill_pairs += pairs
            if n == req.tokens_to_compute:
                self.prefill_logits += 1

    @property
    def num_seqs(self) -> int:
        return len(self.items)

    @property
    def is_empty(self) -> bool:
        return not self.items


class Scheduler:
    """Base of all policies. Subclasses implement `_schedule(plan, now_s)` and set `kind`."""

    kind: ClassVar[str]

    def __init__(self, config: SchedulerConfig, pool: BlockPool, kv_admission: Literal["reserve", "on_demand"],
                 deadline_check: Callable[[Request, float], bool] | None = None):
        self.config = config
        self.pool = pool
        self.kv_admission = kv_admission
        self.deadline_check = deadline_check
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.dropped: list[Request] = []  # rejected or cancelled since the last drain
        self._cancelled_in_flight: list[Request] = []

    # ---- arrivals, cancellation -----------------------------------------------------------
    def admit(self, req: Request, now_s: float) -> None:
        """Queue an arriving request (admission into the batch happens in plan)."""
        if self.pool.blocks_for(self._reserve_tokens(req)) > self.pool.num_blocks:
            self._reject(req, "kv: request needs more blocks than the whole pool")
            return
        self.waiting.append(req)

    def cancel(self, req: Request, now_s: float) -> None:
        """Stop scheduling `req`; its blocks are freed at the next commit (after in-flight work)."""
        if req.status in (Status.FINISHED, Status.REJECTED, Status.CANCELLED):
            return
        if req.status is Status.WAITING and req in self.waiting:
            self.waiting.remove(req)
            req.status = Status.CANCELLED
            req.finish_s = now_s
            self.pool.free(req)
            self.dropped.append(req)
            return
        req.status = Status.CANCELLED
        self._cancelled_in_flight.append(req)

    def _reject(self, req: Request, reason: str) -> None:
        req.status = Status.REJECTED
        req.reject_reason = reason
        self.dropped.append(req)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- planning -------------------------------------------------------------------------
    def plan(self, now_s: float) -> StepPlan | None:
        plan = StepPlan()
        self._schedule(plan, now_s)
        if plan.is_empty:
            dropped = len(self.dropped)
            self._reject_stuck()
            if self.running and len(self.dropped) == dropped:
                raise RuntimeError(f"scheduler {self.kind!r} planned nothing with {len(self.running)} running and "
                                   f"{len(self.waiting)} waiting requests: a policy bug, please report it")
            return None
        return plan

    def _schedule(self, plan: StepPlan, now_s: float) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _reserve_tokens(self, req: Request) -> int:
        """Tokens whose KV must be held: everything up to the last output (which is never stored)."""
        return req.prompt_tokens + req.max_output_tokens - 1

    def _try_admit(self, req: Request, now_s: float, first_tokens: int) -> bool:
        """Move the head of the waiting queue into running if KV allows; first_tokens = its first chunk."""
        if self.deadline_check is not None and not self.deadline_check(req, now_s):
            self.waiting.popleft()
            self._reject(req, "deadline: cannot finish in time")
            return False
        need = self._reserve_tokens(req) if self.kv_admission == "reserve" else req.computed_tokens + first_tokens
        if not self.pool.can_allocate(req, need):
            return False
        self.pool.allocate(req, need)
        self.waiting.popleft()
        req.status = Status.RUNNING
        if req.admitted_s is None:
            req.admitted_s = now_s
        self.running.append(req)
        return True

    def _ensure_kv(self, req: Request, n: int, plan: StepPlan) -> bool:
        """on_demand: grow `req` to hold computed + n tokens, preempting the newest running request
        (by recompute) while blocks are short. False when `req` itself was preempted."""
        if self.kv_admission == "reserve":
            return True
        need = req.computed_tokens + n
        while not self.pool.can_allocate(req, need):
            victim = next((r for r in reversed(self.running) if r not in (it[0] for it in plan.items)), None)
            if victim is None:
                return False
            self._preempt(victim)
            if victim is req:
                return False
        self.pool.allocate(req, need)
        return True

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.pool.free(req)
        req.recompute_upto = max(req.recompute_upto, req.computed_tokens)
        req.computed_tokens = 0
        req.preemptions += 1
        req.status = Status.WAITING
        self.waiting.appendleft(req)

    def _reject_stuck(self) -> None:
        """Nothing runs yet the head of the queue cannot start: it never will. Reject it."""
        if not self.running and self.waiting:
            req = self.waiting.popleft()
            self._reject(req, "kv: does not fit the free pool even with nothing running")

    # ---- committing -----------------------------------------------------------------------
    def commit(self, plan: StepPlan, now_s: float, iteration: int) -> list[Request]:
        """Apply the iteration's outcome. Returns requests that emitted a token this iteration."""
        emitted = []
        for req, n, _h in plan.items:
            if req.status is Status.CANCELLED:
                continue
            before = req.computed_tokens
            req.computed_tokens = before + n
            if req.recompute_upto > before:
                req.recomputed_tokens += min(req.computed_tokens, req.recompute_upto) - before
            if req.computed_tokens == req.prompt_tokens + req.output_tokens:
                req.output_tokens += 1
                emitted.append(req)
        for req in emitted:
            if req.done:
                req.status = Status.FINISHED
                req.finish_s = now_s
                self.running.remove(req)
                self.pool.free(req)
        for req in self._cancelled_in_flight:
            req.finish_s = now_s
            if req in self.running:
                self.running.remove(req)
            elif req in self.waiting:
                self.waiting.remove(req)
            self.pool.free(req)
            self.dropped.append(req)
        self._cancelled_in_flight.clear()
        return emitted
