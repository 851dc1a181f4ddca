"""FLOPs and bytes of an iteration, the roofline time bound, MFU and MBU.

Pure functions shared by the simulator's step-time models and by calibration, so a measured
MFU and a simulated one use the same arithmetic. Decimal SI units (1 TFLOP/s = 1e12 FLOP/s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.models.spec import ModelSpec


def causal_pairs(new_tokens: int, cached_tokens: int) -> int:
    """Query-key pairs of `new_tokens` queries after `cached_tokens` of context: n h + n (n + 1) / 2.

    A decode token with h tokens already cached contributes h + 1 pairs (it also attends to itself).
    """
    n, h = new_tokens, cached_tokens
    return n * h + n * (n + 1) // 2


def forward_flops(spec: ModelSpec, new_tokens: int, pairs: int, logits: int) -> float:
    """F = 2 x active matrix params x n + 2 x lm_head params x n_logits + attention FLOPs x pairs.

    `logits` counts positions that go through lm_head: 1 per finished prefill, 1 per decode token,
    every verified position of a speculative round.
    """
    return (2.0 * spec.active_matrix_params * new_tokens
            + 2.0 * spec.lm_head_params * logits
            + float(spec.attention_flops_per_pair) * pairs)


def sequence_flops(spec: ModelSpec, new_tokens: int, cached_tokens: int, logits: int = 1) -> float:
    """FLOPs of one sequence computing `new_tokens` after `cached_tokens` (causal attention pairs included)."""
    return forward_flops(spec, new_tokens, causal_pairs(new_tokens, cached_tokens), logits)


def iteration_bytes(weight_read_bytes: float, kv_bytes_per_token: float, kv_tokens_read: int) -> float:
    """D = D_w + (context tokens read) x k: weights once per iteration, KV once per sequence."""
    return weight_read_bytes + kv_bytes_per_token * kv_tokens_read


def time_lower_bound_s(flops: float, bytes_read: float, peak_flops_per_s: float, bandwidth_bytes_per_s: float) -> float:
    """T_step >= max(F / P, D / beta)."""
    return max(flops / peak_flops_per_s, bytes_read / bandwidth_bytes_per_s)


def mfu(flops: float, time_s: float, peak_flops_per_s: float) -> float:
    """Model FLOPs utilisation: achieved FLOP/s over the peak."""
    return flops / (time_s * peak_flops_per_s)


def mbu(bytes_read: float, time_s: float, bandwidth_bytes_per_s: float) -> float:
    """Memory bandwidth utilisation: achieved bytes/s over the peak."""
    return bytes_read / (time_s * bandwidth_bytes_per_s)


def b_kv(weight_read_bytes: float, context_tokens: int, kv_bytes_per_token: float) -> int:
    """Smallest batch whose KV reads reach the weight reads: ceil(D_w / (L k))."""
    return math.ceil(weight_read_bytes / (context_tokens * kv_bytes_per_token))


@dataclass(frozen=True)
class DecodeReads:
    """Reads of one decode iteration of `batch` sequences with `context_tokens` each."""

    batch: int
    context_tokens: int
    bytes_per_iteration: float
    bytes_per_output_token: float
    weight_bytes_per_output_token: float
    kv_bytes_per_output_token: float
    flops: float
    time_bound_s: float | None
    memory_bound: bool | None
    state_bytes_per_output_token: float = 0.0
    """A linear-attention model's fixed state, read and written back by every decode step (0 for other models)."""


def decode_reads(spec: ModelSpec, batch: int, context_tokens: int, weight_fmt: str = "bf16",
                 kv_fmt: str = "bf16", peak_flops_per_s: float | None = None,
                 bandwidth_bytes_per_s: float | None = None) -> DecodeReads:
    """D(b, L) = D_w + b L k and d(b, L) = D_w / b + L k (reference section 4); for MoE, D_w counts the
    routed experts the b tokens touch (ModelSpec.weight_read_bytes_at, uniform routing); a linear-attention model's
    sequences also read and write their fixed state, 2 s each (ModelSpec.state_bytes_per_sequence)."""
    w = spec.weight_read_bytes_at(batch, weight_fmt)
    k = spec.kv_bytes_per_token(kv_fmt)
    state = 2 * spec.state_bytes_per_sequence
    total = iteration_bytes(w, k, batch * context_tokens) + batch * state
    flops = batch * sequence_flops(spec, 1, context_tokens, logits=1)
    bound = bound_mem = None
    if peak_flops_per_s and bandwidth_bytes_per_s:
        bound = time_lower_bound_s(flops, total, peak_flops_per_s, bandwidth_bytes_per_s)
        bound_mem = total / bandwidth_bytes_per_s >= flops / peak_flops_per_s
    return DecodeReads(batch, context_tokens, total, total / batch, w / batch, context_tokens * k,
                       flops, bound, bound_mem, state)
