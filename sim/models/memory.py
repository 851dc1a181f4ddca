"""Analytic memory model: KV per request (paged, shared prefixes, formats), budgets and fit.

M_w + M_KV + M_a + M_u <= C (reference section 1), with M_KV counted in physical blocks after
de-duplicating shared references.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sim.models.spec import ModelSpec
from sim.io.profiles import HardwareProfile


def tokens_stored(prompt_tokens: int, output_tokens: int) -> int:
    """The last output token is never written to the KV cache: P + G - 1."""
    return prompt_tokens + max(output_tokens, 1) - 1


def blocks_for(tokens: int, block_tokens: int) -> int:
    """Blocks of `block_tokens` needed to hold `tokens` (rounded up)."""
    return -(-tokens // block_tokens)


@dataclass(frozen=True)
class KVFootprint:
    """KV need of `requests` identical requests; the JSON contract of `capsim memory --json`."""

    kv_format: str
    block_tokens: int
    kv_bytes_per_token: float
    tokens_stored_per_request: int
    blocks_per_request: int
    kv_bytes_per_request: float
    shared_prefix_tokens: int
    shared_prefix_blocks: int
    shared_prefix_bytes: float
    requests: int
    total_blocks: int
    total_kv_bytes: float
    kv_budget_bytes: int | None
    fits: bool | None
    max_requests: int | None

    def as_dict(self) -> dict:
        """Every field, for JSON output."""
        return asdict(self)


def kv_footprint(spec: ModelSpec, prompt_tokens: int, output_tokens: int, requests: int = 1,
            shared_prefix_tokens: int = 0, kv_format: str = "bf16", block_tokens: int = 16,
            kv_budget_bytes: int | None = None) -> KVFootprint:
    """KV bytes of `requests` requests of one shape, reserved for prompt + all outputs.

    Only full blocks of a shared prefix are shared (a partly filled tail block is private, it
    would be copied on write); `kv_bytes_per_request` is then the private part of one request.
    """
    if prompt_tokens < 1 or output_tokens < 1:
        raise ValueError(f"prompt ({prompt_tokens}) and output ({output_tokens}) tokens must be >= 1")
    if not 0 <= shared_prefix_tokens <= prompt_tokens:
        raise ValueError(f"shared prefix ({shared_prefix_tokens}) must be between 0 and the prompt ({prompt_tokens})")
    k = spec.kv_bytes_per_token(kv_format)
    stored = tokens_stored(prompt_tokens, output_tokens)
    shared_blocks = shared_prefix_tokens // block_tokens if requests > 0 else 0
    private_tokens = stored - shared_blocks * block_tokens
    private_blocks = blocks_for(private_tokens, block_tokens)
    block_bytes = block_tokens * k
    total_blocks = shared_blocks + requests * private_blocks
    max_req = fits = None
    if kv_budget_bytes is not None:
        total_budget_blocks = int(kv_budget_bytes // block_bytes)
        free = total_budget_blocks - shared_blocks
        max_req = max(0, free // private_blocks) if free >= 0 else 0
        fits = total_blocks <= total_budget_blocks
    return KVFootprint(kv_format, block_tokens, k, stored, private_blocks, private_blocks * block_bytes,
                  shared_prefix_tokens, shared_blocks, shared_blocks * block_bytes, requests,
                  total_blocks, total_blocks * block_bytes, kv_budget_bytes, fits, max_req)


STATE_TO_KV_RATIO = 0.9
"""Linear-attention models: the state pool's memory relative to the KV pool's by default (kv.state_to_kv_ratio;
SGLang's --mamba-full-memory-ratio default)."""


def state_slots(cache_bytes: float, state_bytes_per_request: float, ratio: float = STATE_TO_KV_RATIO) -> int:
    """How many requests' linear-attention state a pool of `ratio` times the KV pool's memory holds out of
    `cache_bytes` (r / (1 + r) of it, in whole states); the KV pool takes the rest."""
    return int(cache_bytes * ratio / (1 + ratio) // state_bytes_per_request)


def kv_budget_from_utilization(hw: HardwareProfile, weight_bytes: int, gpu_memory_utilization: float,
                               activation_bytes: int = 0, other_bytes: int = 0) -> int:
    """vLLM's way: utilization x card memory - weights - activation/graph workspace - other."""
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    budget = int(gpu_memory_utilization * hw.memory_bytes) - weight_bytes - activation_bytes - other_bytes
    if budget <= 0:
        raise ValueError(
            f"no KV budget left on {hw.name}: {gpu_memory_utilization} x {hw.memory_bytes} B - weights "
            f"{weight_bytes} B - activations {activation_bytes} B - other {other_bytes} B = {budget} B")
    return budget


def unified_memory_free(hw: HardwareProfile, system_reserve_bytes: int, weight_bytes: int) -> int:
    """Unified memory: card memory less what the OS keeps, less the weights (may be negative)."""
    return hw.memory_bytes - system_reserve_bytes - weight_bytes


@dataclass(frozen=True)
class OffloadLayout:
    """Offloading whole dense FFNs to host memory and streaming them back each iteration."""

    offloaded_layers: int
    prefetch_buffers: int
    freed_bytes: int
    net_freed_bytes: int
    copy_bytes_per_step: int
    copy_s_per_step: float | None


def offload_layout(spec: ModelSpec, offloaded_layers: int, prefetch_buffers: int, host_link_bytes_per_s: float | None,
                 weight_fmt: str = "bf16") -> OffloadLayout:
    """Reference section 7: every fourth of 36 layers frees 2592 MiB; each buffer costs one FFN."""
    if not 0 <= offloaded_layers <= spec.profile.num_layers:
        raise ValueError(f"offloaded_layers ({offloaded_layers}) must be between 0 and {spec.profile.num_layers}")
    if prefetch_buffers not in (1, 2):
        raise ValueError(f"prefetch_buffers must be 1 or 2, got {prefetch_buffers}")
    ffn = spec.ffn_bytes_per_layer(weight_fmt)
    freed = offloaded_layers * ffn
    copy = freed
    t = copy / host_link_bytes_per_s if host_link_bytes_per_s else None
    return OffloadLayout(offloaded_layers, prefetch_buffers, freed, freed - prefetch_buffers * ffn, copy, t)


def offload_step_s(compute_s: float, copy_s: float, prefetch_buffers: int, num_copies: int) -> float:
    """Step time with offloaded layers: one buffer serialises copy and compute; two overlap them,
    so the step is at least the total copy time and at least the compute time."""
    if prefetch_buffers == 1:
        return compute_s + copy_s
    return max(compute_s, copy_s) if num_copies else compute_s
