"""Schemas and loaders for profiles/: hardware cards, model architectures, fitted step-time models.

Pure pydantic: calibration imports this module to write fitted profiles, so it must not import
simpy or torch. The writer (calibration) and the reader (the simulator) share these classes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, ValidationInfo,
                      model_serializer, model_validator)

from sim.io.errors import ConfigError
from sim.io.schema import StrictModel, load_yaml_model

# ---------------------------------------------------------------------------------------------
# Hardware


class Sourced(StrictModel):
    """A number with where it came from."""

    value: float = Field(description="The value, in the unit the field name gives")
    source: str = Field(min_length=1, description="Where the number comes from (datasheet, page, measurement)")
    note: str | None = None


class OptionalSourced(StrictModel):
    """A number that may be unpublished (null), with where it came from."""

    value: float | None = Field(description="The value, or null when the card has none / it is unpublished")
    source: str = Field(min_length=1)
    note: str | None = None


class HostLink(StrictModel):
    """The link between host memory and the card (offload, swap)."""

    name: str = Field(description="e.g. 'PCIe 5.0 x16' or 'NVLink-C2C'")
    bandwidth_gbs_per_direction: OptionalSourced = Field(
        description="GB/s (1e9 B/s) in ONE direction; null for unified-memory SoCs")


class MeasuredCeilings(StrictModel):
    """What calibration measured on a real card (filled by `capsim calibrate`)."""

    matmul_tflops: PositiveFloat | None = Field(None, description="Large dense matmul in the profile dtype, TFLOP/s")
    copy_bandwidth_gbs: PositiveFloat | None = Field(None, description="Device-to-device copy, GB/s (read+write)")
    dtype: str | None = None
    source: str | None = Field(None, description="Calibration run that measured these numbers")


class HardwareProfile(StrictModel):
    """profiles/hardware/<name>.yaml: a card's memory, bandwidth, peaks and power, each with its source."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]*$", description="Equals the file stem")
    vendor: str
    description: str
    memory_gb: Sourced = Field(description="Device memory, GB (1e9 B)")
    memory_reported_gb: OptionalSourced | None = Field(
        None, description="Total memory the driver reports (nvidia-smi, cudaMemGetInfo), GB (1e9 B), where it differs "
                          "from memory_gb (the 80 GB of an H100 are 80 GiB): what an engine's memory fraction "
                          "multiplies. Used by the published replays (sim/published); absent: memory_gb")
    memory_bandwidth_gbs: Sourced = Field(description="Peak DRAM bandwidth, GB/s")
    bf16_dense_tflops: Sourced = Field(description="Dense BF16/FP16 peak, TFLOP/s, no sparsity")
    fp8_dense_tflops: OptionalSourced | None = None
    fp4_dense_tflops: OptionalSourced | None = Field(None, description="Dense NVFP4 peak, TFLOP/s (Blackwell)")
    tdp_w: OptionalSourced = Field(description="Board power cap, W (null when unpublished)")
    idle_w: OptionalSourced | None = Field(None, description="Idle power, W, for the busy/idle energy model")
    host_link: HostLink
    kv_transfer_link: HostLink | None = Field(
        None, description="Scale-out link per GPU (NIC) that disaggregated prefill pools send KV to decode pools over; "
                          "absent: a disaggregated scenario gives disaggregation.link.bandwidth_gbs")
    scale_up_gpus: OptionalSourced | None = Field(
        None, description="GPUs one collective reaches over the card's NVLink / NVSwitch domain (an HGX board's 8, an "
                          "NVL72 rack's 72): collectives over more GPUs than the kernel tables measure are scaled up to "
                          "it (sim.models.collectives); absent: only the measured GPU counts")
    scale_out_link: HostLink | None = Field(
        None, description="Per-GPU network link (NIC) that collectives spanning several scale-up domains cross "
                          "(sim.models.collectives); absent: a replica stays within one domain")
    unified_memory: bool = Field(False, description="CPU and accelerator share one memory (Apple, GH200's LPDDR side not counted)")
    measured: MeasuredCeilings = Field(default_factory=MeasuredCeilings)

    @model_validator(mode="after")
    def _positive(self):
        for field in ("memory_gb", "memory_reported_gb", "memory_bandwidth_gbs", "bf16_dense_tflops",
                      "fp8_dense_tflops", "fp4_dense_tflops", "tdp_w", "idle_w"):
            v = getattr(self, field)
            if v is not None and v.value is not None and not v.value > 0 and not (field == "idle_w" and v.value == 0):
                raise ValueError(f"{field}.value must be > 0, got {v.value}")
        link = self.host_link.bandwidth_gbs_per_direction.value
        if link is not None and not link > 0:
            raise ValueError(f"host_link.bandwidth_gbs_per_direction.value must be > 0 (or null), got {link}")
        up = self.scale_up_gpus.value if self.scale_up_gpus is not None else None
        if up is not None and not (up >= 2 and float(up).is_integer()):
            raise ValueError(f"scale_up_gpus.value must be a whole number of GPUs >= 2 (or null), got {up:g}")
        out = self.scale_out_link.bandwidth_gbs_per_direction.value if self.scale_out_link is not None else None
        if out is not None and not out > 0:
            raise ValueError(f"scale_out_link.bandwidth_gbs_per_direction.value must be > 0 (or null), got {out}")
        return self

    @property
    def memory_bytes(self) -> int:
        return int(round(self.memory_gb.value * 1e9))

    @property
    def reported_memory_bytes(self) -> int:
        """The total an engine sizes its memory from: memory_reported_gb where given, else memory_gb."""
        reported = self.memory_reported_gb
        if reported is None or reported.value is None:
            return self.memory_bytes
        return int(round(reported.value * 1e9))

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return self.memory_bandwidth_gbs.value * 1e9

    def peak_flops_per_s(self, dtype: str = "bf16") -> float:
        """The dense peak in FLOP/s for `dtype` (bf16/fp16, or fp8 / nvfp4 when the card has one)."""
        if dtype in ("bf16", "fp16"):
            return self.bf16_dense_tflops.value * 1e12
        field = {"fp8": "fp8_dense_tflops", "nvfp4": "fp4_dense_tflops"}.get(dtype)
        if field is None:
            raise ConfigError(f"hardware {self.name}: no peak for dtype {dtype!r}; known: bf16, fp16, fp8, nvfp4")
        peak = getattr(self, field)
        if peak is None or peak.value is None:
            raise ConfigError(f"hardware {self.name}: no {dtype.upper()} dense peak in its profile ({field})")
        return peak.value * 1e12

    @property
    def host_link_bytes_per_s(self) -> float | None:
        v = self.host_link.bandwidth_gbs_per_direction.value
        return None if v is None else v * 1e9


