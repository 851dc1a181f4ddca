"""StepPlan: one iteration's work and the batch features step-time models read; Outcome: what it produced.

Pure (no simpy): calibration builds StepPlans for measured iterations and evaluates sim.models.step_time on
them, so a fitted profile's error is the simulator's own error.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.request import Request


def join_hits(groups: dict, req: Request) -> int:
    """`req` (with prefix-cache hits) joins a decode set's hit groups (hit_key -> [members, hit tokens]);
    returns the hit tokens it re-reads each iteration (all of them when the group had a member already)."""
    g = groups.get(req.hit_key)
    if g is None:
        groups[req.hit_key] = [1, req.cached_tokens]
        return 0
    g[0] += 1
    return g[1]


def leave_hits(groups: dict, req: Request) -> int:
    """`req` leaves its hit group; returns the re-read tokens the decode set loses with it."""
    g = groups[req.hit_key]
    g[0] -= 1
    if g[0]:
        return g[1]
    del groups[req.hit_key]
    return 0


_NO_ADAPTERS = frozenset()

RANK_LOAD_FIELDS = ("prefill_tokens", "prefill_seqs", "prefill_pairs", "prefill_logits", "decode_positions",
                    "decode_seqs", "decode_kv_tokens", "decode_logits")
"""A rank's part of an iteration (StepPlan.rank_loads): these fields of the rank's own plan, in this order."""


@dataclass(slots=True)
class StepPlan:
    """One iteration's work: explicit (request, new tokens, cached tokens before) items plus the
    decode set's aggregate, and the batch features step-time models read. Its items, spec_items and adapters
    start as shared empty constants, a list or set made at their first add (most plans have none)."""

    items: list[tuple[Request, int, int]] = ()
    num_seqs: int = 0
    new_tokens: int = 0
    pairs: int = 0
    prefill_tokens: int = 0
    prefill_pairs: int = 0
    prefill_logits: int = 0
    """Prefill sequences whose prompt completes in this iteration (each samples its first token)."""
    prefill_seqs: int = 0
    decode_seqs: int = 0
    decode_kv_tokens: int = 0
    kv_tokens_read: int = 0
    shared_kv_tokens: int = 0
    """Of kv_tokens_read, those in prefix-cache hits (Request.cached_tokens, hit_key) that another sequence of
    this iteration reads too, counting every reader but the first: re-reads of blocks already in a CPU's cache
    (a profile's per_shared_kv_token_s prices them)."""
    hit_reads: dict | None = None
    """hit_key -> the most hit tokens a sequence of this iteration reads under it (for shared_kv_tokens)."""
    hit_kv_tokens: int = 0
    """Of kv_tokens_read, every one in a sequence's prefix-cache hits, first reads included (what a profile
    with shared_kv_form: hits prices at per_shared_kv_token_s)."""
    max_context: int = 0
    lazy_decodes: int = 0
    decode_positions: int = 0
    """Positions computed by decode sequences (1 each, 1 + drafts when verifying a speculative round)."""
    decode_pairs: int = 0
    decode_logits: int = 0
    spec_items: list = ()
    """(request, drafts) of this iteration's speculative rounds."""
    draft_s: float = 0.0
    """Time the draft source needs for this round (added to, or hidden behind, the verify step)."""
    draft_overlapped: bool = False
    adapters: set = _NO_ADAPTERS
    """Distinct LoRA adapters in the batch (only counted, never iterated)."""
    swap_bytes: float = 0.0
    """KV bytes moved between GPU and host memory before this iteration (swap-out and swap-in)."""
    rank_loads: tuple | None = None
    """Attention data-parallel ranks bound to their requests (sim.core.schedulers.ranked): each rank's part of the
    iteration as RANK_LOAD_FIELDS; None where the ranks share one queue (the step-time model spreads the pass evenly)."""

    def add(self, req: Request, n: int, drafts: int = 0) -> None:
        """`req` computes n positions; with `drafts`, a speculative round verifying n = 1 + drafts."""
        h = req.computed_tokens
        pairs = n * h + n * (n + 1) // 2
        if self.items:
            self.items.append((req, n, h))
        else:
            self.items = [(req, n, h)]
        if req.adapter is not None:
            if isinstance(self.adapters, set):
                self.adapters.add(req.adapter)
            else:  # (still the shared empty frozenset)
                self.adapters = {*self.adapters, req.adapter}
        self.num_seqs += 1
        self.new_tokens += n
        self.pairs += pairs
        self.kv_tokens_read += h
        s = req.cached_tokens
        if s:
            self.hit_kv_tokens += h if h < s else s
            if req.hit_key is not None:
                self._read_hits(req.hit_key, h if h < s else s)
        if h + n > self.max_context:
            self.max_context = h + n
        if drafts or (n == 1 and not req.in_prefill):
            self.decode_seqs += 1
            self.decode_kv_tokens += h
            self.decode_positions += n
            self.decode_pairs += pairs
            self.decode_logits += n
            if drafts:
                if self.spec_items:
                    self.spec_items.append((req, drafts))
                else:
                    self.spec_items = [(req, drafts)]
        else:
            self.prefill_seqs += 1
            self.prefill_tokens += n
            self.prefill_pairs += pairs
            if n == req.prompt_tokens + req.output_tokens - h:  # (req.tokens_to_compute)
                self.prefill_logits += 1

    def _read_hits(self, key, r: int) -> None:
        """A sequence reads r tokens of the hit prefix `key`: what an earlier one read already is re-read."""
        seen = self.hit_reads
        if seen is None:
            seen = self.hit_reads = {}
        m = seen.get(key, 0)
        if m:
            self.shared_kv_tokens += r if r < m else m
        if r > m:
            seen[key] = r

    def add_decodes(self, count: int, kv_tokens: int, max_context: int, shared_kv_tokens: int = 0,
                    hit_groups: dict | None = None, hit_kv_tokens: int = 0) -> None:
        """`count` decode sequences holding `kv_tokens` cached tokens in all (one new token each); of their
        prefix-cache hits, `shared_kv_tokens` re-read among themselves, `hit_groups` hit_key -> [members, hit
        tokens] (to count the re-reads of hits that explicit items of the plan read too); `hit_kv_tokens` all
        their hit tokens."""
        self.lazy_decodes += count
        if shared_kv_tokens:
            self.shared_kv_tokens += shared_kv_tokens
        if hit_kv_tokens:
            self.hit_kv_tokens += hit_kv_tokens
        if hit_groups and self.hit_reads:
            for key, m in list(self.hit_reads.items()):
                g = hit_groups.get(key)
                if g is not None:
                    self.shared_kv_tokens += g[1] if g[1] < m else m
                    if g[1] > m:
                        self.hit_reads[key] = g[1]
        pairs = kv_tokens + count
        self.num_seqs += count
        self.new_tokens += count
        self.pairs += pairs
        self.kv_tokens_read += kv_tokens
        self.decode_seqs += count
        self.decode_kv_tokens += kv_tokens
        self.decode_positions += count
        self.decode_pairs += pairs
        self.decode_logits += count
        if max_context > self.max_context:
            self.max_context = max_context

    def freeze(self) -> "FrozenStepPlan":
        """Hand the plan out: from now on it is read only (its lists become tuples; setting a field raises).
        Costs one class switch, so building stays as fast as before."""
        if self.items.__class__ is list:  # (else still the shared empty tuple)
            self.items = tuple(self.items)
        if self.spec_items.__class__ is list:
            self.spec_items = tuple(self.spec_items)
        if self.adapters.__class__ is set:
            self.adapters = frozenset(self.adapters) if self.adapters else _NO_ADAPTERS
        self.__class__ = FrozenStepPlan  # (still a StepPlan here: a plain assignment, cheaper than object.__setattr__)
        return self

    @property
    def is_empty(self) -> bool:
        return self.num_seqs == 0


class FrozenStepPlan(StepPlan):
    """A StepPlan its scheduler has handed out (Scheduler.plan): the engine, executors, step-time models
    and the timeline read it; nobody sets its fields. Only the scheduler that made it may derive the
    next steady decode iteration from it in place (`thawed`), as fast-forwarding does."""

    __slots__ = ()

    def __init__(self, **fields):
        """A frozen plan with these fields (dataclasses.replace of a frozen plan comes here)."""
        object.__setattr__(self, "__class__", StepPlan)
        StepPlan.__init__(self, **fields)
        self.freeze()

    def __setattr__(self, name, value):
        raise AttributeError(f"StepPlan.{name}: a plan is frozen once its scheduler hands it out")

    def thawed(self) -> StepPlan:
        """The same object, writable again (for its scheduler only; freeze() it again before handing it on)."""
        object.__setattr__(self, "__class__", StepPlan)
        return self


@dataclass(slots=True)
class Outcome:
    """What an iteration produced, for the recorder and the caller."""

    emitted: list[Request]
    """Requests scheduled explicitly that emitted a token (plan order)."""
    finished_decodes: list[Request]
    """Decode-set members that emitted their last token (running order), already materialised."""
    decode_tokens: int
    """Tokens emitted by decode-set members (all regular gaps: they emitted last iteration too)."""
    output_tokens: int = 0
    """All output tokens the iteration produced (a speculative round counts every accepted token)."""
