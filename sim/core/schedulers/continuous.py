"""Continuous (iteration-level) batching: running decodes every iteration, FCFS admission of whole
prefills while max_num_seqs, the token budget max_num_batched_tokens and KV allow."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from sim.core.schedulers.base import Scheduler, SchedulerConfig, StepPlan, check_budget_holds_decodes
from sim.core.schedulers.speculation import SpeculativeConfig


class ContinuousConfig(SchedulerConfig):
    """Settings of continuous batching."""

    kind: Literal["continuous"] = "continuous"
    max_num_batched_tokens: PositiveInt = Field(16384, description="Token budget per iteration (whole prefills)")
    speculative: SpeculativeConfig | None = Field(None, description="Speculative decoding for running decodes")

    @model_validator(mode="after")
    def _budget_holds_decodes(self):
        check_budget_holds_decodes(self)
        return self


class ContinuousBatching(Scheduler):
    """Decodes every iteration; whole prefills admitted FCFS while budget and KV allow."""

    kind = "continuous"
    steady_decodes_only = True

    def _refusal(self, req) -> str | None:
        budget = self.config.max_num_batched_tokens
        if req.prompt_tokens > budget:  # a whole prefill must fit one iteration (vLLM refuses it too)
            return (f"scheduler: prompt of {req.prompt_tokens} tokens exceeds max_num_batched_tokens ({budget}); "
                    "use chunked prefill or a larger budget")
        return None

    def _schedule(self, plan: StepPlan, now_s: float) -> None:
        budget = self.config.max_num_batched_tokens
        self._schedule_decodes(plan)  # running requests first
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            head = self.waiting[0]
            n = self._try_admit(head, now_s, budget - plan.new_tokens)  # whole prefill (after cache hits)
            if n is None:
                continue  # rejected by admission control
            if n == 0:
                break
            self._add(plan, head, n)