# ---------------------------------------------------------------------------------------------
# Models


class MoESpec(StrictModel):
    """Mixture-of-experts layers: routed and shared experts, top-k."""

    num_experts: PositiveInt = Field(description="Routed experts per MoE layer")
    experts_per_token: PositiveInt = Field(description="Routed experts each token uses (top-k)")
    expert_intermediate_size: PositiveInt = Field(description="FFN width of one routed expert")
    num_shared_experts: NonNegativeInt = Field(0, description="Always-on experts per MoE layer")
    num_dense_layers: NonNegativeInt = Field(0, description="Leading layers with a dense FFN (DeepSeek first_k_dense_replace)")

    @model_validator(mode="after")
    def _topk(self):
        if self.experts_per_token > self.num_experts:
            raise ValueError(f"moe.experts_per_token ({self.experts_per_token}) exceeds "
                             f"moe.num_experts ({self.num_experts})")
        return self


class MLASpec(StrictModel):
    """Multi-head latent attention (DeepSeek-V2/V3): KV cache holds a compressed latent."""

    kv_lora_rank: PositiveInt
    q_lora_rank: PositiveInt | None = None
    qk_nope_head_dim: PositiveInt
    qk_rope_head_dim: PositiveInt
    v_head_dim: PositiveInt


class LinearAttentionSpec(StrictModel):
    """Linear-attention layers (Gated DeltaNet: Qwen3-Next, Qwen3.5): no KV cache; each sequence keeps a fixed state
    per layer instead, a short convolution's last inputs and a key x value matrix per value head."""

    kind: Literal["gated_delta_net"] = "gated_delta_net"
    layers: PositiveInt = Field(description="How many layers are linear-attention ones (Qwen3.5: three of every four, "
                                            "full_attention_interval 4); the rest attend to the whole context")
    num_key_heads: PositiveInt = Field(description="linear_num_key_heads")
    num_value_heads: PositiveInt = Field(description="linear_num_value_heads")
    key_head_dim: PositiveInt = Field(description="linear_key_head_dim")
    value_head_dim: PositiveInt = Field(description="linear_value_head_dim")
    conv_kernel: PositiveInt = Field(description="linear_conv_kernel_dim: the short convolution's width")
    state_format: Literal["fp32", "bf16"] = Field(
        "fp32", description="The recurrent state's element type (mamba_ssm_dtype; SGLang's --mamba-ssm-dtype default "
                            "float32); the convolution state is kept in BF16")

    @model_validator(mode="after")
    def _heads(self):
        if self.num_value_heads % self.num_key_heads:
            raise ValueError(f"linear_attention.num_value_heads ({self.num_value_heads}) must be a multiple of "
                             f"linear_attention.num_key_heads ({self.num_key_heads})")
        return self


