"""Fixed (static) batching: admit up to max_num_seqs, run the group to completion, then the next."""

from __future__ import annotations

from typing import Literal

from sim.core.schedulers.base import Scheduler, SchedulerConfig, StepPlan


class FixedConfig(SchedulerConfig):
    """Settings of fixed (static) batching."""

    kind: Literal["fixed"] = "fixed"


class FixedBatching(Scheduler):
    """A group of up to max_num_seqs runs to completion before the next one starts."""

    kind = "fixed"
    steady_decodes_only = True

    def _schedule(self, plan: StepPlan, now_s: float) -> None:
        if self.running:  # the group decodes until its last member is done
            self._schedule_decodes(plan)
            return
        while self.waiting and len(self.running) < self.config.max_num_seqs:  # next group, FCFS
            head = self.waiting[0]
            n = self._try_admit(head, now_s, left=1 << 62)  # whole prefills, no token budget
            if n == 0:
                break
            if n is not None:
                self._add(plan, head, n)
