"""vllm_v1: chunked prefill with the rules of vLLM V1's scheduler (vllm/v1/core/sched/scheduler.py and
kv_cache_manager.py of vLLM 0.32.0), where they differ from capsim's `chunked` policy:

1. Running requests are served in admission order, decodes and partial prefills alike: each takes
   min(tokens it still has to compute, budget left) (capped at long_prefill_token_threshold when
   that is set and more than one request is eligible), so an early long prefill can use up the
   budget before a later request's decode (`chunked` serves every decode first).
2. A waiting request is admitted only when the free KV blocks hold its WHOLE sequence (prompt, and
   outputs so far when resumed), net of its prefix-cache hits: vLLM's
   `scheduler_reserve_full_isl=True` (`full_sequence_must_fit` in allocate_slots); only the first
   chunk's blocks are allocated. `chunked` with on_demand admission checks the first chunk only.
3. One block of the pool is vLLM's null block (block_pool.null_block) and never holds KV: the usable
   pool is num_blocks - 1.
4. A prompt chunk's full blocks enter the prefix cache when the chunk is scheduled (allocate_slots
   caches them), so a request admitted later in the same iteration already hits them; `chunked`
   indexes them when the iteration ends.
As in `chunked`: a request that cannot grow preempts the most recently admitted running request not
yet scheduled (recompute; itself last), and an iteration that preempted admits nobody; waiting
requests are admitted in order while the budget lasts and fewer than max_num_seqs run.

KV admission must be on_demand (vLLM allocates block by block). Every request is planned explicitly
(no lazy decode set): a decode may be skipped when the budget runs out, which the set cannot express.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from sim.core.request import Request
from sim.core.schedulers.base import Scheduler, SchedulerConfig, StepPlan, check_budget_holds_decodes
from sim.io.errors import ConfigError


class VllmV1Config(SchedulerConfig):
    """Settings of the vllm_v1 policy (vLLM's max_num_seqs, max_num_batched_tokens, long_prefill_token_threshold)."""

    kind: Literal["vllm_v1"] = "vllm_v1"
    max_num_batched_tokens: PositiveInt = Field(8192, description="Token budget per iteration, decodes included")
    long_prefill_token_threshold: NonNegativeInt = Field(
        0, description="Most tokens one request gets per iteration when others are eligible (0: no cap), as vLLM")

    @model_validator(mode="after")
    def _budget(self):
        check_budget_holds_decodes(self)
        return self


class VllmV1(Scheduler):
    """Chunked prefill following vLLM 0.32's V1 scheduler (see the module docstring)."""

    kind = "vllm_v1"

    def __init__(self, config: VllmV1Config, pool, kv_admission, *args, **kwargs):
        if kv_admission != "on_demand":
            raise ConfigError("scheduler.kind vllm_v1: needs kv.admission on_demand (vLLM V1 grows KV block by block)")
        super().__init__(config, pool, kv_admission, *args, **kwargs)
        self.lazy = False
        if pool.num_blocks < 2:
            raise ConfigError("scheduler.kind vllm_v1: the KV pool needs at least 2 blocks (one is vLLM's null block)")
        self.null_block = pool._take_empty(1)[0]  # block 0 (the next empty one if warm prefixes took it first),
        # as vLLM's block_pool.null_block: out of the pool for good

    def _cap(self) -> int:
        thr = self.config.long_prefill_token_threshold
        return thr if thr and len(self.running) + len(self.waiting) > 1 else 1 << 62

    def _schedule(self, plan: StepPlan, now_s: float) -> None:
        budget, cap, i = self.config.max_num_batched_tokens, self._cap(), self.iteration
        for req in list(self.running.values()):   # 1. running requests, in admission order
            left = budget - plan.new_tokens
            if left <= 0:
                break
            if req.rid not in self.running or req.planned_iter == i:
                continue
            n = min(req.tokens_to_compute, left, cap)
            if not self._ensure_kv(req, n, plan):
                break                               # vLLM: it preempted itself; nothing more runs
            self._add(plan, req, n)
        while self.waiting and len(self.running) < self.config.max_num_seqs:  # 2. waiting requests
            left = budget - plan.new_tokens
            if left <= 0:
                break
            head = self.waiting[0]
            n = self._try_admit(head, now_s, left)
            if n is None:
                continue
            if n == 0:
                break
            self._add(plan, head, n)

    def _add(self, plan: StepPlan, req: Request, n: int, drafts: int = 0) -> None:
        """As vLLM, a prompt chunk's full blocks are prefix-cache entries from the moment they are
        scheduled: a request admitted later in the same iteration hits them (each layer writes the
        batch's KV before its attention reads it). `chunked` indexes them when the iteration ends."""
        super()._add(plan, req, n, drafts)
        if req.computed_tokens < req.prompt_tokens:
            self.pool.register(req, min(req.computed_tokens + n, req.prompt_tokens), self.now_s)

    def _first_chunk(self, tokens_to_compute: int, left: int) -> int:
        return min(tokens_to_compute, left, self._cap())

    def _try_admit(self, req: Request, now_s: float, left: int) -> int | None:
        """vLLM's admission gate first: the whole sequence must fit the free blocks (net of hits)."""
        if not self._preempted and (self.deadline_check is None or self.deadline_check(req, now_s)):
            hits = self.pool.match(req)
            if not self.pool.can_allocate(req, req.prompt_tokens + req.output_tokens, hits):
                if not req.kv_waited:
                    req.kv_waited = True
                    demand = self.pool.used_blocks + self._waiting_blocks
                    self.kv_demand_peak_blocks = max(self.kv_demand_peak_blocks, demand)
                return 0
        return super()._try_admit(req, now_s, left)