class ModelProfile(StrictModel):
    """profiles/models/<name>.yaml: a model's architecture, from its published config."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]*$", description="Equals the file stem")
    hf_id: str
    family: Literal["llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe", "deepseek_v3", "minimax_m2",
                    "gpt_oss", "qwen3_5_moe"]
    num_layers: PositiveInt
    hidden_size: PositiveInt
    intermediate_size: PositiveInt = Field(description="Dense FFN width (gated: gate, up, down)")
    num_attention_heads: PositiveInt
    num_kv_heads: PositiveInt
    head_dim: PositiveInt
    vocab_size: PositiveInt
    tie_word_embeddings: bool
    qkv_bias: bool = False
    qk_norm: bool = Field(False, description="RMSNorm on q and k per head (Qwen3)")
    qk_norm_span: Literal["head", "layer"] = Field(
        "head", description="What one q / k norm spans: each head (Qwen3), or all heads of the layer (MiniMax-M2's "
                            "qk_norm_type per_layer), whose mean square under tensor parallelism needs one all-reduce "
                            "per layer of 2 FP32 values a token (vLLM's MiniMaxText01RMSNormTP.forward_qk)")
    max_position_embeddings: PositiveInt
    sliding_window: PositiveInt | None = Field(
        None, description="Tokens each query of a windowed layer attends to (its own and the ones before it); "
                          "None: every layer attends to the whole context")
    sliding_window_layers: NonNegativeInt = Field(
        0, description="How many layers attend within sliding_window (gpt-oss: every other one); the rest attend "
                       "to the whole context")
    attention_output_gate: bool = Field(
        False, description="A sigmoid gate on each attention head's output, projected with the queries (Qwen3-Next, "
                           "Qwen3.5 attn_output_gate): q_proj is twice as wide")
    linear_attention: LinearAttentionSpec | None = None
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    source: str = Field(min_length=1, description="Where the architecture numbers come from")

    @model_validator(mode="after")
    def _heads(self):
        if self.mla is None and self.num_attention_heads % self.num_kv_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads})")
        if (self.sliding_window is None) != (self.sliding_window_layers == 0):
            raise ValueError("sliding_window and sliding_window_layers go together: give both (the window in tokens "
                             "and how many layers use it) or neither")
        if self.sliding_window_layers > self.num_layers:
            raise ValueError(f"sliding_window_layers ({self.sliding_window_layers}) exceeds num_layers "
                             f"({self.num_layers})")
        if self.sliding_window_layers and self.mla is not None:
            raise ValueError("sliding_window_layers: windowed MLA layers are not modelled (allowed: 0 with mla)")
        lin = self.linear_attention
        if lin is not None:
            if lin.layers >= self.num_layers:
                raise ValueError(f"linear_attention.layers ({lin.layers}) must be below num_layers ({self.num_layers}): "
                                 "a model without a full-attention layer is not modelled")
            if self.mla is not None or self.sliding_window_layers:
                raise ValueError("linear_attention: not modelled together with mla or sliding_window_layers")
        return self


# ---------------------------------------------------------------------------------------------
# Step-time models (shared by scenarios and by fitted profiles)


class ShapeCache(StrictModel):
    """An engine that builds a kernel for each batch token count and keeps only the `entries` most recently
    used (vLLM 0.32's CPU build: a oneDNN primitive cache of 32 shapes per linear layer,
    vllm/model_executor/layers/utils.py `create_onednn_mm(weight, 32)`) pays, in an iteration whose token
    count is not among them, miss_s + per_miss_token_s x its tokens on top of the linear model's time.
    Each replica's engine starts with an empty cache."""

    entries: PositiveInt = Field(description="Shapes (batch token counts) the engine keeps built, least recently "
                                             "used evicted first")
    miss_s: NonNegativeFloat = 0.0
    per_miss_token_s: NonNegativeFloat = 0.0


