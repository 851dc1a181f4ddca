"""Request state: two counters (tokens that exist, tokens whose KV is computed), no phase flags.

tokens that exist = prompt_tokens + output_tokens; computed_tokens = tokens whose KV is cached.
Prefill, chunked prefill, decode and recompute after preemption are all "compute some of
`tokens_to_compute`"; an iteration that computes all of them yields one new output token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Status(str, Enum):
    """Where a request is in its life: waiting, running, or gone (finished, rejected, cancelled, failed)."""
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    REJECTED = "rejected"
    CANCELLED = "cancelled"
    FAILED = "failed"


# The members as module globals, for hot paths: `Status.X` goes through EnumType's __getattr__ hook on every
# access in CPython 3.11 (~60 ns; a global is ~10 ns).
WAITING, RUNNING, FINISHED = Status.WAITING, Status.RUNNING, Status.FINISHED
REJECTED, CANCELLED, FAILED = Status.REJECTED, Status.CANCELLED, Status.FAILED


@dataclass(slots=True, eq=False)
class Request:
    """One request's state as it moves through the engine: token counters, KV blocks, timestamps, outcome."""
    rid: int
    arrival_s: float
    """Scheduled arrival: every latency counts from here, including waits outside the engine."""
    prompt_tokens: int
    max_output_tokens: int
    engine_arrival_s: float
    """When the request reaches the engine (>= arrival_s; later on a retry or an outside wait)."""
    deadline_s: float | None = None
    """End-to-end deadline, relative to arrival_s."""
    cancel_at_s: float | None = None
    output_tokens: int = 0
    computed_tokens: int = 0
    cached_tokens: int = 0
    hit_key: int | None = None
    """The last block of its prefix-cache hits (set with cached_tokens): requests with the same one share them."""
    status: Status = Status.WAITING
    admitted_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    finish_s: float | None = None
    max_itl_s: float = 0.0
    last_iteration: int | None = None
    """Index of the iteration that produced the latest output token (for pooled ITL bookkeeping)."""
    preemptions: int = 0
    recomputed_tokens: int = 0
    recompute_upto: int = 0
    """After a preemption, tokens below this count had KV before and are recomputed."""
    block_table: list = field(default_factory=list)
    """Physical block ids holding this request's KV, in token order."""
    block_hashes: list = field(default_factory=list)
    """Chain hashes of its full blocks, computed lazily by the block manager."""
    tail_shared: bool = False
    """Branches forked from it share blocks past its indexed prefix (their references count)."""
    indexed_blocks: int = 0
    """Leading blocks of block_table already offered to the prefix index."""
    hash_all: bool = False
    """The block manager hashes every full block of it as it fills (prefix_index all): it may meet
    blocks of an earlier request with its id (preempted, swapped, retried; see sim.core.kv)."""
    full_blocks: int = 0
    """Leading blocks of block_table full of computed KV as last registered, when past indexed_blocks
    (prefix_index all: private blocks, cached unhashed when released; see sim.core.kv)."""
    segments: tuple = ()
    """Token identity of the prompt: ((stream id, first token, length), ...); see sim.core.kv."""
    shareable_tokens: int | None = None
    """Leading tokens whose content another request may share (only their blocks are indexed); None: all of them."""
    held_blocks: int = 0
    """Blocks held in a counting KV pool (sim.core.kv_count; block_table stays empty there)."""
    swapped_blocks: int = 0
    """Blocks held in the host tier while swapped out (0 when not swapped)."""
    remote_kv_tokens: int = 0
    """Disaggregated serving: tokens whose KV a prefill pool computed and sent here; admission
    allocates blocks for them without computing them (0 once admitted, and in aggregated runs)."""
    first_token_on_admit: bool = False
    """Disaggregated serving: its first token, computed by a prefill pool, reaches the client when a decode
    replica admits it (DisaggregationConfig.first_token decode_admission)."""
    admit_seq: int | None = None
    """Position in the running order (admission order; a re-admitted request goes to the back)."""
    planned_iter: int | None = None
    """Last iteration that scheduled this request explicitly."""
    base_iter: int | None = None
    """In the lazy decode set: counters are exact as of the start of this iteration."""
    lazy_version: int = 0
    """Bumped whenever the request joins or leaves the decode set (invalidates heap entries)."""
    queued_blocks: int = 0
    """Blocks it would reserve, counted in the waiting queue's KV demand."""
    kv_waited: bool = False
    """Its admission was held back at least once because KV blocks were short."""
    adapter: int | None = None
    """LoRA adapter id (None: the base model). KV is only shared between requests of one adapter."""
    accept_rates: object = None
    """Speculative decoding: this request's conditional acceptance per draft position (numpy)."""
    draft_len: int = 0
    replica: int | None = None
    """Replica serving it (cluster runs)."""
    avoid: tuple = ()
    """Replicas that failed it; the router does not send it there again."""
    attempt: int = 1
    correct: bool | None = None
    reject_reason: str | None = None

    @property
    def tokens_to_compute(self) -> int:
        return self.prompt_tokens + self.output_tokens - self.computed_tokens

    @property
    def in_prefill(self) -> bool:
        """Still computing prompt (or recomputing prompt + outputs): no output would follow 1 token."""
        return self.tokens_to_compute > 1 or self.output_tokens == 0

    def reset_for_retry(self) -> None:
        """Lost with a failed replica: start over elsewhere (latency still counts from arrival_s)."""
        self.status = Status.WAITING
        self.output_tokens = self.computed_tokens = self.cached_tokens = 0
        self.hit_key = None
        self.block_table, self.block_hashes, self.indexed_blocks, self.full_blocks = [], [], 0, 0
        self.first_token_s = self.last_token_s = None
        self.max_itl_s, self.last_iteration, self.replica = 0.0, None, None
        self.recompute_upto = self.swapped_blocks = self.held_blocks = 0
        self.accept_rates = None
        self.hash_all = True

    @property
    def num_blocks(self) -> int:
        return len(self.block_table) + self.held_blocks

    @property
    def done(self) -> bool:
        return self.output_tokens >= self.max_output_tokens


