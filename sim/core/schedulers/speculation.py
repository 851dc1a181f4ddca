"""Speculative decoding as a scheduler option (continuous and chunked): draft sources, acceptance,
draft length, and the per-round mechanics the scheduler base calls.

A running decode with k drafts computes k + 1 positions in one verify pass; `accepted` of the
drafts are kept and the target emits one more token, so the round yields accepted + 1 outputs
(reference section 8). Rejected drafts' KV is rolled back: computed tokens follow the confirmed
outputs; the lookahead blocks stay allocated to the request for its next round.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

import numpy as np
from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, field_validator, model_validator

from sim.io.schema import StrictModel
from sim.models.speculative import (AcceptanceModel, _acceptance_array, adaptive_draft_length, conditional_from_rates,
                                   sample_accepted)
from sim.io.units import parse_bytes


def _size(v):
    return parse_bytes(v)


class NgramDraft(StrictModel):
    """Context / n-gram lookup: no GPU memory, a one-off index build, a CPU lookup per request per round."""

    kind: Literal["ngram"] = "ngram"
    index_build_s: NonNegativeFloat = 0.0
    lookup_s: NonNegativeFloat = Field(0.0, description="Per speculating request per round")


class DraftModel(StrictModel):
    """A small model drafting sequentially: one pass per draft token; its weights and KV count."""

    kind: Literal["draft_model"] = "draft_model"
    model: str = Field(description="Drafter model profile")
    pass_s: PositiveFloat | None = Field(None, description="One draft pass; default: drafter weights read at the "
                                                            "target's effective batch-1 decode bandwidth")
    prefill_overhead: NonNegativeFloat | None = Field(
        None, description="Extra prefill time as a fraction of the target's (default: drafter/target FLOPs per token)")


class ParallelDraft(StrictModel):
    """A block drafter (DFlash-like): all drafts in one pass."""

    kind: Literal["parallel"] = "parallel"
    pass_s: NonNegativeFloat
    memory_bytes: int = Field(0, ge=0, description="Charged to the KV budget (weights, buffers)")
    prefill_overhead: NonNegativeFloat = 0.0
    overlapped: bool = Field(False, description="The pass hides behind the verify step (round = max, not sum)")

    _parse = field_validator("memory_bytes", mode="before")(classmethod(lambda cls, v: _size(v)))


class HeadsDraft(StrictModel):
    """MTP / EAGLE-style heads on the target's features: a cost per draft position."""

    kind: Literal["heads"] = "heads"
    per_position_s: NonNegativeFloat
    memory_bytes: int = Field(0, ge=0)

    _parse = field_validator("memory_bytes", mode="before")(classmethod(lambda cls, v: _size(v)))


class AcceptanceConfig(StrictModel):
    """constant: a at every position; per_position: conditional a_1..a_m; vllm_rates: vLLM's logged
    per-position acceptance rates (cumulative); beta: each request draws a ~ Beta(alpha, beta)."""

    kind: Literal["constant", "per_position", "vllm_rates", "beta"]
    a: float | list[float] | None = None
    alpha: PositiveFloat | None = None
    beta: PositiveFloat | None = None

    @model_validator(mode="after")
    def _fields(self):
        if self.kind == "beta":
            if self.alpha is None or self.beta is None:
                raise ValueError("acceptance kind beta needs alpha and beta")
        elif self.a is None:
            raise ValueError(f"acceptance kind {self.kind} needs a")
        elif self.kind == "constant" and not isinstance(self.a, (int, float)):
            raise ValueError("acceptance kind constant takes one number a")
        elif self.kind != "constant" and not isinstance(self.a, list):
            raise ValueError(f"acceptance kind {self.kind} takes a list a (one value per draft position)")
        unused = [f for f in (("a",) if self.kind == "beta" else ("alpha", "beta")) if getattr(self, f) is not None]
        if unused:
            raise ValueError(f"acceptance kind {self.kind} does not use {' or '.join(unused)}")
        if self.kind == "vllm_rates":
            conditional_from_rates(self.a)  # in [0, 1] and not increasing
        elif self.kind != "beta":
            _acceptance_array([self.a] if self.kind == "constant" else self.a, "a")
        return self

    def model(self, num_drafts: int) -> AcceptanceModel:
        """The acceptance model this configuration describes, for `num_drafts` positions."""
        if self.kind == "constant":
            return AcceptanceModel.constant(float(self.a), num_drafts)
        if self.kind == "beta":
            return AcceptanceModel.beta(self.alpha, self.beta, num_drafts)
        values = self.a if self.kind == "per_position" else list(conditional_from_rates(self.a))
        if len(values) < num_drafts:
            raise ValueError(f"acceptance.a has {len(values)} positions, fewer than num_draft_tokens ({num_drafts})")
        return AcceptanceModel.per_position(values[:num_drafts])