class LinearStepTime(StrictModel):
    """T = constant + per_new_token * tokens + per_pair * causal pairs + per_kv_token * KV tokens read
    + per_sequence * sequences + per_decode_sequence * decode sequences
    + per_prefill_completion * prompts completed (sampling their first token), all summed over the batch;
    with per_shared_kv_token, the KV tokens of prefix-cache hits cost that instead of per_kv_token."""

    kind: Literal["linear"] = "linear"
    constant_s: NonNegativeFloat = 0.0
    per_new_token_s: float = 0.0
    per_pair_s: float = 0.0
    per_kv_token_s: float = Field(0.0, description="Per context token read from KV by the iteration")
    per_sequence_s: float = 0.0
    per_decode_sequence_s: float = 0.0
    per_prefill_completion_s: NonNegativeFloat = Field(
        0.0, description="Per sequence whose prompt completes in the iteration (its last prefill chunk, after "
                         "which it samples its first token); optional, 0 when the data cannot tell completions apart")
    shape_cache: ShapeCache | None = Field(None, description="Optional: the time of building a kernel for a batch "
                                                             "token count the engine has not kept (ShapeCache)")
    per_shared_kv_token_s: NonNegativeFloat | None = Field(
        None, description="Optional: per KV token read from a sequence's prefix-cache hits (blocks another request "
                          "computed, read by several sequences: on a CPU they stay in cache) in place of "
                          "per_kv_token_s; absent: they cost per_kv_token_s like any other KV token")
    shared_kv_form: Literal["rereads", "hits"] = Field(
        "rereads", description="Which hit tokens per_shared_kv_token_s prices: rereads (those another sequence of "
                               "the iteration reads too, every reader but the first) or hits (every one read)")

    @model_serializer(mode="wrap")
    def _omit_optional_terms(self, handler):
        """A profile or scenario without the optional terms dumps exactly as before they existed."""
        data = handler(self)
        if isinstance(data, dict):
            if not self.per_prefill_completion_s:
                data.pop("per_prefill_completion_s", None)
            if self.shape_cache is None:
                data.pop("shape_cache", None)
            if self.per_shared_kv_token_s is None:
                data.pop("per_shared_kv_token_s", None)
            if self.shared_kv_form == "rereads":
                data.pop("shared_kv_form", None)
        return data

    @model_validator(mode="before")
    @classmethod
    def _stated(cls, data, info: ValidationInfo):
        """In a file, the three coefficients every fit has must be written out: a missing one would
        silently be 0 (and a profile without them prints 0.00 ms latencies)."""
        if info.context and info.context.get("from_file") and isinstance(data, dict):
            missing = [k for k in _REQUIRED_LINEAR if k not in data]
            if missing:
                raise ValueError(f"a linear step-time model needs {', '.join(_REQUIRED_LINEAR)}; missing "
                                 f"{', '.join(missing)} (write 0.0 for a term that is really zero)")
        return data

    @model_validator(mode="after")
    def _takes_time(self):
        one = (self.constant_s + self.per_new_token_s + self.per_pair_s + self.per_kv_token_s + self.per_sequence_s
               + self.per_decode_sequence_s)
        if not one > 0:
            raise ValueError(f"a one-token step would take {one:g} s: at least one coefficient must make a step "
                             "take time (constant_s, per_new_token_s, ...)")
        return self


