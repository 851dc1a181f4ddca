"""Scheduler mechanics shared by every policy: queues, KV admission, budgets, plan and commit.

State model (read once here, not in each policy):
- A Request carries two counters: tokens that exist (prompt + outputs) and computed_tokens.
  A policy only decides how many of `tokens_to_compute` each request gets this iteration.
- `plan(now_s)` picks the work of one iteration and reserves KV for it (asking the block pool
  with can_* before mutating); it returns a StepPlan or None when there is nothing to run.
- `commit(plan, now_s)` applies the outcome once the iteration's time has passed: counters move, a request whose
  tokens are all computed emits one output token, finished and cancelled requests free their blocks. Freeing at
  commit is the deferred free of reference section 3: blocks read by the in-flight iteration are released only then.
- `running` is in admission order; on_demand preemption takes the most recently admitted
  request not yet scheduled in this iteration (recompute), as vLLM does.

The decode set. A running request whose prompt is computed decodes exactly one token in every iteration until it
finishes, is preempted or is cancelled (every policy schedules running decodes first and the token budget is at least
max_num_seqs). Rather than touching each of them every iteration, the scheduler keeps them in a *decode set* advanced
lazily: a member's counters are exact as of `base_iter` and move by one per iteration; batch aggregates (sequences, KV
tokens read, pairs) are kept as running sums; heaps say when a member finishes or needs its next KV block. Members are
materialised only when something happens to them, so an iteration costs O(events) instead of O(batch). With
`lazy_decode=False` every member is stepped explicitly; both give byte-identical results (test_fast_decode.py).
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Callable, ClassVar, Literal

from sim.core.kv import BlockManager
from sim.core.step import Outcome, StepPlan, join_hits, leave_hits
from sim.core.request import CANCELLED, FINISHED, RUNNING, Request, Status
from sim.core.schedulers.config import SchedulerConfig, check_budget_holds_decodes  # noqa: F401 (re-exported)
from sim.core.schedulers.steady import linear_terms, steady_linear


class Scheduler:
    """Base of all policies. Subclasses implement `_schedule(plan, now_s)` and set `kind`."""

    kind: ClassVar[str]
    steady_decodes_only: ClassVar[bool] = False
    """True when `_schedule` plans nothing but the decode set while no request waits and every
    running request decodes (then stretches of such iterations may be fast-forwarded)."""

    def __init__(self, config: SchedulerConfig, pool: BlockManager, kv_admission: Literal["reserve", "on_demand"],
                 deadline_check: Callable[[Request, float], bool] | None = None, lazy_decode: bool = True,
                 preemption: Literal["recompute", "swap"] = "recompute"):
        self.config, self.pool = config, pool
        self.kv_admission, self.deadline_check = kv_admission, deadline_check
        self.lazy = lazy_decode
        self.preemption = preemption
        self.speculator = None            # set by the simulation when the config asks for speculation
        self.now_s = 0.0
        self.waiting: deque[Request] = deque()
        self.running: dict[int, Request] = {}
        self._explicit: dict[int, Request] = {}  # running requests outside the decode set, running order
        self.dropped: list[Request] = []  # rejected or cancelled since the last drain
        self.iteration = 0                # index of the next iteration to plan
        self.timeline = None              # set by the simulation: end_s(i), durations(a, b)
        self._cancelled_in_flight: list[Request] = []
        self._admit_counter = 0
        self._waiting_blocks = 0
        self.kv_demand_peak_blocks = 0
        """Most blocks held plus wanted by the waiting queue, seen when admission waited for KV."""
        # decode set (lazy mode)
        self.decoding: dict[int, Request] = {}
        self._dec_computed = 0            # sum of members' computed tokens as of `iteration`
        self._dec_shared = 0              # members' hit tokens re-read by another member (StepPlan.shared_kv_tokens)
        self._dec_hits: dict = {}         # hit_key -> [members, hit tokens]
        self._dec_hit_tokens = 0          # members' hit tokens, all of them (StepPlan.hit_kv_tokens)
        self._dec_adapters: dict[int, int] = {}  # LoRA adapter -> members using it
        self._pending_decoders: list[Request] = []  # decode-ready but not yet in the set (see commit)
        self._preempted = False           # vLLM V1: no admissions in an iteration that preempted
        self._finish_heap: list = []      # (iteration of last token, admit_seq, version, request)
        self._block_heap: list = []       # (iteration needing the next block, admit_seq, version, request)
        self._ctx_heap: list = []         # (-(computed - base_iter), admit_seq, version, request)

    # ---- arrivals, cancellation -----------------------------------------------------------
    def admit(self, req: Request, now_s: float) -> None:
        """Queue an arriving request (admission into the batch happens in plan)."""
        if req.status is CANCELLED:  # the client gave up while it waited at this replica's door
            self.dropped.append(req)
            return
        pool = self.pool
        reserve = req.prompt_tokens + req.max_output_tokens - 1  # (_reserve_tokens)
        if (blocks := -(-reserve // pool.block_tokens)) > pool.num_blocks:  # (pool.blocks_for)
            self._reject(req, "kv: request needs more blocks than the whole pool")
            return
        refusal = None if req.remote_kv_tokens else self._refusal(req)  # KV sent by a prefill pool: no prefill here
        if refusal:
            self._reject(req, refusal)
            return
        req.queued_blocks = blocks - len(pool.match(req)) if pool.prefix_caching else blocks  # (_enqueue, inline)
        self._waiting_blocks += req.queued_blocks
        self.waiting.append(req)

    def _refusal(self, req: Request) -> str | None:
        """A policy's reason to refuse a request at the door (None: accept)."""
        return None

    def cancel(self, req: Request, now_s: float) -> None:
        """Stop scheduling `req`; its blocks are freed at the next commit (after in-flight work)."""
        if req.status in (Status.FINISHED, Status.REJECTED, Status.CANCELLED, Status.FAILED):
            return  # (a failed request's replica index may now hold a fresh incarnation: not its pool)
        if req.status is Status.WAITING and req in self.waiting:
            self._unqueue(req)
            req.status = Status.CANCELLED
            req.finish_s = now_s
            if req.swapped_blocks:
                self.pool.host_used_blocks -= req.swapped_blocks
                req.swapped_blocks = 0
            self.dropped.append(req)
            return
        req.status = Status.CANCELLED
        if req.rid not in self.running and req not in self.waiting:  # still in the inbox: `admit` drops it
            req.finish_s = now_s
            return
        self._cancelled_in_flight.append(req)

    def _enqueue(self, req: Request, front: bool = False, blocks: int | None = None) -> None:
        """Waiting queue with a running sum of what its requests would reserve (`blocks`, when known)
        less the prefix blocks already cached: what it would add if admitted now (for KV demand)."""
        pool = self.pool
        blocks = pool.blocks_for(self._reserve_tokens(req)) if blocks is None else blocks
        req.queued_blocks = blocks - len(pool.match(req)) if pool.prefix_caching else blocks  # (nothing to match)
        self._waiting_blocks += req.queued_blocks
        if front:
            self.waiting.appendleft(req)
        else:
            self.waiting.append(req)

    def _unqueue(self, req: Request) -> None:
        if self.waiting and self.waiting[0] is req:
            self.waiting.popleft()
        else:
            self.waiting.remove(req)
        self._waiting_blocks -= req.queued_blocks

    def _reject(self, req: Request, reason: str) -> None:
        req.status = Status.REJECTED
        req.reject_reason = reason
        self.dropped.append(req)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- planning -------------------------------------------------------------------------
    def plan(self, now_s: float) -> StepPlan | None:
        """The next iteration's work (KV reserved for it), or None when there is nothing to run."""
        plan = StepPlan()
        self.now_s = now_s
        self._plan = plan
        self._preempted = False
        self._schedule(plan, now_s)
        if not plan.num_seqs:  # (plan.is_empty)
            dropped = len(self.dropped)
            self._reject_stuck()
            if self.running and len(self.dropped) == dropped:
                raise RuntimeError(f"scheduler {self.kind!r} planned nothing with {len(self.running)} running and "
                                   f"{len(self.waiting)} waiting requests: a policy bug, please report it")
            return None
        return plan.freeze()

    def _schedule(self, plan: StepPlan, now_s: float) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _add(self, plan: StepPlan, req: Request, n: int, drafts: int = 0) -> None:
        req.planned_iter = self.iteration
        plan.add(req, n, drafts)

    def _prefilling(self) -> list[Request]:
        """Running requests still computing prompt (or recomputing), in running order."""
        return [r for r in self._explicit.values() if r.in_prefill]

    def _schedule_decodes(self, plan: StepPlan) -> None:
        """Every running decode gets its next token (running order); on_demand KV grows first."""
        if not self.lazy:
            spec = self.speculator
            budget = getattr(self.config, "max_num_batched_tokens", 1 << 62)
            for req in [r for r in self.running.values() if not r.in_prefill]:
                k = spec.drafts_for(req) if spec is not None else 0
                k = max(0, min(k, budget - plan.new_tokens - 1))  # drafts count against the token budget
                if req.rid in self.running and self._ensure_kv(req, 1 + k, plan):  # lookahead KV for drafts
                    self._add(plan, req, 1 + k, k)
            if plan.spec_items:
                plan.draft_s = spec.draft_s([k for _, k in plan.spec_items])
                plan.draft_overlapped = spec.overlapped
            return
        i = self.iteration
        if self.kv_admission == "on_demand":
            heap = self._block_heap
            while heap and heap[0][0] <= i:
                _, _, version, req = heapq.heappop(heap)
                if version != req.lazy_version:
                    continue
                need = req.computed_tokens + (i - req.base_iter) + 1
                while not self.pool.can_allocate(req, need):
                    victim = next(reversed(self.running.values()))
                    self._preempt(victim)
                    if victim is req:
                        break
                if req.rid in self.decoding:
                    self.pool.allocate(req, need, now_s=self.now_s)
                    heapq.heappush(heap, (i + self.pool.block_tokens, req.admit_seq, version, req))
        if self._pending_decoders:  # a recompute chunk that stopped one token short: its next token
            pending, self._pending_decoders = self._pending_decoders, []
            for req in pending:
                if req.rid in self.running and req.rid not in self.decoding and not req.in_prefill:
                    if self._ensure_kv(req, 1, plan):
                        self._add(plan, req, 1)
        if self._dec_adapters:
            plan.adapters = {*plan.adapters, *self._dec_adapters}
        if self.decoding:
            ctx = self._ctx_heap
            while (top := ctx[0])[2] != top[3].lazy_version:
                heapq.heappop(ctx)
            plan.add_decodes(len(self.decoding), self._dec_computed, i + 1 - top[0], self._dec_shared,
                             self._dec_hits, self._dec_hit_tokens)

    def _reserve_tokens(self, req: Request) -> int:
        """Tokens whose KV must be held: everything up to the last output (which is never stored)."""
        return req.prompt_tokens + req.max_output_tokens - 1

    def _first_chunk(self, tokens_to_compute: int, left: int) -> int:
        """Tokens an admitted request computes in its first iteration (0: it does not fit `left`).
        Whole prefills by default; chunked prefill overrides this."""
        return tokens_to_compute if tokens_to_compute <= left else 0

    def _try_admit(self, req: Request, now_s: float, left: int) -> int | None:
        """Admit the head of the waiting queue if the token budget `left` and KV allow.

        Reuses cached prefix blocks (they count as computed, so only the rest is prefilled) and
        brings a swapped-out request back from host memory. Returns the tokens it computes this
        iteration, 0 when it must wait, None when it was rejected (and dropped from the queue).
        """
        if self._preempted:  # as vLLM V1: an iteration that had to preempt admits nobody
            return 0
        if self.deadline_check is not None and not self.deadline_check(req, now_s):
            self._unqueue(req)
            self._reject(req, "deadline: cannot finish in time")
            return None
        pool = self.pool
        swapped = req.swapped_blocks > 0
        carried = swapped or req.remote_kv_tokens > 0  # its KV exists elsewhere: the host tier, or a prefill pool
        hits = pool.match(req) if pool.prefix_caching and not carried else []  # (nothing to match without caching)
        computed = req.computed_tokens if carried else len(hits) * pool.block_tokens
        n = self._first_chunk(req.prompt_tokens + req.output_tokens - computed, left)
        if n <= 0:
            return 0
        need = req.prompt_tokens + req.max_output_tokens - 1 if self.kv_admission == "reserve" else computed + n
        if not pool.can_allocate(req, need, hits):  # (need: _reserve_tokens, or what this chunk takes)
            if not req.kv_waited:
                req.kv_waited = True
                demand = pool.used_blocks + self._waiting_blocks
                self.kv_demand_peak_blocks = max(self.kv_demand_peak_blocks, demand)
            return 0
        pool.allocate(req, need, hits, now_s)
        self.waiting.popleft()  # (_unqueue of the head)
        self._waiting_blocks -= req.queued_blocks
        if swapped:
            self._plan.swap_bytes += pool.swap_in(req)
        elif req.remote_kv_tokens:
            req.remote_kv_tokens = 0  # the transferred KV now lives in the blocks just allocated
            if req.first_token_on_admit:  # its first token came with the KV: streamed now
                req.first_token_s = req.last_token_s = now_s
        else:
            req.computed_tokens = computed
            if req.admitted_s is None:
                req.cached_tokens = computed
                req.hit_key = hits[-1] if hits else None
                pool.stats.hit_tokens += computed
        req.status = RUNNING
        if req.admitted_s is None:
            req.admitted_s = now_s
        req.admit_seq = self._admit_counter
        self._admit_counter += 1
        self.running[req.rid] = req
        self._explicit[req.rid] = req
        return n

    def _ensure_kv(self, req: Request, n: int, plan: StepPlan) -> bool:
        """on_demand: grow `req` to hold computed + n tokens, preempting the newest running request
        not yet scheduled this iteration (by recompute) while blocks are short. False when `req`
        itself was preempted."""
        if self.kv_admission == "reserve":
            return True
        need = req.computed_tokens + n
        i = self.iteration
        while not self.pool.can_allocate(req, need):
            victim = next((r for r in reversed(self._explicit.values()) if r.planned_iter != i), None)
            if victim is None:
                return False
            self._preempt(victim)
            if victim is req:
                return False
        self.pool.allocate(req, need, now_s=self.now_s)
        return True

    def _preempt(self, req: Request) -> None:
        """Free `req`'s GPU blocks: swap them to host memory (preemption: swap, when the host tier
        has room) or drop them and recompute later; it goes back to the head of the queue."""
        if req.rid in self.decoding:
            self._leave_decode(req)
        del self.running[req.rid]
        self._explicit.pop(req.rid, None)
        if self.preemption == "swap" and self.pool.can_swap_out(req):
            self._plan.swap_bytes += self.pool.swap_out(req, self.now_s)
        else:
            self.pool.register(req, req.computed_tokens, self.now_s, own_reuse=True)
            self.pool.free(req, self.now_s)
            req.recompute_upto = max(req.recompute_upto, req.computed_tokens)
            req.computed_tokens = 0
        req.preemptions += 1
        req.status = Status.WAITING
        self._enqueue(req, front=True)
        self._preempted = True

    def _reject_stuck(self) -> None:
        """Nothing runs yet the head of the queue cannot start: it never will. Reject it."""
        if not self.running and self.waiting:
            req = self.waiting[0]
            self._unqueue(req)
            budget = getattr(self.config, "max_num_batched_tokens", None)
            if budget is not None and req.tokens_to_compute > budget and self.kind == "continuous":
                self._reject(req, f"scheduler: {req.tokens_to_compute} tokens to recompute exceed "
                                  f"max_num_batched_tokens ({budget})")
            elif self.pool.blocks_for(self._kv_tokens_to_start(req)) > self.pool.free_blocks:
                self._reject(req, "kv: does not fit the free pool even with nothing running")
            else:   # the KV is there: the policy cannot start it (a token budget, a chunk rule), not memory
                self._reject(req, f"scheduler: {self.kind} cannot start it even with nothing running "
                                  f"({req.tokens_to_compute} tokens to compute)")

    def _kv_tokens_to_start(self, req: Request) -> int:
        """Tokens whose KV admission needs free: all it may hold (reserve), or its prompt (on_demand)."""
        return self._reserve_tokens(req) if self.kv_admission == "reserve" else req.prompt_tokens + req.output_tokens

    # ---- parallel sampling ----------------------------------------------------------------
    def can_fork(self, follower: Request, leader: Request) -> bool:
        """Can `follower` start as a branch of `leader`, whose prompt was just prefilled?"""
        shared = leader.prompt_tokens // self.pool.block_tokens
        tail = 1 if leader.prompt_tokens % self.pool.block_tokens else 0
        if leader.rid not in self.running or len(self.running) >= self.config.max_num_seqs:
            return False
        if self.kv_admission == "reserve":
            need = self.pool.blocks_for(self._reserve_tokens(follower)) - shared
        else:
            need = tail
        return need <= self.pool.free_blocks

    def fork(self, follower: Request, leader: Request, now_s: float) -> None:
        """Start `follower` as a branch of `leader`: it shares every full prompt block, gets its
        own copy of a partly filled tail block (copy-on-write: each branch writes its own next
        token there) and its first token, sampled from the same logits as the leader's."""
        bs = self.pool.block_tokens
        shared = leader.block_table[:leader.prompt_tokens // bs]
        if len(shared) > leader.indexed_blocks:
            self.pool.share_tail(leader)
        self.pool.allocate(follower, len(shared) * bs, hits=shared, now_s=now_s)
        tokens = self._reserve_tokens(follower) if self.kv_admission == "reserve" else leader.prompt_tokens
        self.pool.allocate(follower, tokens, now_s=now_s)
        self.pool.stats.cow_copies += 1 if leader.prompt_tokens % bs else 0
        follower.computed_tokens = follower.prompt_tokens
        follower.cached_tokens = len(shared) * bs
        follower.hit_key = shared[-1] if shared else None
        follower.output_tokens = 1
        follower.status = Status.RUNNING
        follower.admitted_s = follower.first_token_s = follower.last_token_s = now_s
        follower.last_iteration = self.iteration - 1
        follower.admit_seq = self._admit_counter
        self._admit_counter += 1
        self.running[follower.rid] = follower
        self._explicit[follower.rid] = follower
        if follower.done:
            self._finish(follower, now_s)
        elif self.lazy:
            self._join_decode(follower, self.iteration)

    # ---- the decode set -------------------------------------------------------------------
    def _join_decode(self, req: Request, i: int) -> None:
        """`req` decodes from iteration i on; its counters are exact now."""
        req.base_iter = i
        req.lazy_version += 1
        v, seq = req.lazy_version, req.admit_seq
        self.decoding[req.rid] = req
        self._explicit.pop(req.rid, None)
        self._dec_computed += req.computed_tokens
        if req.cached_tokens and req.hit_key is not None:
            self._dec_shared += join_hits(self._dec_hits, req)
            self._dec_hit_tokens += req.cached_tokens
        if req.adapter is not None:
            self._dec_adapters[req.adapter] = self._dec_adapters.get(req.adapter, 0) + 1
        heapq.heappush(self._finish_heap, (i + req.max_output_tokens - req.output_tokens - 1, seq, v, req))
        heapq.heappush(self._ctx_heap, (-(req.computed_tokens - i), seq, v, req))
        if self.kv_admission == "on_demand":
            heapq.heappush(self._block_heap, (i + req.num_blocks * self.pool.block_tokens - req.computed_tokens,
                                              seq, v, req))

    def _leave_decode(self, req: Request, i: int | None = None) -> None:
        """`req` leaves the decode set at the start of iteration i (its counters and token times brought up to it)."""
        if i is None:
            i = self.iteration
        if (d := i - req.base_iter) > 0:
            req.computed_tokens += d
            req.output_tokens += d
            req.last_token_s = self.timeline.end_s(i - 1)
            req.last_iteration = i - 1
            self.timeline.decode_gaps(req, req.base_iter, i - 1)
        req.base_iter = i
        del self.decoding[req.rid]
        self._dec_computed -= req.computed_tokens
        if req.cached_tokens and req.hit_key is not None:
            self._dec_shared -= leave_hits(self._dec_hits, req)
            self._dec_hit_tokens -= req.cached_tokens
        if req.adapter is not None:
            left = self._dec_adapters[req.adapter] - 1
            if left:
                self._dec_adapters[req.adapter] = left
            else:
                del self._dec_adapters[req.adapter]
        req.lazy_version += 1
        if len(self._ctx_heap) > 2 * len(self.decoding) + 64:  # mostly left members' entries: the live ones only
            self._ctx_heap = [e for e in self._ctx_heap if e[2] == e[3].lazy_version]
            heapq.heapify(self._ctx_heap)

    # ---- fast-forward ---------------------------------------------------------------------
    def steady_iterations(self, plan: StepPlan) -> int:
        """How many iterations, starting with the one `plan` describes, commit nothing but one token
        for every decode-set member, if no event (arrival, cancellation, fault) comes first: the
        batch stays the same, each iteration one token longer, until a member finishes or (on_demand)
        needs its next block. 0 when anything else is going on."""
        if (not self.steady_decodes_only or not self.lazy or self.speculator is not None or plan.items
                or plan.lazy_decodes != plan.num_seqs or plan.swap_bytes or self.waiting or self._explicit
                or self._cancelled_in_flight or self._pending_decoders or self.dropped or not self.decoding):
            return 0
        i = self.iteration
        heap = self._finish_heap
        while heap[0][2] != heap[0][3].lazy_version:  # stale entries (commit skips them too)
            heapq.heappop(heap)
        m = heap[0][0] - i  # iterations i .. top - 1 finish nobody
        if self.kv_admission == "on_demand":
            heap = self._block_heap
            while heap and heap[0][2] != heap[0][3].lazy_version:
                heapq.heappop(heap)
            if heap:  # the plan of iteration top allocates: iterations up to top - 1 are planned here
                m = min(m, heap[0][0] - i - 1)
        return max(m, 0)

    def fast_forward(self, plan: StepPlan, start_s: float, step_s: float, horizon_s: float,
                     step_time: Callable[[StepPlan], float], timeline, blocks: tuple) -> tuple[float, float]:
        """Commit the steady iterations (see `steady_iterations`) that end before `horizon_s`, the
        next event of the run, without the event loop; exactly what plan/commit would have done,
        iteration by iteration (same floats, same rows). `plan` becomes the next iteration's plan;
        returns its start and step time. Nothing happens when the stretch is empty."""
        m = self.steady_iterations(plan)
        if m <= 0:
            return start_s, step_s
        plan = plan.thawed()   # this scheduler's own plan becomes the next steady iteration's, in place
        count = plan.lazy_decodes
        first, durations, ends, busy = start_s, [], [], timeline.busy_s
        linear = linear_terms(step_time, plan)
        if linear is not None:  # LinearModel.step_s inlined on local counters: the same products, in the same order
            start_s, step_s, k, busy = steady_linear(linear, plan, count, m, start_s, step_s, horizon_s, durations, ends,
                                                     busy)
            m = 0 if k else m
        while m > 0:
            end_s = start_s + step_s
            if not end_s < horizon_s:
                break
            d = end_s - start_s
            durations.append(d)
            ends.append(end_s)
            busy += d
            plan.pairs += count
            plan.kv_tokens_read += count
            plan.decode_kv_tokens += count
            plan.decode_pairs += count
            plan.max_context += 1
            step_s = step_time(plan)
            start_s = end_s
            m -= 1
        plan.freeze()
        if ends:
            k = len(ends)
            timeline.on_steady_iterations(first, durations, ends, plan, blocks, count, busy)
            self.iteration += k
            self._dec_computed += k * count
            self.now_s = ends[-1]
        return start_s, step_s

    # ---- committing -----------------------------------------------------------------------
    def commit(self, plan: StepPlan, now_s: float) -> Outcome:
        """Apply the iteration's outcome (its timing is already on the timeline)."""
        i = self.iteration
        self.now_s = now_s
        finished_decodes: list[Request] = []
        decode_tokens = 0
        cancelled = self._cancelled_in_flight
        if self.lazy:
            decoding = self.decoding
            for req in cancelled:  # their token of this iteration is discarded
                if req.rid in decoding:
                    self._leave_decode(req, i)
            decode_tokens = len(decoding)
            self._dec_computed += decode_tokens
            heap = self._finish_heap
            while heap and heap[0][0] <= i:
                _, _, version, req = heapq.heappop(heap)
                if version != req.lazy_version:
                    continue
                self._leave_decode(req, i + 1)
                finished_decodes.append(req)
        emitted = []
        extra_tokens = 0
        accepted = None
        if plan.spec_items:
            live = [(r, k) for r, k in plan.spec_items if r.status is not CANCELLED]
            if live:
                counts = self.speculator.sample([r for r, _ in live], [k for _, k in live])
                accepted = {r.rid: int(a) for (r, _), a in zip(live, counts)}
        for req, n, _h in plan.items:
            if req.status is CANCELLED:
                continue
            if accepted and req.rid in accepted:  # a speculative round: accepted drafts + the target's own token
                a = accepted[req.rid]
                req.computed_tokens += a + 1
                req.output_tokens += a + 1
                extra_tokens += a
                emitted.append(req)
                continue
            before = req.computed_tokens
            req.computed_tokens = computed = before + n
            if req.recompute_upto > before:
                req.recomputed_tokens += min(computed, req.recompute_upto) - before
            if before < req.prompt_tokens and self.pool.prefix_caching:  # (register indexes nothing without)
                self.pool.register(req, min(computed, req.prompt_tokens), now_s)
            if computed == req.prompt_tokens + req.output_tokens:
                req.output_tokens += 1
                emitted.append(req)
            elif self.lazy and req.output_tokens and not req.in_prefill:
                self._pending_decoders.append(req)
        for req in finished_decodes:
            self._finish(req, now_s)
        for req in emitted:
            if req.output_tokens >= req.max_output_tokens:  # (req.done)
                self._finish(req, now_s)
            elif self.lazy:
                self._join_decode(req, i + 1)
        for req in cancelled:
            req.finish_s = now_s
            if req.rid in self.running:
                del self.running[req.rid]
                self._explicit.pop(req.rid, None)
            elif req in self.waiting:
                self._unqueue(req)
            self.pool.register(req, req.computed_tokens, now_s)
            self.pool.free(req, now_s)
            self.dropped.append(req)
        if cancelled:
            cancelled.clear()
        self.iteration = i + 1
        return Outcome(emitted, finished_decodes, decode_tokens, decode_tokens + len(emitted) + extra_tokens)

    def _finish(self, req: Request, now_s: float) -> None:
        req.status = FINISHED
        req.finish_s = now_s
        del self.running[req.rid]
        self._explicit.pop(req.rid, None)
        pool = self.pool
        if pool.prefix_caching:  # (register indexes nothing without caching)
            pool.register(req, req.computed_tokens, now_s)  # its outputs too: a next turn may reuse them
        pool.free(req, now_s)