_new = object.__new__


def arriving(rid: int, arrival_s: float, prompt_tokens: int, max_output_tokens: int, engine_arrival_s: float,
             deadline_s: float | None, cancel_at_s: float | None, segments: tuple, shareable_tokens: int | None,
             adapter: int | None) -> Request:
    """Request(rid, arrival_s, prompt_tokens, max_output_tokens, engine_arrival_s, deadline_s=.., cancel_at_s=..,
    segments=.., shareable_tokens=.., adapter=..): a workload row arriving, every other field at its default, made
    in half the time (no keyword matching over the dataclass's fields: a run makes one per request).
    tests/sim/test_request.py checks it against the constructor field by field."""
    r = _new(Request)
    r.rid = rid
    r.arrival_s = arrival_s
    r.prompt_tokens = prompt_tokens
    r.max_output_tokens = max_output_tokens
    r.engine_arrival_s = engine_arrival_s
    r.deadline_s = deadline_s
    r.cancel_at_s = cancel_at_s
    r.segments = segments
    r.shareable_tokens = shareable_tokens
    r.adapter = adapter
    r.output_tokens = r.computed_tokens = r.cached_tokens = r.preemptions = r.recomputed_tokens = 0
    r.recompute_upto = r.indexed_blocks = r.full_blocks = r.held_blocks = r.swapped_blocks = 0
    r.remote_kv_tokens = r.lazy_version = r.queued_blocks = r.draft_len = 0
    r.hit_key = r.admitted_s = r.first_token_s = r.last_token_s = r.finish_s = r.last_iteration = None
    r.admit_seq = r.planned_iter = r.base_iter = r.accept_rates = r.replica = r.correct = r.reject_reason = None
    r.status = WAITING
    r.max_itl_s = 0.0
    r.block_table = []
    r.block_hashes = []
    r.tail_shared = r.hash_all = r.first_token_on_admit = r.kv_waited = False
    r.avoid = ()
    r.attempt = 1
    return r