_REQUIRED_LINEAR = ("constant_s", "per_new_token_s", "per_pair_s")


class TablePoint(StrictModel):
    """One measured decode iteration: bytes read and its time."""

    bytes: PositiveFloat = Field(description="Weights + KV bytes read by a decode iteration")
    time_s: PositiveFloat


class MFUPoint(StrictModel):
    """Measured prefill efficiency at a number of new tokens."""

    new_tokens: PositiveInt = Field(description="Prefill tokens in the iteration")
    mfu: Annotated[float, Field(gt=0, le=1)]


class PrefillOverride(StrictModel):
    """A measured prefill iteration that replaces the FLOPs/MFU estimate when the shape matches."""

    sequences: PositiveInt
    new_tokens_per_sequence: PositiveInt
    cached_tokens_per_sequence: NonNegativeInt = 0
    time_s: PositiveFloat
    source: str | None = None


class EfficiencyStepTime(StrictModel):
    """Roofline with measured efficiencies (reference section 9's schemes A-D).

    decode part: interpolate `decode_table` on weight + KV bytes read by the decode sequences;
    prefill part: prefill FLOPs / (peak FLOP/s x MFU), MFU constant or interpolated on new tokens,
    unless a `prefill_overrides` entry matches the exact shape. A mixed iteration costs the sum, or with
    `mixed: one_pass` one forward pass (sim.models.step_time.EfficiencyModel.one_pass_s).
    """

    kind: Literal["efficiency"] = "efficiency"
    decode_table: list[TablePoint] = Field(min_length=1)
    prefill_mfu: Annotated[float, Field(gt=0, le=1)] | list[MFUPoint]
    prefill_overrides: list[PrefillOverride] = Field(default_factory=list)
    peak_tflops: PositiveFloat | None = Field(None, description="Defaults to the scenario hardware's dense peak")
    mixed: Literal["sum", "one_pass"] | None = Field(
        None, description="Decodes + prefill chunks in one iteration: sum of both parts (default, null) or one pass")

    @model_validator(mode="after")
    def _sorted(self):
        xs = [p.bytes for p in self.decode_table]
        if xs != sorted(xs) or len(set(xs)) != len(xs):
            raise ValueError("decode_table: bytes must be strictly increasing")
        if isinstance(self.prefill_mfu, list):
            ns = [p.new_tokens for p in self.prefill_mfu]
            if ns != sorted(ns) or len(set(ns)) != len(ns):
                raise ValueError("prefill_mfu: new_tokens must be strictly increasing")
        return self


class ValidRange(StrictModel):
    """Shapes a fitted model was calibrated on; outside them the simulator refuses to extrapolate."""

    max_batch: PositiveInt
    max_new_tokens: PositiveInt = Field(description="Most new tokens in one iteration")
    max_context_tokens: PositiveInt = Field(description="Longest context of any sequence")


