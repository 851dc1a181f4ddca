"""Chunked prefill: running decodes first, then prefill chunks of at most chunk_tokens per request
fill what is left of the iteration's token budget (decodes count against it). With
`prefill_batches: separate` (SGLang's default, without --enable-mixed-chunk) an iteration with prefill work
runs prefill chunks alone and the decodes wait for the next iteration without any; a chunk that finds no free
blocks waits rather than evict a running decode (SGLang keeps room for its decodes)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from sim.core.schedulers.base import Scheduler, SchedulerConfig, StepPlan, check_budget_holds_decodes
from sim.core.schedulers.speculation import SpeculativeConfig


class ChunkedConfig(SchedulerConfig):
    """Settings of chunked prefill."""

    kind: Literal["chunked"] = "chunked"
    max_num_batched_tokens: PositiveInt = Field(4096, description="Token budget per iteration, decodes included")
    chunk_tokens: PositiveInt = Field(2048, description="Most prefill tokens one request gets per iteration")
    speculative: SpeculativeConfig | None = Field(None, description="Speculative decoding for running decodes")
    prefill_batches: Literal["mixed", "separate"] = Field(
        "mixed", description=("mixed: decodes and prefill chunks share an iteration (vLLM; SGLang with "
                              "--enable-mixed-chunk); separate: an iteration with prefill work (a prompt under way, or a "
                              "waiting request that can be admitted) runs prefill chunks alone and the decodes wait "
                              "(SGLang's default)"))

    @model_validator(mode="after")
    def _chunk_fits(self):
        if self.chunk_tokens > self.max_num_batched_tokens:
            raise ValueError(f"scheduler.chunk_tokens ({self.chunk_tokens}) exceeds "
                             f"scheduler.max_num_batched_tokens ({self.max_num_batched_tokens})")
        check_budget_holds_decodes(self)
        return self


class ChunkedPrefill(Scheduler):
    """Decodes first, then prefill chunks in admission order within the token budget."""

    kind = "chunked"
    steady_decodes_only = True

    def __init__(self, config: ChunkedConfig, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        if config.prefill_batches == "separate":
            self.lazy = False  # the lazy decode set advances every member every iteration

    def _first_chunk(self, tokens_to_compute: int, left: int) -> int:
        return min(self.config.chunk_tokens, tokens_to_compute, left)

    def _schedule(self, plan: StepPlan, now_s: float) -> None:
        if self.config.prefill_batches == "separate":
            # SGLang keeps room for its running decodes: a prompt's chunk waits rather than evict one
            self._schedule_prefills(plan, now_s, preempt=False)
            if not plan.num_seqs:  # no prefill work could run: a decode iteration
                self._schedule_decodes(plan)
            if not plan.num_seqs:  # nothing runs without evicting: the prompts may, as in a mixed iteration
                self._schedule_prefills(plan, now_s)
            return
        self._schedule_decodes(plan)  # 1. decodes
        self._schedule_prefills(plan, now_s)

    def _schedule_prefills(self, plan: StepPlan, now_s: float, preempt: bool = True) -> None:
        budget = self.config.max_num_batched_tokens
        for req in self._prefilling():  # 2. prefills already under way, in admission order
            left = budget - plan.new_tokens
            if req.rid in self.running and left > 0:
                n = min(self.config.chunk_tokens, req.tokens_to_compute, left)
                if self._ensure_kv(req, n, plan) if preempt else self._grow_kv(req, n):
                    self._add(plan, req, n)
        while self.waiting and len(self.running) < self.config.max_num_seqs:  # 3. new requests
            left = budget - plan.new_tokens
            if left <= 0:
                break
            head = self.waiting[0]
            n = self._try_admit(head, now_s, left)
            if n is None:
                continue  # rejected by admission control
            if n == 0:
                break
            self._add(plan, head, n)

    def _grow_kv(self, req, n: int) -> bool:
        """on_demand: grow `req` to hold computed + n tokens if the pool has the blocks, evicting nobody."""
        if self.kv_admission == "reserve":
            return True
        need = req.computed_tokens + n
        if not self.pool.can_allocate(req, need):
            return False
        self.pool.allocate(req, need, now_s=self.now_s)
        return True
