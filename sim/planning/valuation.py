"""Closed-form capacity arithmetic of the reference chapter that is not a step or a memory plan.

Value of a cached prefix, break-even hit probability, recompute and fetch times, compressed KV
and compressed transfers, weight offload per decode step, Amdahl, Little, GPU time and cost per
result, speculative outputs per round, snapshot restore points and paged slot counts.
Pure functions over profiles and numbers: no simpy, no torch. Decimal SI units (GB = 1e9 B,
TFLOP/s = 1e12 FLOP/s); GiB = 2**30 B where a name says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sim.models.memory import blocks_for, kv_footprint, offload_layout, offload_step_s
from sim.models.spec import ModelSpec
from sim.io.profiles import HardwareProfile
from sim.models.roofline import sequence_flops

# ---------------------------------------------------------------------------------------------
# Time to rebuild or move state


def recompute_s(spec: ModelSpec, hw: HardwareProfile, new_tokens: int, mfu: float, cached_tokens: int = 0,
                logits: int = 1, dtype: str = "bf16") -> float:
    """Time to compute `new_tokens` of KV from their FLOPs at a given MFU.

    Args:
        spec: The model.
        hw: The accelerator; its dense peak for `dtype` is used.
        new_tokens: Tokens to (re)compute.
        mfu: Model FLOP utilisation, a fraction in (0, 1].
        cached_tokens: Context already in cache before them.
        logits: Positions that go through lm_head (1 for a prefill).
        dtype: Peak to use (`bf16`, `fp16`, `fp8`).

    Returns:
        Seconds: F / (peak FLOP/s x MFU), F from :func:`sim.models.roofline.sequence_flops`.

    Raises:
        ValueError: when `mfu` is not in (0, 1].
    """
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu must be in (0, 1], got {mfu}")
    flops = sequence_flops(spec, new_tokens, cached_tokens, logits)
    return flops / (hw.peak_flops_per_s(dtype) * mfu)


def host_link_bytes_per_s(hw: HardwareProfile) -> float:
    """The card's host link, one direction, in B/s.

    Raises:
        ValueError: when the profile has no host link (unified-memory SoCs).
    """
    link = hw.host_link_bytes_per_s
    if link is None:
        raise ValueError(f"hardware {hw.name}: host_link.bandwidth_gbs_per_direction is null "
                         f"({hw.host_link.name}); pass a link bandwidth explicitly")
    return link


def transfer_s(num_bytes: float, link_bytes_per_s: float) -> float:
    """Time to move `num_bytes` over a link of `link_bytes_per_s` (one direction, no overlap)."""
    if link_bytes_per_s <= 0:
        raise ValueError(f"link_bytes_per_s must be > 0, got {link_bytes_per_s}")
    return num_bytes / link_bytes_per_s


# ---------------------------------------------------------------------------------------------
# Value of a cached prefix (reference section 6)


def prefix_value_s(hit_probability: float, recompute_s: float, fetch_s: float, maintenance_s: float) -> float:
    """V_h = p_h (T_r - T_f) - T_m: expected time saved by keeping a prefix, per reuse opportunity."""
    return hit_probability * (recompute_s - fetch_s) - maintenance_s


def break_even_hit_probability(recompute_s: float, fetch_s: float, maintenance_s: float) -> float:
    """Hit probability above which keeping a prefix pays: T_m / (T_r - T_f).

    Returns:
        The threshold; `math.inf` when fetching is not faster than recomputing.
    """
    saved = recompute_s - fetch_s
    return maintenance_s / saved if saved > 0 else math.inf


@dataclass(frozen=True)
class PrefixValue:
    """What keeping one cached prefix is worth (times in seconds, bytes as allocated in blocks)."""

    prefix_tokens: int
    prefix_bytes: float
    recompute_s: float
    fetch_s: float
    maintenance_s: float
    hit_probability: float
    saved_per_hit_s: float
    value_s: float
    break_even_hit_probability: float

    @property
    def value_s_per_byte(self) -> float:
        return self.value_s / self.prefix_bytes


def value_prefix(spec: ModelSpec, hw: HardwareProfile, prefix_tokens: int, hit_probability: float, mfu: float,
                 link_bytes_per_s: float | None = None, maintenance_s: float | None = None,
                 kv_format: str = "bf16", block_tokens: int = 16) -> PrefixValue:
    """Value of keeping a prefix: recompute from FLOPs at `mfu`, fetch over the host link.

    Args:
        spec: The model.
        hw: The accelerator (peak FLOP/s; host link when `link_bytes_per_s` is None).
        prefix_tokens: Tokens of the prefix (its KV, allocated in whole blocks, is what moves).
        hit_probability: p_h, the chance the prefix is reused.
        mfu: Prefill MFU used for the recompute time.
        link_bytes_per_s: Link for fetch and swap-out; defaults to the card's host link.
        maintenance_s: T_m; defaults to one swap-out over the same link (the fetch time).
        kv_format: KV storage format.
        block_tokens: KV block size.

    Returns:
        A :class:`PrefixValue`.
    """
    link = host_link_bytes_per_s(hw) if link_bytes_per_s is None else link_bytes_per_s
    prefix_bytes = kv_footprint(spec, prefix_tokens, 1, kv_format=kv_format, block_tokens=block_tokens).kv_bytes_per_request
    t_r = recompute_s(spec, hw, prefix_tokens, mfu)
    t_f = transfer_s(prefix_bytes, link)
    t_m = t_f if maintenance_s is None else maintenance_s
    return PrefixValue(prefix_tokens, prefix_bytes, t_r, t_f, t_m, hit_probability, t_r - t_f,
                       prefix_value_s(hit_probability, t_r, t_f, t_m), break_even_hit_probability(t_r, t_f, t_m))


def snapshot_restore(matched_tokens: int, snapshot_tokens: Sequence[int]) -> tuple[int, int]:
    """Hybrid (recurrent) models: restore from the last snapshot at or before the match.

    Args:
        matched_tokens: Length of the matched prefix.
        snapshot_tokens: Positions where state snapshots exist.

    Returns:
        (restore_from_tokens, recompute_tokens); (0, matched_tokens) when no snapshot fits.
    """
    points = sorted(p for p in snapshot_tokens if p <= matched_tokens)
    restore = points[-1] if points else 0
    return restore, matched_tokens - restore


def paged_blocks(lengths_tokens: Sequence[int], block_tokens: int, shared_prefix_tokens: int = 0,
                 sharing_requests: int = 0) -> int:
    """Physical blocks of paged KV for requests of the given lengths (reference section 3).

    Only full blocks of a prefix shared by `sharing_requests` of them are stored once; a partly
    filled shared tail block is private (copied on write).
    """
    blocks = sum(blocks_for(n, block_tokens) for n in lengths_tokens)
    if sharing_requests > 1:
        blocks -= (sharing_requests - 1) * (shared_prefix_tokens // block_tokens)
    return blocks


def kv_bytes_for_tokens(spec: ModelSpec, tokens: int, kv_format: str = "bf16", gqa: bool = True) -> float:
    """KV bytes of `tokens` context tokens, unrounded to blocks; `gqa=False` gives the size the
    model would need with one KV head per query head (reference section 10)."""
    per_token = spec.kv_bytes_per_token(kv_format) if gqa else spec.kv_bytes_per_token_without_gqa(kv_format)
    return tokens * per_token


def instance_headroom_bytes(capacity_bytes: int, weight_bytes: int, kv_bytes: int, other_bytes: int = 0) -> int:
    """What M_w + M_KV + M_a + M_u <= C leaves for activations and workspaces: C - M_w - M_KV - M_u."""
    return capacity_bytes - weight_bytes - kv_bytes - other_bytes


# ---------------------------------------------------------------------------------------------
# Compression and offload (reference section 7)


def compressed_kv_net_s(saved_bytes: float, bandwidth_bytes_per_s: float, conversion_s: float) -> float:
    """dT = dD / beta - T_c: read time saved by a smaller KV format, less the conversion time."""
    return saved_bytes / bandwidth_bytes_per_s - conversion_s


def min_decompress_bytes_per_s(link_bytes_per_s: float, size_ratio: float) -> float:
    """Decompression rate (original bytes/s) above which compressing before a transfer pays:
    B_link / (1 - r), transfer then decompression, not overlapped."""
    if not 0 <= size_ratio < 1:
        raise ValueError(f"size_ratio must be in [0, 1), got {size_ratio}")
    return link_bytes_per_s / (1 - size_ratio)


def compression_pays(decompress_bytes_per_s: float, link_bytes_per_s: float, size_ratio: float) -> bool:
    """R_dec > B_link / (1 - r)."""
    return decompress_bytes_per_s > min_decompress_bytes_per_s(link_bytes_per_s, size_ratio)


@dataclass(frozen=True)
class CompressedTransfer:
    """Moving compressed KV: the raw transfer time against compressed transfer plus decompression."""
    raw_s: float
    compressed_transfer_s: float
    decompress_s: float
    compressed_s: float
    saved_s: float
    min_decompress_bytes_per_s: float


def compressed_transfer(size_bytes: float, size_ratio: float, link_bytes_per_s: float,
                        decompress_bytes_per_s: float | None = None) -> CompressedTransfer:
    """Raw transfer S / B vs compressed r S / B + S / R_dec (decompression 0 when its rate is None)."""
    raw = transfer_s(size_bytes, link_bytes_per_s)
    moved = transfer_s(size_ratio * size_bytes, link_bytes_per_s)
    dec = size_bytes / decompress_bytes_per_s if decompress_bytes_per_s else 0.0
    return CompressedTransfer(raw, moved, dec, moved + dec, raw - moved - dec,
                              min_decompress_bytes_per_s(link_bytes_per_s, size_ratio))


@dataclass(frozen=True)
class OffloadDecode:
    """Decode with offloaded FFNs streamed in over a link every iteration."""

    copy_s_per_step: float
    step_s: float
    tokens_per_s: float
    steps: int
    copy_s_total: float
    total_s: float


def offload_decode(spec: ModelSpec, offloaded_layers: int, prefetch_buffers: int, link_bytes_per_s: float,
                   compute_step_s: float, batch: int, steps: int, weight_fmt: str = "bf16") -> OffloadDecode:
    """Decode steps with `offloaded_layers` FFNs copied in each step (sim.models.memory.offload_layout/_step_s).

    Args:
        spec: The model.
        offloaded_layers: Dense FFNs kept in host memory.
        prefetch_buffers: 1 (copy and compute serialised) or 2 (overlapped).
        link_bytes_per_s: Host link, one direction.
        compute_step_s: Decode step time without offload.
        batch: Sequences decoding together (one token each per step).
        steps: Decode steps to total.
        weight_fmt: Weight format of the offloaded FFNs.
    """
    plan = offload_layout(spec, offloaded_layers, prefetch_buffers, link_bytes_per_s, weight_fmt)
    copy = plan.copy_s_per_step or 0.0
    step = offload_step_s(compute_step_s, copy, prefetch_buffers, offloaded_layers)
    return OffloadDecode(copy, step, decode_tokens_per_s(batch, step), steps, steps * copy, steps * step)


# ---------------------------------------------------------------------------------------------
# Throughput, queueing, cost (reference sections 2, 9, 10)


def decode_tokens_per_s(batch: int, step_s: float) -> float:
    """Decode-phase throughput b / T: one token per sequence per iteration."""
    return batch / step_s


def decode_ceiling_tokens_per_s(bandwidth_bytes_per_s: float, weight_read_bytes: float) -> float:
    """Batch-1 decode speed ceiling: every step reads the weights once, so at most beta / D_w."""
    return bandwidth_bytes_per_s / weight_read_bytes


def littles_law_in_system(arrival_rate_per_s: float, residence_s: float) -> float:
    """Little's law: mean requests in the system n = lambda T."""
    return arrival_rate_per_s * residence_s


def amdahl_speedup(fraction: float, speedup: float) -> float:
    """S = 1 / ((1 - f) + f / s) for a fraction f of the work sped up s times."""
    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    return 1.0 / ((1 - fraction) + fraction / speedup)


def gpu_s_per_request(new_tokens: int, prefill_tokens_per_s: float, output_tokens: int,
                      decode_calls_per_s: float) -> float:
    """t_GPU = L_new / r_P + (G - 1) / r_D (cache hits excluded from L_new; a batched decode call
    counts once per request)."""
    return new_tokens / prefill_tokens_per_s + (output_tokens - 1) / decode_calls_per_s


def cost_per_good_result_s(occupancy_s: float, num_good: int) -> float:
    """Accelerator occupancy over the observation window / N_good (inf when nothing is good)."""
    return occupancy_s / num_good if num_good else math.inf


def energy_per_good_result_j(occupancy_s: float, power_w: float, num_good: int) -> float:
    """Upper bound on energy per good result at a power cap: occupancy x power / N_good."""
    return occupancy_s * power_w / num_good if num_good else math.inf


# Speculative decoding arithmetic lives in sim.models.speculative; re-exported for callers of this module.
from sim.models.speculative import expected_outputs_per_round  # noqa: E402,F401