class ProfileLayout(StrictModel):
    """The replica layout a profile's times are for (sim.models.parallel.Layout's tp, pp, ep)."""

    tp: PositiveInt = 1
    pp: PositiveInt = 1
    ep: PositiveInt = 1


class FitSummary(StrictModel):
    """A fit's held-out error and size."""

    n_points: PositiveInt
    n_heldout: NonNegativeInt
    mape: NonNegativeFloat = Field(description="Held-out mean absolute percentage error, fraction (0.05 = 5%)")
    max_abs_rel_err: NonNegativeFloat
    r2: float | None = None


class Provenance(StrictModel):
    """Where a fitted profile came from: the command, device, software and raw points."""

    source: str = Field(min_length=1, description="What produced the numbers")
    date: str | None = None
    device_name: str | None = None
    torch_version: str | None = None
    driver_version: str | None = None
    git_commit: str | None = None
    grid: str | None = None
    points_csv: str | None = Field(None, description="Raw points, relative to the profile file")
    notes: str | None = None


class FittedProfile(StrictModel):
    """profiles/fitted/<device>__<model>__<dtype>[__graphs].yaml: written by calibration, read by sim."""

    schema_version: Literal[1] = 1
    model: str
    hardware: str | None = Field(None, description="Hardware profile name, when the card has one")
    dtype: Literal["bf16", "fp16", "fp32", "fp8", "nvfp4"]
    cuda_graphs: bool = False
    layers_timed: PositiveInt | None = Field(None, description="Layers actually run when the model did not fit; times scaled")
    linear: LinearStepTime | None = None
    efficiency: EfficiencyStepTime | None = None
    valid_range: ValidRange
    parallel: ProfileLayout | None = Field(None, description="Replica layout its times are for (composed profiles "
                                                             "say it; a scenario on another layout is refused). "
                                                             "Absent: not stated")
    fit: FitSummary | None = None
    composed_from: str | None = Field(None, description="Kernel table set (profiles/ops) a composed profile was fitted "
                                                        "to (capsim profile compose): its fit error is against that "
                                                        "composition, not a measurement")
    provenance: Provenance

    @model_validator(mode="after")
    def _some_model(self):
        if self.linear is None and self.efficiency is None:
            raise ValueError("a fitted profile needs `linear`, `efficiency` or both")
        return self


# ---------------------------------------------------------------------------------------------
# Locating and loading


def profiles_dir() -> Path:
    """profiles/ of this checkout, or $CAPSIM_PROFILES."""
    env = os.environ.get("CAPSIM_PROFILES")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "profiles"


def known_names(kind: str) -> list[str]:
    """Profile names (file stems) under profiles/<kind>."""
    return sorted(p.stem for p in (profiles_dir() / kind).glob("*.yaml"))


def _load_named(kind: str, cls, name_or_path: str | os.PathLike):
    text = str(name_or_path)
    if text.endswith((".yaml", ".yml")) or os.sep in text:
        path = Path(text)
    else:
        path = profiles_dir() / kind / f"{text}.yaml"
        if not path.exists():
            known = ", ".join(known_names(kind))
            raise ConfigError(f"unknown {kind[:-1] if kind != 'hardware' else kind} {text!r}; known: {known}")
    obj = load_yaml_model(cls, path)
    if hasattr(obj, "name") and obj.name != path.stem:
        raise ConfigError(f"{path}: name: {obj.name!r} must equal the file stem {path.stem!r}")
    return obj


def load_hardware(name_or_path: str | os.PathLike) -> HardwareProfile:
    """A hardware profile by name (profiles/hardware) or YAML path."""
    return _load_named("hardware", HardwareProfile, name_or_path)


def load_model(name_or_path: str | os.PathLike) -> ModelProfile:
    """A model profile by name (profiles/models) or YAML path."""
    return _load_named("models", ModelProfile, name_or_path)


def load_fitted(path: str | os.PathLike) -> FittedProfile:
    """A fitted step-time profile from its YAML file."""
    return load_yaml_model(FittedProfile, path)
