"""What a replica holds in device memory: weights (less offloaded layers), drafter, LoRA adapters, and
the KV pool carved out of what is left, in blocks."""

from __future__ import annotations

from dataclasses import dataclass

from sim.io.config import Scenario
from sim.io.errors import ConfigError
from sim.io.profiles import HardwareProfile, load_model
from sim.models.memory import (STATE_TO_KV_RATIO, OffloadLayout, kv_budget_from_utilization, offload_layout,
                               state_slots)
from sim.models.parallel import (Layout, check_layout, kv_bytes_per_token_per_gpu, replica_weight_bytes,
                                 state_bytes_per_sequence_per_gpu, weights_per_gpu)
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
    layout: Layout = Layout()
    """The replica's GPUs; for more than one, the byte counts above are the replica's (summed over its
    GPUs) and the per-GPU ones below are the fullest GPU's."""
    weight_bytes_per_gpu: int = 0
    kv_bytes_per_token_per_gpu: float = 0
    kv_budget_bytes_per_gpu: int = 0
    state_slots: int | None = None
    """Models with linear-attention layers: how many sequences the state pool holds, the most that run at once
    (None: no such layers)."""
    state_bytes: int = 0
    """The state pool's bytes over the replica (taken from the KV budget before the blocks)."""
    state_bytes_per_sequence: int = 0
    """One sequence's linear-attention state as the pool charges it: the fullest GPU's share times the GPUs of one
    attention data-parallel rank, as KV blocks are counted (with pipeline stages of unequal linear layers, a little
    above the state itself)."""

    @property
    def gpus(self) -> int:
        """GPUs of one replica."""
        return self.layout.gpus

    def per_gpu(self) -> dict:
        """What the fullest GPU holds (summary.json `parallel`)."""
        out = {"tp": self.layout.tp, "pp": self.layout.pp, "ep": self.layout.ep, "gpus_per_replica": self.gpus,
               "weights_bytes_per_gpu": int(self.weight_bytes_per_gpu),
               "kv_bytes_per_token_per_gpu": self.kv_bytes_per_token_per_gpu,
               "kv_budget_bytes_per_gpu": int(self.kv_budget_bytes_per_gpu),
               "activation_bytes_per_gpu": int(self.activation_bytes // self.gpus)}
        if self.layout.attention_dp > 1:
            out["attention_dp"] = self.layout.attention_dp
        return out


def _drafter(scenario: Scenario) -> tuple[ModelSpec | None, int]:
    """The draft model's spec (draft_model drafters only) and the drafter's memory."""
    cfg = getattr(scenario.scheduler, "speculative", None)
    if cfg is None:
        return None, 0
    d = cfg.draft
    if d.kind == "draft_model":
        try:
            drafter = ModelSpec(load_model(d.model))
        except ConfigError as exc:
            raise ConfigError(f"scheduler.speculative.draft.model: {exc}") from None
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


def replica_layout(scenario: Scenario, spec: ModelSpec) -> Layout:
    """The replica's layout: `parallel`, else one GPU (or `step_time.model.tp` GPUs of a kind ops model,
    its older way of saying tensor parallelism); checked against the model."""
    cfg = getattr(scenario, "parallel", None)
    ops_tp = getattr(scenario.step_time.model, "tp", 1)
    if cfg is None:
        layout, field = Layout(tp=ops_tp), "step_time.model"
    else:
        layout, field = Layout.of(cfg), "parallel"
        if ops_tp not in (1, layout.tp):
            raise ConfigError(f"step_time.model.tp: {ops_tp} differs from parallel.tp ({layout.tp}); "
                              f"allowed: {layout.tp} (or leave it out)")
    check_layout(spec, layout, field)
    return layout


def _kv_budget(scenario: Scenario, hw: HardwareProfile, weight_bytes: int, gpus: int = 1,
               spec: ModelSpec | None = None) -> tuple[int, int]:
    """(KV budget, activation bytes) of the replica: given in bytes, or from each card's memory
    utilisation less the weights on the fullest GPU (`weight_bytes`), times the GPUs."""
    budget = scenario.kv.budget
    if isinstance(budget, int):
        return budget, 0
    try:
        kv = kv_budget_from_utilization(hw, weight_bytes, budget.gpu_memory_utilization,
                                        budget.activation_bytes, budget.other_bytes)
    except ValueError as exc:
        raise ConfigError(f"kv.budget: {exc}" + (_layout_hint(scenario, spec, hw) if spec else "")) from None
    return kv * gpus, budget.activation_bytes * gpus


def _layout_hint(scenario: Scenario, spec: ModelSpec, hw: HardwareProfile) -> str:
    """'; the smallest layout that fits is ...' (and the smallest of tensor parallelism alone, when that one
    pipelines) when the weights leave no KV on the card: the usable memory and reserve of the scenario's kv.budget
    (a budget in bytes: the whole card, nothing reserved)."""
    from sim.models.parallel import KV_HEADROOM, nothing_fits, smallest_fitting_layout
    b = scenario.kv.budget
    usable, reserve = ((hw.memory_bytes, 0) if isinstance(b, int)
                       else (int(b.gpu_memory_utilization * hw.memory_bytes), b.activation_bytes + b.other_bytes))
    best = smallest_fitting_layout(spec, usable, scenario.weight_format, reserve)
    if best is None:
        return nothing_fits(spec, usable, scenario.weight_format, reserve, "weight_format:")

    def field(lay) -> str:
        return f"parallel: {{tp: {lay.tp}, pp: {lay.pp}, ep: {lay.ep}}} ({lay.gpus} GPUs)"
    hint = f"; the smallest layout that fits is {field(best)}, leaving {KV_HEADROOM:.0%} or more of each GPU for KV"
    tp_only = smallest_fitting_layout(spec, usable, scenario.weight_format, reserve, max_pp=1)
    if best.pp > 1 and tp_only is not None:
        hint += f"; with tensor parallelism alone: {field(tp_only)}"
    return hint


def replica_memory(scenario: Scenario, spec: ModelSpec, hw: HardwareProfile) -> ReplicaMemory:
    """Size one replica of `scenario` on `hw`; a budget that holds no block is a configuration error.

    Over several GPUs (sim.models.parallel): the KV pool holds what the fullest GPU holds, its blocks
    costing `block_tokens` x that GPU's KV bytes per token on each GPU of one attention data-parallel rank
    (every GPU of the replica without attention_dp), so attention_dp ranks hold attention_dp times the blocks."""
    kv = scenario.kv
    layout = replica_layout(scenario, spec)
    gpus = layout.gpus
    drafter, draft_bytes = _drafter(scenario)
    per_token = spec.kv_bytes_per_token(kv.format)
    per_token_gpu = kv_bytes_per_token_per_gpu(spec, layout, kv.format)
    if drafter is not None:
        # the drafter keeps KV for every token too: charged per token, in the same blocks
        per_token += drafter.kv_bytes_per_token(kv.format)
        per_token_gpu += drafter.kv_bytes_per_token(kv.format) / gpus
    # a block lives on the GPUs of one attention data-parallel rank (all the replica's GPUs without one)
    block_bytes = kv.block_tokens * (per_token if gpus == 1 else per_token_gpu * layout.rank_gpus)
    offload = _offload(scenario, spec, hw)
    if offload is not None and gpus > 1:
        raise ConfigError(f"offload: offloading layers is modelled for one-GPU replicas only (parallel: "
                          f"{layout.describe()}); allowed: no offload, or parallel tp 1, pp 1")
    gpu_weights = weights_per_gpu(spec, layout, scenario.weight_format).total
    if gpus == 1:
        weight_bytes = spec.weight_bytes(scenario.weight_format) - (offload.net_freed_bytes if offload else 0)
        gpu_weights = weight_bytes
    else:
        weight_bytes = replica_weight_bytes(spec, layout, scenario.weight_format)
    if gpu_weights > hw.memory_bytes:  # no budget could make this run: refuse, don't flag it afterwards
        raise ConfigError(
            f"model: {spec.profile.name}'s {scenario.weight_format} weights need {gpu_weights / 2**30:.2f} GiB per GPU, "
            f"more than {hw.name}'s {hw.memory_bytes / 2**30:.2f} GiB; use a smaller weight_format, more GPUs "
            "(parallel: {tp: N}) or offload: {layers: N}" + _layout_hint(scenario, spec, hw))
    lora_bytes = 0
    if scenario.lora is not None:
        lora_bytes = scenario.lora.adapters * spec.lora_adapter_bytes(scenario.lora.rank, tuple(scenario.lora.targets),
                                                                     "bf16")
    budget, activation = _kv_budget(scenario, hw, gpu_weights, gpus, spec)
    # each attention data-parallel rank holds whole blocks of its own share (one rank without data parallelism)
    ranks = layout.attention_dp
    slots, state_pool, per_seq = _state_pool(scenario, spec, layout, budget - draft_bytes - lora_bytes, block_bytes)
    num_blocks = ranks * int((budget - draft_bytes - lora_bytes - state_pool) / ranks // block_bytes)
    if num_blocks < 1:
        taken = [f"{what} take {b / 2**30:,.2f} GiB of it" for what, b in (
            ("the drafter's weights (scheduler.speculative)", draft_bytes), ("the LoRA adapters (lora)", lora_bytes),
            ("the linear-attention state pool (kv.state_to_kv_ratio)", state_pool)) if b]
        raise ConfigError(f"kv.budget: {budget} B holds no {kv.block_tokens}-token block ({block_bytes} B each)"
                          + (f"; {' and '.join(taken)}" if taken else ""))
    host_blocks = int(kv.host_budget // block_bytes)
    if kv.host_budget and not host_blocks:  # it would swap nothing: every preemption silently a recompute
        raise ConfigError(f"kv.host_budget: {kv.host_budget} B holds no {kv.block_tokens}-token block ({block_bytes} B "
                          "each); give at least one block, or 0 for no host memory")
    if host_blocks and not hw.host_link_bytes_per_s:
        raise ConfigError(f"kv.host_budget: hardware {hw.name} has no host link bandwidth to swap over")
    return ReplicaMemory(per_token if gpus == 1 else per_token_gpu * layout.rank_gpus, block_bytes, weight_bytes, budget,
                         activation, draft_bytes, lora_bytes, num_blocks, host_blocks, offload, drafter, layout,
                         gpu_weights, per_token_gpu, budget // gpus, slots, state_pool, per_seq)


def _state_pool(scenario: Scenario, spec: ModelSpec, layout: Layout, cache_bytes: float,
                block_bytes: float) -> tuple[int | None, int, int]:
    """(slots, pool bytes, bytes per sequence) of the linear-attention state pool: kv.state_to_kv_ratio r of the KV
    pool's memory, r / (1 + r) of `cache_bytes`, in whole sequences' states (as SGLang's hybrid models split it);
    (None, 0, 0) for a model without linear-attention layers."""
    if spec.profile.linear_attention is None:
        if scenario.kv.state_to_kv_ratio != STATE_TO_KV_RATIO:  # it would be ignored: say so
            raise ConfigError(f"kv.state_to_kv_ratio: {scenario.kv.state_to_kv_ratio} on {spec.profile.name}, which has "
                              f"no linear-attention layers and so no state pool (allowed: {STATE_TO_KV_RATIO}, or leave "
                              "it out)")
        return None, 0, 0
    per_seq = (spec.state_bytes_per_sequence if layout.trivial
               else state_bytes_per_sequence_per_gpu(spec, layout) * layout.rank_gpus)
    r = scenario.kv.state_to_kv_ratio
    slots = layout.attention_dp * state_slots(cache_bytes / layout.attention_dp, per_seq, r)
    if slots < 1:
        raise ConfigError(f"kv.state_to_kv_ratio: {r} of the KV pool's memory holds no sequence's linear-attention "
                          f"state ({per_seq / 2**20:,.1f} MiB each over {layout.rank_gpus} GPU(s)); raise it, or give "
                          "kv.budget more memory")
    return slots, slots * per_seq, per_seq
