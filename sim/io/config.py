"""Scenario schema: what `capsim run` reads. Strict: unknown keys and wrong types are errors."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (Discriminator, Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, Tag,
                      field_validator, model_validator)

from sim.io.errors import ConfigError
from sim.core.cluster import ClusterConfig
from sim.core.disagg_config import DisaggregationConfig
from sim.io.profiles import EfficiencyStepTime, LinearStepTime
from sim.io.ops_schema import OpsStepTime
from sim.io.parallel_schema import ParallelConfig
from sim.core.schedulers import AnySchedulerConfig
from sim.io.schema import StrictModel, parse_yaml, read_yaml_mapping, validate_mapping
from sim.io.units import parse_bytes
from sim.models.memory import STATE_TO_KV_RATIO

# Upper bounds: far beyond any real deployment, low enough that a typo (1e30, 2**63) is refused with
# its field named instead of overflowing NumPy or running for ever.
MAX_TOKENS = 100_000_000
"""Most tokens in one prompt or output (100M: 10x the longest context window of any model)."""
MAX_REQUESTS = 100_000_000
"""Most requests one workload generates (100M: 100x the benchmarks' largest run)."""
Tokens = Annotated[int, Field(gt=0, le=MAX_TOKENS)]
MAX_START_S = 1e9
"""A workload's latest start (about 32 years): the clock is a float, so at 1e12 s its resolution (0.1 ms) would already
round inter-token gaps of milliseconds."""
StartTime = Annotated[float, Field(ge=0.0, le=MAX_START_S)]

# ---- step time -------------------------------------------------------------------------------


class ProfileStepTime(StrictModel):
    """Step times from a fitted profile file (written by capsim calibrate or capsim fit)."""

    kind: Literal["profile"] = "profile"
    path: str = Field(description="Fitted profile YAML, relative to the scenario file or the repo's profiles/fitted/")
    use: Literal["linear", "efficiency"] = Field("linear", description="Which of the profile's models to use")


class StepTimeConfig(StrictModel):
    """The scenario's step-time model, CUDA-graph padding and extrapolation policy."""

    model: Annotated[Union[LinearStepTime, EfficiencyStepTime, ProfileStepTime, OpsStepTime],
                     Field(discriminator="kind")]
    graph_sizes: list[PositiveInt] | None = Field(None, description="Captured CUDA-graph batch sizes; decode batches pad up")
    allow_extrapolation: bool = Field(False, description="Allow shapes beyond a fitted profile's valid_range (warns once)")
    scale: PositiveFloat = Field(1.0, description="Multiply the step-time model's time of every iteration (not the "
                                                  "draft, swap, conversion or adapter-load times added to it): how an "
                                                  "answer moves with the model's error (1.1 = steps 10% slower)")


# ---- KV cache --------------------------------------------------------------------------------


class UtilizationBudget(StrictModel):
    """vLLM's way of sizing KV: a fraction of the card minus weights and workspace."""

    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.9
    activation_bytes: NonNegativeInt = Field(0, description="Activation / CUDA-graph workspace")
    other_bytes: NonNegativeInt = 0

    @field_validator("activation_bytes", "other_bytes", mode="before")
    @classmethod
    def _sizes(cls, v):
        return parse_bytes(v)


def _budget_kind(v) -> str:
    # a mapping when validating, the model itself when serializing (else pydantic warns and guesses)
    return "utilization" if isinstance(v, (dict, UtilizationBudget)) else "bytes"


class KVConfig(StrictModel):
    """The paged KV cache: block size, format, budget, admission, prefix caching, eviction, swap."""

    block_tokens: Annotated[int, Field(gt=0, le=65536, description="Tokens per KV block (vLLM: 16)")] = 16
    format: Literal["fp32", "bf16", "fp16", "fp8", "q8_0", "q4_0"] = "bf16"
    budget: Annotated[Union[Annotated[int, Tag("bytes")], Annotated[UtilizationBudget, Tag("utilization")]],
                      Discriminator(_budget_kind)] = Field(
        description="Bytes (12GiB, 12GB, 12884901888) or a utilization budget")
    admission: Literal["reserve", "on_demand"] = Field(
        "reserve", description="reserve prompt + max output at admission, or grow block by block and preempt")
    prefix_caching: bool = Field(True, description="Reuse cached KV of identical token prefixes (vLLM's default)")
    prefix_index: Literal["all", "foresight"] = Field(
        "all", description="Which full blocks the prefix cache keeps: all (vLLM: every full block, LRU) or "
                                 "foresight (only blocks a later request will match: an upper bound, it needs the future)")
    eviction: Literal["lru", "value"] = Field(
        "lru", description="Which cached-free block to drop first: least recently used, or lowest value per byte")
    preemption: Literal["recompute", "swap"] = Field(
        "recompute", description="on_demand preemption: drop KV and recompute, or swap it to the host tier")
    host_budget: int = Field(0, ge=0, description="Host-memory tier for swapped KV (bytes, e.g. 64GiB)")
    snapshot_tokens: PositiveInt | None = Field(
        None, description="Hybrid (recurrent) models: state snapshots every N tokens; reuse rounds down to one")
    state_to_kv_ratio: PositiveFloat = Field(
        STATE_TO_KV_RATIO, description="Models with linear-attention layers: the memory of the pool of their fixed "
                                       "per-sequence state, relative to the KV pool's (SGLang's --mamba-full-memory-"
                                       "ratio, default 0.9); its slots "
                         "cap the requests running at once")
    warm_prefixes: list["NamedPrefix"] = Field(default_factory=list, description="Prefixes cached before arrivals")
    conversion_s_per_token: NonNegativeFloat = Field(
        0.0, description="Time to convert (dequantise) one KV token read, per iteration (reference section 7)")

    @field_validator("host_budget", mode="before")
    @classmethod
    def _host(cls, v):
        return parse_bytes(v)

    @model_validator(mode="after")
    def _swap_needs_host(self):
        if self.preemption == "swap" and self.host_budget == 0:
            raise ValueError("kv.preemption swap needs kv.host_budget > 0 (the host tier's size)")
        if self.warm_prefixes and not self.prefix_caching:
            raise ValueError("kv.warm_prefixes are cached before arrivals, but kv.prefix_caching is false: nothing "
                             "would reuse them")
        return self

    @field_validator("budget", mode="before")
    @classmethod
    def _budget(cls, v):
        if isinstance(v, dict):
            return v
        return parse_bytes(v)


# ---- workloads -------------------------------------------------------------------------------


class NamedPrefix(StrictModel):
    """The first `tokens` tokens of every prompt naming it are identical (a system prompt)."""

    name: str = Field(min_length=1)
    tokens: Tokens


class ExplicitRequest(StrictModel):
    """One request written out in the scenario."""

    arrival_s: NonNegativeFloat
    prompt_tokens: Tokens
    output_tokens: Tokens
    outside_wait_s: NonNegativeFloat = Field(0.0, description="Wait before reaching the engine (counted in latency)")
    cancel_at_s: NonNegativeFloat | None = None
    deadline_s: PositiveFloat | None = None
    prefix: NamedPrefix | None = Field(None, description="A shared prefix the prompt starts with")
    context_of: NonNegativeInt | None = Field(
        None, description="Multi-turn: index of an earlier request whose prompt + outputs this prompt starts with")
    n: PositiveInt = Field(1, description="Parallel sampling: branches over one prompt (each a request)")
    adapter: NonNegativeInt | None = Field(None, description="LoRA adapter id (needs the scenario's lora)")

    @model_validator(mode="after")
    def _prefix_fits(self):
        if self.prefix is not None and self.prefix.tokens > self.prompt_tokens:
            raise ValueError(f"prefix.tokens ({self.prefix.tokens}) exceeds prompt_tokens ({self.prompt_tokens})")
        if self.prefix is not None and self.context_of is not None:
            raise ValueError("give either prefix or context_of, not both")
        if self.cancel_at_s is not None and self.cancel_at_s < self.arrival_s:
            raise ValueError(f"cancel_at_s ({self.cancel_at_s}) is before arrival_s ({self.arrival_s}): a client "
                             "cancels a request it has sent")
        return self


class RequestList(StrictModel):
    """A workload of explicitly listed requests."""

    kind: Literal["requests"] = "requests"
    requests: list[ExplicitRequest] = Field(min_length=1)


class Fixed(StrictModel):
    """Every request the same length."""

    kind: Literal["fixed"] = "fixed"
    value: Tokens


class Uniform(StrictModel):
    """Lengths drawn uniformly from [low, high]."""

    kind: Literal["uniform"] = "uniform"
    low: Tokens
    high: Tokens

    @model_validator(mode="after")
    def _order(self):
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self


class LogNormal(StrictModel):
    """Rounded exp(N(log(median), sigma)), clipped to [min, max]."""

    kind: Literal["lognormal"] = "lognormal"
    median: Annotated[float, Field(gt=0, le=MAX_TOKENS)]
    sigma: Annotated[float, Field(ge=0, le=20)]
    min: Tokens = 1
    max: Tokens = 1_000_000

    @model_validator(mode="after")
    def _order(self):
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self


class Empirical(StrictModel):
    """Draws with replacement from a column of a CSV file (path relative to the scenario)."""

    kind: Literal["empirical"] = "empirical"
    path: str
    column: str


LengthDist = Annotated[Union[Fixed, Uniform, LogNormal, Empirical], Field(discriminator="kind")]

MIN_RATE_RPS = 1e-6
"""The slowest arrival rate a scenario takes (and the lowest a plan's search tries)."""

Rate = Annotated[float, Field(ge=MIN_RATE_RPS, description="Requests per second, at least 1e-6 (one in 11.6 days): slower "
                                                   "runs last so long that the clock's float loses its milliseconds")]


class Poisson(StrictModel):
    """Poisson arrivals at rate_rps."""

    kind: Literal["poisson"] = "poisson"
    rate_rps: Rate


class GammaArrivals(StrictModel):
    """Gamma inter-arrival times with mean 1/rate; burstiness is the shape (1 = Poisson, < 1 burstier),
    as in `vllm bench serve --burstiness`."""

    kind: Literal["gamma"] = "gamma"
    rate_rps: Rate
    burstiness: PositiveFloat


class ConstantRate(StrictModel):
    """Evenly spaced arrivals at rate_rps."""

    kind: Literal["constant"] = "constant"
    rate_rps: Rate


class AllAtOnce(StrictModel):
    """Every request arrives at start_s."""

    kind: Literal["all_at_once"] = "all_at_once"


ArrivalDist = Annotated[Union[Poisson, GammaArrivals, ConstantRate, AllAtOnce], Field(discriminator="kind")]


class SharedPrefixes(StrictModel):
    """Every prompt starts with one of `groups` shared prefixes of `tokens` tokens (drawn uniformly);
    prompt_tokens then counts the private part after it."""

    tokens: Tokens
    groups: PositiveInt = 1


class AdapterMix(StrictModel):
    """Requests spread over `count` LoRA adapters: uniformly or Zipf-like (weight 1 / rank^s)."""

    count: PositiveInt
    distribution: Literal["uniform", "zipf"] = "uniform"
    zipf_s: PositiveFloat = 1.0


class Synthetic(StrictModel):
    """num_requests drawn from arrival and length distributions."""

    kind: Literal["synthetic"] = "synthetic"
    num_requests: Annotated[int, Field(gt=0, le=MAX_REQUESTS)]
    arrival: ArrivalDist
    prompt_tokens: LengthDist
    output_tokens: LengthDist
    start_s: StartTime = 0.0
    shared_prefix: SharedPrefixes | None = None
    adapters: AdapterMix | None = None


class Trace(StrictModel):
    """A trace file: Azure LLM 2023 CSV, Mooncake JSONL, or plain CSV/JSONL
    (arrival_s, prompt_tokens, output_tokens). Path relative to the scenario file."""

    kind: Literal["trace"] = "trace"
    path: str
    format: Literal["azure", "mooncake", "csv", "jsonl"]
    window_s: tuple[NonNegativeFloat, PositiveFloat] | None = Field(None, description="[start, end) in trace seconds")
    rate_scale: PositiveFloat = Field(1.0, description="2.0 = arrivals twice as fast (timestamps / 2)")
    max_requests: PositiveInt | None = None
    trace_block_tokens: PositiveInt = Field(
        512, description="Tokens per hash id in a Mooncake trace (512 in the FAST'25 release)")

    @field_validator("window_s", mode="before")
    @classmethod
    def _pair(cls, v):
        return tuple(v) if isinstance(v, list) else v  # YAML has no tuples: [start, end] is a list

    @model_validator(mode="after")
    def _window(self):
        if self.window_s and self.window_s[1] <= self.window_s[0]:
            raise ValueError(f"window_s end ({self.window_s[1]}) must be after its start ({self.window_s[0]})")
        if self.trace_block_tokens != 512 and self.format != "mooncake":
            raise ValueError(f"trace_block_tokens ({self.trace_block_tokens}) is for format mooncake (hash ids of "
                             f"blocks); a {self.format} trace has none")
        return self


class ClosedLoop(StrictModel):
    """`users` clients, each sending its next request when its previous one has left (finished,
    rejected, failed or cancelled), after a think time: `vllm bench serve --max-concurrency`,
    genai-perf's concurrency mode. The first wave goes out together at start_s, or spread over ramp_up_s:
    evenly (user u starts at start_s + u x ramp_up_s / users) or, with ramp_phases random, each user at a
    uniformly random time in [start_s, start_s + ramp_up_s) drawn from the scenario seed."""

    kind: Literal["closed_loop"] = "closed_loop"
    users: PositiveInt = Field(description="Concurrent clients (the benchmark's concurrency)")
    num_requests: Annotated[int, Field(gt=0, le=MAX_REQUESTS)] = Field(description="Requests sent in all, over all users")
    prompt_tokens: LengthDist
    output_tokens: LengthDist
    think_time_s: NonNegativeFloat = Field(0.0, description="Mean pause between a reply and the user's next request")
    think_distribution: Literal["fixed", "exponential"] = "fixed"
    start_s: StartTime = 0.0
    ramp_up_s: NonNegativeFloat = Field(0.0, description="Spread the users' first requests over this long")
    ramp_phases: Literal["even", "random"] = Field(
        "even", description="even: user u starts at start_s + u x ramp_up_s / users; random: each user at a uniformly "
                            "random time within ramp_up_s (from the scenario seed)")

    @model_validator(mode="after")
    def _ramp(self):
        if self.ramp_phases == "random" and self.ramp_up_s == 0:
            raise ValueError("ramp_phases random draws each user's start within ramp_up_s, which is 0: give "
                             "ramp_up_s > 0")
        return self


WorkloadConfig = Annotated[Union[RequestList, Synthetic, Trace, ClosedLoop], Field(discriminator="kind")]

# ---- service objectives, accuracy, power ---------------------------------------------------------


class SLOConfig(StrictModel):
    """Service-level objectives: a request is good when it meets every bound given."""

    ttft_s: PositiveFloat | None = None
    itl_s: PositiveFloat | None = Field(None, description="Bound on each request's max (or p99) inter-token gap")
    itl_stat: Literal["max", "p99"] = "max"
    e2e_s: PositiveFloat | None = Field(None, description="End-to-end deadline from scheduled arrival")


class AdmissionControl(StrictModel):
    """Whether the engine turns away requests that can no longer meet their deadline."""

    reject_late: bool = Field(False, description="Reject a request whose e2e deadline can no longer be met")


class AccuracyConfig(StrictModel):
    """The chance an answer is right, and retries of wrong ones."""

    p_correct: Annotated[float, Field(ge=0, le=1)] = 1.0
    max_retries: NonNegativeInt = Field(0, description="Re-enqueue a wrong answer up to this many times")

    @property
    def retries(self) -> bool:
        """Whether a wrong answer is ever sent again (its prompt a second time: the same tokens)."""
        return self.max_retries > 0 and self.p_correct < 1


class PowerConfig(StrictModel):
    """cap: the card draws its power cap for the whole window; idle_busy: busy_w while iterating."""

    model: Literal["cap", "idle_busy"] = "cap"
    busy_w: PositiveFloat | None = None
    idle_w: NonNegativeFloat | None = None

    @model_validator(mode="after")
    def _watts(self):
        if self.model == "idle_busy" and (self.busy_w is None or self.idle_w is None):
            raise ValueError("power.model idle_busy needs power.busy_w and power.idle_w")
        if self.model == "cap" and (self.busy_w is not None or self.idle_w is not None):
            raise ValueError("power.model cap draws the card's power cap: busy_w and idle_w are for model idle_busy")
        if self.model == "idle_busy" and self.idle_w > self.busy_w:
            raise ValueError(f"power.idle_w ({self.idle_w} W) exceeds power.busy_w ({self.busy_w} W)")
        return self


class OffloadConfig(StrictModel):
    """Keep the dense FFNs of `layers` layers in host memory and stream them in every step."""

    layers: PositiveInt
    prefetch_buffers: Literal[1, 2] = Field(2, description="1 serialises copy and compute; 2 overlap them")


class LoRAConfig(StrictModel):
    """LoRA adapters resident with the model, and their cost."""

    adapters: PositiveInt = Field(description="Adapters resident in GPU memory")
    rank: PositiveInt = 16
    targets: list[Literal["q", "k", "v", "o", "gate", "up", "down"]] = Field(default_factory=lambda: ["q", "v"])
    per_adapter_s: NonNegativeFloat = Field(0.0, description="Cost per distinct adapter in an iteration")


class Scenario(StrictModel):
    """A whole what-if: model, card, KV cache, scheduler, step-time model, workload and objectives."""

    name: str = Field(min_length=1)
    description: str = ""
    seed: NonNegativeInt = 0
    model: str = Field(description="Model profile name (profiles/models) or YAML path")
    hardware: str = Field(description="Hardware profile name (profiles/hardware) or YAML path")
    weight_format: Literal["fp32", "bf16", "fp16", "fp8", "int4", "nvfp4", "mxfp4", "q2_k"] = "bf16"
    expert_weight_format: Literal["fp32", "bf16", "fp16", "fp8", "int4", "nvfp4", "mxfp4", "q2_k"] | None = Field(
        None, description="MoE models: the routed experts' weight format when it is not the rest's (an NVFP4 "
                          "checkpoint that quantizes its experts only, e.g. ModelOpt's nvfp4_experts_only: "
                          "weight_format bf16, expert_weight_format nvfp4); weight_format then holds for attention, "
                          "shared experts, dense layers and routers. Default: weight_format for every matrix")
    attention_weight_format: Literal["fp32", "bf16", "fp16", "fp8", "int4", "nvfp4", "mxfp4", "q2_k"] | None = Field(
        None, description="The attention blocks' matrices' weight format when it is not the rest's (NVIDIA's "
                          "DeepSeek NVFP4 checkpoints keep every layer's self_attn in BF16: weight_format nvfp4, "
                          "attention_weight_format bf16). Default: weight_format")
    kv: KVConfig
    scheduler: AnySchedulerConfig
    step_time: StepTimeConfig
    workload: WorkloadConfig
    slo: SLOConfig = Field(default_factory=SLOConfig)
    admission_control: AdmissionControl = Field(default_factory=AdmissionControl)
    accuracy: AccuracyConfig = Field(default_factory=AccuracyConfig)
    power: PowerConfig = Field(default_factory=PowerConfig)
    offload: OffloadConfig | None = None
    lora: LoRAConfig | None = None
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    disaggregation: DisaggregationConfig | None = Field(
        None, description="Prefill and decode in separate pools, KV sent between them (docs/disaggregation.md)")
    parallel: ParallelConfig | None = Field(
        None, description="A replica's GPUs: {tp, pp, ep} (default one GPU); see sim.io.parallel_schema")

    @model_validator(mode="after")
    def _bound_ranks_divide_limits(self):
        """Ranks bound to their requests (parallel.attention_dp_routing) split the scheduler's limits evenly."""
        from sim.core.schedulers.ranked import split_limits
        pools = [("scheduler", self.scheduler, self.parallel)]
        if self.disaggregation is not None:
            for name in ("prefill", "decode"):
                pool = getattr(self.disaggregation, name)
                where = f"disaggregation.{name}.scheduler" if pool.scheduler is not None else "scheduler"
                pools.append((where, pool.scheduler or self.scheduler, pool.parallel or self.parallel))
        for where, sched, par in pools:
            if par is not None and par.attention_dp > 1 and par.attention_dp_routing != "shared_queue":
                split_limits(sched, par.attention_dp, where)  # (its ValueError names the field)
        return self


# ---- loading ---------------------------------------------------------------------------------


def set_dotted(data: dict[str, Any], dotted: str, value: Any, source: str) -> None:
    """Set `dotted` (a.b.c) in a parsed mapping, creating mappings on the way; a scalar in the way is an error."""
    keys = dotted.split(".")
    node = data
    for k in keys[:-1]:
        nxt = node.get(k)
        if nxt is None:
            nxt = node[k] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"{source}: --set {dotted}: {k!r} is not a mapping")
        node = nxt
    node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """'scheduler.max_num_seqs=32' -> ('scheduler.max_num_seqs', 32); the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected dotted.key=value")
    key, _, raw = text.partition("=")
    if not key.strip() or any(not k for k in key.strip().split(".")):
        raise ConfigError(f"--set {text!r}: expected dotted.key=value, e.g. scheduler.max_num_seqs=32")
    return key.strip(), parse_yaml(raw, f"--set {key.strip()}")


def apply_overrides(data: dict[str, Any], overrides: list[str], source: str) -> dict[str, Any]:
    """Apply `dotted.key=value` overrides (values parsed as YAML) to a parsed scenario mapping."""
    for text in overrides:
        key, value = parse_override(text)
        set_dotted(data, key, value, source)
    return data


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> tuple[Scenario, Path]:
    """Parse, apply `--set` overrides, then validate once. Returns the scenario and its directory."""
    path = Path(path)
    data = apply_overrides(read_yaml_mapping(path), overrides or [], str(path))
    scenario = validate_mapping(Scenario, data, path)
    base = path.resolve().parent
    check_profiles(scenario, path, base)
    return scenario, base


def check_profiles(scenario: Scenario, source: str | Path, base: Path) -> None:
    """Load the model and hardware profiles the scenario names (as the simulation will: a `.yaml` path
    relative to the scenario, else a name under profiles/), so that an unknown name or a broken
    profile is reported against the scenario file and its field."""
    from sim.io.profiles import load_hardware, load_model
    lines = []
    for field, loader in (("model", load_model), ("hardware", load_hardware)):
        text = getattr(scenario, field)
        try:
            loader(base / text if text.endswith(".yaml") else text)
        except ConfigError as exc:
            lines += exc.in_file(source, field).lines
    if lines:
        raise ConfigError(lines)
