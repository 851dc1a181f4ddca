"""What a replica holds in device memory: weights (less offloaded layers), drafter, LoRA adapters, and
the KV pool carved out of what is left, in blocks."""

from __future__ import annotations

from dataclasses import dataclass

from sim.io.config import Scenario
from sim.io.errors import ConfigError
from sim.io.profiles import HardwareProfile, load_model
from sim.models.memory import OffloadLayout, kv_budget_from_utilization, offload_layout
from sim.models.spec import ModelSpec


@dataclass(frozen=True)
class ReplicaMemory:
    """One replica's memory: every byte the summary reports and the KV pool's size in blocks."""

    kv_bytes_per_token: float
    """Target KV per token, plus the drafter's when a draft model runs beside it."""
    block_bytes: float
    weight_bytes: int
    """Weights resident on the device (offloaded layers excluded, prefetch buffers included)."""
    kv_budget_bytes: int
    activation_bytes: int
    draft_memory_bytes: int
    lora_memory_bytes: int
    num_blocks: int
    host_blocks: int
    offload: OffloadLayout | None
    drafter_spec: ModelSpec | None


def _drafter(scenario: Scenario) -> tuple[ModelSpec | None, int]:
    """The draft model's spec (draft_model drafters only) and the drafter's memory."""
    cfg = getattr(scenario.scheduler, "speculative", None)
    if cfg is None:
        return None, 0
    d = cfg.draft
    if d.kind == "draft_model":
        drafter = ModelSpec(load_model(d.model))
        return drafter, drafter.weight_bytes(scenario.weight_format)
    if d.kind in ("parallel", "heads"):
        return None, d.memory_bytes
    return None, 0


def _offload(scenario: Scenario, spec: ModelSpec, hw: HardwareProfile) -> OffloadLayout | None:
    if scenario.offload is None:
        return None
    try:
        layout = offload_layout(spec, scenario.offload.layers, scenario.offload.prefetch_buffers,
                                hw.host_link_bytes_per_s, scenario.weight_format)
    except ValueError as exc:
        raise ConfigError(f"offload: {exc}") from None
    if layout.copy_s_per_step is None:
        raise ConfigError(f"offload: hardware {hw.name} has no host link to stream weights over")
    return layout


def _kv_budget(scenario: Scenario, hw: HardwareProfile, weight_bytes: int) -> tuple[int, int]:
    """(KV budget, activation bytes): given in bytes, or from the card's memory utilisation."""
    budget = scenario.kv.budget
    if isinstance(budget, int):
        return budget, 0
    try:
        kv = kv_budget_from_utilization(hw, weight_bytes, budget.gpu_memory_utilization,
                                        budget.activation_bytes, budget.other_bytes)
    except ValueError as exc:
        raise ConfigError(f"kv.budget: {exc}") from None
    return kv, budget.activation_bytes


def replica_memory(scenario: Scenario, spec: ModelSpec, hw: HardwareProfile) -> ReplicaMemory:
    """Size one replica of `scenario` on `hw`; a budget that holds no block is a configuration error."""
    kv = scenario.kv
    drafter, draft_bytes = _drafter(scenario)
    per_token = spec.kv_bytes_per_token(kv.format)
    if drafter is not None:
        # the drafter keeps KV for every token too: charged per token, in the same blocks
        per_token += drafter.kv_bytes_per_token(kv.format)
    block_bytes = kv.block_tokens * per_token
    offload = _offload(scenario, spec, hw)
    weight_bytes = spec.weight_bytes(scenario.weight_format) - (offload.net_freed_bytes if offload else 0)
    lora_bytes = 0
    if scenario.lora is not None:
        lora_bytes = scenario.lora.adapters * spec.lora_adapter_bytes(scenario.lora.rank, tuple(scenario.lora.targets),
                                                                     "bf16")
    budget, activation = _kv_budget(scenario, hw, weight_bytes)
    num_blocks = int((budget - draft_bytes - lora_bytes) // block_bytes)
    if num_blocks < 1:
        raise ConfigError(f"kv.budget: {budget} B holds no {kv.block_tokens}-token block ({block_bytes} B each)")
    host_blocks = int(kv.host_budget // block_bytes)
    if host_blocks and not hw.host_link_bytes_per_s:
        raise ConfigError(f"kv.host_budget: hardware {hw.name} has no host link bandwidth to swap over")
    return ReplicaMemory(per_token, block_bytes, weight_bytes, budget, activation, draft_bytes, lora_bytes, num_blocks,
                         host_blocks, offload, drafter)