class SpeculativeConfig(StrictModel):
    """Speculative decoding settings: the draft source, drafts per round, acceptance."""

    draft: Annotated[Union[NgramDraft, DraftModel, ParallelDraft, HeadsDraft], Field(discriminator="kind")]
    num_draft_tokens: PositiveInt = Field(description="Drafts per round (the most, when adaptive)")
    adaptive: bool = Field(False, description="Per request, lengthen drafts while dT/dN < T/N (reference section 8)")
    acceptance: AcceptanceConfig

    @model_validator(mode="after")
    def _positions(self):
        acc = self.acceptance
        if acc.kind in ("per_position", "vllm_rates") and len(acc.a) < self.num_draft_tokens:
            raise ValueError(f"acceptance.a has {len(acc.a)} positions, fewer than num_draft_tokens "
                             f"({self.num_draft_tokens})")
        return self


class Speculator:
    """Per-round mechanics: each request's acceptance rates and draft length, accepted counts, draft time."""

    def __init__(self, cfg: SpeculativeConfig, rng: np.random.Generator, round_time_fn=None,
                 draft_pass_s: float | None = None, prefill_overhead: float = 0.0, memory_bytes: int = 0):
        self.cfg = cfg
        self.rng = rng
        self.acceptance = cfg.acceptance.model(cfg.num_draft_tokens)
        self.round_time_fn = round_time_fn
        self.pass_s = draft_pass_s
        self.prefill_overhead = prefill_overhead
        self.memory_bytes = memory_bytes
        self.index_pending = isinstance(cfg.draft, NgramDraft) and cfg.draft.index_build_s > 0
        m = cfg.num_draft_tokens
        self.rounds = 0
        self.drafts = 0
        self.accepted = 0
        self.accepted_per_position = np.zeros(m, dtype=np.int64)
        self.rounds_with_position = np.zeros(m, dtype=np.int64)

    def setup(self, req) -> None:
        """At admission: the request's acceptance rates and (adaptive) draft length."""
        req.accept_rates = self.acceptance.draw(self.rng, 1)[0]
        req.draft_len = self.cfg.num_draft_tokens
        if self.cfg.adaptive and self.round_time_fn is not None:
            req.draft_len = adaptive_draft_length(lambda k: self.round_time_fn(req, k), req.accept_rates,
                                                  self.cfg.num_draft_tokens)

    def drafts_for(self, req) -> int:
        """Drafts to propose for `req` this round (adaptive: from its acceptance so far)."""
        if req.accept_rates is None:
            self.setup(req)
        return max(0, min(req.draft_len, req.max_output_tokens - req.output_tokens - 1))

    def draft_s(self, drafts: list[int], include_index: bool = True) -> float:
        """Drafting time of one round for requests drafting `drafts` tokens each (the one-off
        n-gram index build is charged to the first round that drafts)."""
        d = self.cfg.draft
        k = max(drafts, default=0)
        if k == 0:
            return 0.0
        t = 0.0
        if include_index and self.index_pending:
            t += d.index_build_s
            self.index_pending = False
        if isinstance(d, NgramDraft):
            return t + d.lookup_s * sum(1 for x in drafts if x)
        if isinstance(d, DraftModel):
            return t + k * self.pass_s
        if isinstance(d, ParallelDraft):
            return t + d.pass_s
        return t + k * d.per_position_s

    @property
    def overlapped(self) -> bool:
        return isinstance(self.cfg.draft, ParallelDraft) and self.cfg.draft.overlapped

    def sample(self, reqs: list, drafts: list[int]) -> np.ndarray:
        """Accepted drafts of each request's round (one vectorised draw for the batch)."""
        m = max(drafts)
        rows = np.zeros((len(reqs), m))
        for i, (r, k) in enumerate(zip(reqs, drafts)):
            rows[i, :k] = r.accept_rates[:k]
        return self.count(sample_accepted(rows, self.rng), drafts)

    def count(self, accepted: np.ndarray, drafts: list[int]) -> np.ndarray:
        """Add a batch of rounds (accepted drafts, drafts proposed) to the acceptance report."""
        self.rounds += len(drafts)
        self.drafts += int(sum(drafts))
        self.accepted += int(accepted.sum())
        for j in range(max(drafts)):
            self.rounds_with_position[j] += sum(1 for k in drafts if k > j)
            self.accepted_per_position[j] += int((accepted > j).sum())
        return accepted

    def report(self) -> dict:
        """As `vllm bench serve` reports speculation: mean acceptance length and per-position rates."""
        with np.errstate(invalid="ignore", divide="ignore"):
            rates = np.where(self.rounds_with_position > 0,
                             self.accepted_per_position / np.maximum(self.rounds_with_position, 1), np.nan)
        return {"rounds": self.rounds, "draft_tokens": self.drafts, "accepted_tokens": self.accepted,
                "acceptance_rate": self.accepted / self.drafts if self.drafts else None,
                "mean_acceptance_length": 1 + self.accepted / self.rounds if self.rounds else None,
                "per_position_acceptance": [None if np.isnan(x) else float(x) for x in rates]}
