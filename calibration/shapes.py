"""Iteration shapes (what the schedulers produce) and the calibration grids built from them.

Pure Python: no torch. A shape is a batch of sequence groups; each group is `count` sequences
with `new` tokens to compute after `cached` tokens already in their KV cache. Its features are
the simulator's (sim.core.schedulers.base.StepPlan): new tokens, causal pairs, KV tokens read,
sequences, decode sequences, computed with sim.models.roofline.causal_pairs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

from sim.api import ModelProfile
from sim.api import causal_pairs

KINDS = ("prefill", "decode", "mixed")


@dataclass(frozen=True)
class Group:
    """`count` sequences, each with `new` tokens to compute after `cached` tokens in its KV cache.

    A group with new == 1 is a decode group (one token per sequence, as the simulator counts it);
    every sequence yields one row of logits (a prefill chunk is taken to end its prompt).
    """

    count: int
    new: int
    cached: int

    def __post_init__(self):
        if self.count < 1 or self.new < 1 or self.cached < 0:
            raise ValueError(f"bad group {self.count}x{self.new}@{self.cached}")

    @property
    def is_decode(self) -> bool:
        return self.new == 1

    @property
    def text(self) -> str:
        return f"{self.count}x{self.new}@{self.cached}"


_GROUP = re.compile(r"^(\d+)x(\d+)@(\d+)$")


@dataclass(frozen=True)
class Shape:
    """One iteration: groups of sequences. `key` names it in the points CSV (resume looks it up)."""

    groups: tuple[Group, ...]

    @classmethod
    def of(cls, *groups: tuple[int, int, int] | Group) -> "Shape":
        """A shape from (count, new, cached) tuples or Groups."""
        return cls(tuple(g if isinstance(g, Group) else Group(*g) for g in groups))

    @classmethod
    def parse(cls, key: str) -> "Shape":
        """'decode:16x1@2048+1x512@0' (kind prefix optional) -> Shape."""
        body = key.split(":", 1)[-1]
        groups = []
        for part in body.split("+"):
            m = _GROUP.match(part.strip())
            if not m:
                raise ValueError(f"bad shape {key!r}: expected groups like 16x1@2048 joined by '+'")
            groups.append(Group(*map(int, m.groups())))
        return cls(tuple(groups))

    @property
    def kind(self) -> str:
        dec = [g.is_decode for g in self.groups]
        return "decode" if all(dec) else "prefill" if not any(dec) else "mixed"

    @property
    def key(self) -> str:
        return f"{self.kind}:" + "+".join(g.text for g in self.groups)

    # --- the simulator's iteration features (StepPlan) ----------------------------------------
    @cached_property
    def features(self) -> dict[str, int]:
        """The batch features the step-time models read (the same names as a StepPlan's)."""
        f = dict(new_tokens=0, pairs=0, kv_tokens_read=0, num_seqs=0, decode_seqs=0, decode_kv_tokens=0,
                 prefill_seqs=0, prefill_tokens=0, prefill_pairs=0, prefill_cached_tokens=0, logits=0,
                 max_context=0)
        for g in self.groups:
            pairs = g.count * causal_pairs(g.new, g.cached)
            f["new_tokens"] += g.count * g.new
            f["pairs"] += pairs
            f["kv_tokens_read"] += g.count * g.cached
            f["num_seqs"] += g.count
            f["logits"] += g.count
            f["max_context"] = max(f["max_context"], g.cached + g.new)
            if g.is_decode:
                f["decode_seqs"] += g.count
                f["decode_kv_tokens"] += g.count * g.cached
            else:
                f["prefill_seqs"] += g.count
                f["prefill_tokens"] += g.count * g.new
                f["prefill_pairs"] += pairs
                f["prefill_cached_tokens"] += g.count * g.cached
        return f

    @property
    def num_seqs(self) -> int:
        return self.features["num_seqs"]

    @property
    def kv_slots(self) -> int:
        """Token positions the KV cache must hold for this iteration (cached + new, all sequences)."""
        return sum(g.count * (g.cached + g.new) for g in self.groups)

    def padded(self, rows: int) -> "Shape":
        """A decode shape padded to `rows` sequences with 1-token, empty-context dummies (CUDA graphs)."""
        pad = rows - self.num_seqs
        if pad < 0:
            raise ValueError(f"cannot pad {self.num_seqs} rows down to {rows}")
        return self if pad == 0 else Shape(self.groups + (Group(pad, 1, 0),))


# ---------------------------------------------------------------------------------------------
# Grids


@dataclass(frozen=True)
class GridSpec:
    """Axes of a grid. Prefill: new x cached x batch (capped by max_tokens); decode: batch x context
    (capped by max_kv_tokens) plus mixed-context batches; mixed: decodes + one prefill chunk."""

    prefill_new: tuple[int, ...]
    prefill_cached: tuple[int, ...]
    prefill_batch: tuple[int, ...]
    decode_batch: tuple[int, ...]
    decode_context: tuple[int, ...]
    mixed_context_batches: tuple[int, ...]   # batch sizes split half short, half long context
    mixed_decodes: tuple[int, ...]
    mixed_decode_context: int
    mixed_chunk: tuple[int, ...]
    mixed_chunk_cached: tuple[int, ...]
    max_tokens: int                          # most new tokens in one iteration
    max_kv_tokens: int                       # most cached tokens in one iteration

    def shapes(self, max_context: int | None = None) -> list[Shape]:
        """Every shape of the grid, in a fixed order (prefill, decode, mixed), duplicates removed."""
        out: list[Shape] = []
        ok_ctx = (lambda c: True) if max_context is None else (lambda c: c <= max_context)
        for n in self.prefill_new:
            for h in self.prefill_cached:
                for b in self.prefill_batch:
                    if b * n <= self.max_tokens and b * h <= self.max_kv_tokens and ok_ctx(n + h):
                        out.append(Shape.of((b, n, h)))
        for c in self.decode_context:
            for b in self.decode_batch:
                if b * c <= self.max_kv_tokens and ok_ctx(c + 1):
                    out.append(Shape.of((b, 1, c)))
        usable = [c for c in self.decode_context if ok_ctx(c + 1)]
        short, long_ = (usable[0], usable[-1]) if len(usable) > 1 else (0, 0)
        for b in self.mixed_context_batches:
            half = b // 2
            if half and long_ and (b - half) * long_ + half * short <= self.max_kv_tokens:
                out.append(Shape.of((half, 1, short), (b - half, 1, long_)))
        for d in self.mixed_decodes:
            for c in self.mixed_chunk:
                for h in self.mixed_chunk_cached:
                    if d + c <= self.max_tokens and ok_ctx(max(h + c, self.mixed_decode_context + 1)):
                        out.append(Shape.of((d, 1, self.mixed_decode_context), (1, c, h)))
        seen, unique = set(), []
        for s in out:
            if s.key not in seen:
                seen.add(s.key)
                unique.append(s)
        return unique


# Accelerator grids follow the iteration shapes of a vLLM-style scheduler (a 2K-16K token budget,
# up to a few hundred running sequences); the CPU grids scale tokens down about 8x so that a
# 0.5B model's run stays within minutes on a few cores. `tiny` is for tests.
_ACCEL = {
    "quick": GridSpec((128, 2048), (0, 2048), (1, 4), (1, 4, 16, 64), (512, 2048), (16,),
                      (4, 32), 2048, (512,), (0, 4096), 8192, 262_144),
    "standard": GridSpec((128, 512, 2048, 8192), (0, 2048, 8192), (1, 4, 16), (1, 2, 4, 8, 16, 32, 64, 128, 256),
                         (128, 512, 2048, 8192), (8, 32, 128), (1, 8, 32, 64), 2048, (512, 2048), (0, 4096),
                         16_384, 1_048_576),
    "full": GridSpec((64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384), (0, 1024, 4096, 16384), (1, 2, 4, 8, 16, 32),
                     (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512),
                     (64, 256, 1024, 2048, 4096, 8192, 16384, 32768), (8, 32, 128, 256), (1, 4, 16, 64, 128), 2048,
                     (256, 1024, 2048, 4096), (0, 2048, 8192), 32_768, 2_097_152),
}
_CPU = {
    "tiny": GridSpec((4, 16), (0, 8), (1, 2), (1, 2, 4), (4, 32), (4,), (1, 2), 16, (8,), (0, 8), 64, 256),
    "quick": GridSpec((16, 64, 256), (0, 256), (1, 4), (1, 2, 4, 8, 16), (16, 256, 1024), (4, 16),
                      (1, 8), 256, (64, 256), (0, 256), 512, 16_384),
    "standard": GridSpec((16, 64, 256, 512), (0, 256, 1024), (1, 4), (1, 2, 4, 8, 16, 32), (16, 128, 512, 2048),
                         (4, 16), (1, 4, 16), 512, (64, 256), (0, 512), 1024, 65_536),
    "full": GridSpec((16, 32, 64, 128, 256, 512, 1024), (0, 256, 1024, 4096), (1, 2, 4, 8),
                     (1, 2, 4, 8, 16, 32, 64), (16, 128, 512, 1024, 2048, 4096, 8192), (4, 16, 64),
                     (1, 4, 16, 32), 1024, (64, 256, 512), (0, 1024), 2048, 131_072),
}
GRID_NAMES = ("tiny", "quick", "standard", "full")


def grid_spec(name: str, device: str) -> GridSpec:
    """The calibration grid `name` (tiny, quick, full) for this kind of device."""
    table = _CPU if device == "cpu" else _ACCEL
    if name == "tiny":
        return _CPU["tiny"]
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown grid {name!r}; known: {', '.join(GRID_NAMES)}") from None


def grid_shapes(name: str, device: str, model: ModelProfile | None = None) -> list[Shape]:
    """The grid's shapes for `device` (cpu grids are smaller), within the model's context length."""
    return grid_spec(name, device).shapes(model.max_position_embeddings if model is not None else None)


def tiny_model_profile(num_layers: int = 2, family: str = "qwen3", **over) -> ModelProfile:
    """A small Llama/Qwen-shaped profile for tests and smoke runs (not a real checkpoint)."""
    base = dict(name="tiny", hf_id="none/tiny", family=family, num_layers=num_layers, hidden_size=64,
                intermediate_size=128, num_attention_heads=4, num_kv_heads=2, head_dim=16, vocab_size=256,
                tie_word_embeddings=True, qkv_bias=family == "qwen2", qk_norm=family == "qwen3",
                max_position_embeddings=4096, source="test shape")
    base.update(over)
    return ModelProfile(**base)
