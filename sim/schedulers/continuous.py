"""Continuous (iteration-level) batching: running decodes every iteration, FCFS admission of whole
prefills while max_num_seqs, the token budget max_num_batched_tokens and KV allow."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt

from sim.schedulers.base import Scheduler, SchedulerConfig, StepPlan


class ContinuousConfig(SchedulerConfig):
    kind: Literal["continuous"] = "continuous"
    max_num_batched_tokens: PositiveInt = Field(16384, description="Token budget per iteration (whole prefills)")


class ContinuousBatching(Scheduler):
    kind = "continuous"

    def _schedule(self, plan: StepPlan, now_s: float) -> None:
        budget = self.config.max_num_batched_tokens
        for req in list(self.running):  # running requests first: decodes (or a recompute)
            n = req.tokens_to_compute
            if req in self.running and n <= budget - plan.new_tokens and self._ensure_kv(req, n, plan):
                plan.add(req, n)
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            head = self.waiting[0]
            n = head.tokens_to_compute
            if n > budget - plan.new_tokens:
                break
            if not self._try_admit(head, now_s, n):
                if self.waiting and self.waiting[0] is head:
                    break
                continue
            plan.add(head, n)
