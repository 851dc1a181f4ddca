"""Fixed (static) batching: admit up to max_num_seqs, run the group to completion, then the next."""

from __future__ import annotations

from typing import Literal

from sim.schedulers.base import Scheduler, SchedulerConfig, StepPlan


class FixedConfig(SchedulerConfig):
    kind: Literal["fixed"] = "fixed"


class FixedBatching(Scheduler):
    kind = "fixed"

    def _schedule(self, plan: StepPlan, now_s: float) -> None:
        if not self.running:  # the previous group is done: form the next one, FCFS
            while self.waiting and len(self.running) < self.config.max_num_seqs:
                head = self.waiting[0]
                if not self._try_admit(head, now_s, head.tokens_to_compute) and self.waiting and self.waiting[0] is head:
                    break
        self._schedule_decodes(plan)
        for req in self._prefilling():  # the group's prefill (or a recompute), whole
            n = req.tokens_to_compute
            if req.rid in self.running and self._ensure_kv(req, n, plan):
                self._add(plan, req, n)
