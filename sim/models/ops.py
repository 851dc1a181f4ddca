"""Operator-level step times: an iteration composed from measured kernel tables (issue [gpu-fidelity]).

Per transformer layer, on one GPU of a tensor-parallel group of `tp`:

- GEMMs at M = tokens of the pass: QKV (N = (heads + 2 kv_heads) x head_dim / tp, K = hidden),
  O (N = hidden, K = heads x head_dim / tp), gate+up fused (N = 2 x intermediate / tp, K = hidden),
  down (N = hidden, K = intermediate / tp); KV heads are replicated when tp exceeds them;
- attention: the prefill chunks as one context-attention call over an equivalent uniform batch
  (b = prefill sequences, length s with b s (s + 1) / 2 = the chunks' causal pairs, so a chunk over a
  cached prefix costs its real work), the decodes as one generation-attention call (batch = decode
  sequences, KV length = their mean cached tokens; speculative verification positions share their
  sequence's KV read);
- tp > 1: two all-reduces of M x hidden BF16 values (after O and after down), from the NCCL table or, with
  `all_reduce: <engine>`, that engine's own measured all-reduce; a third of M x 2 FP32 values when the q / k
  norm spans the layer's heads (`qk_norm_span: layer`);
- small element-wise ops (two RMSNorms with the residual add fused, RoPE, SiLU-and-mul; two more RMSNorms over
  the q and k heads for a q / k norm model unless `qk_norm_kernels: fused_with_rope`): per op
  a + b x M x width, fitted on Vidur's H100 kernel measurements (SMALL_OPS below), b scaled by the
  card's memory bandwidth relative to the H100's 3.35 TB/s.
Per iteration: lm_head at M = sampled positions (N = vocab / tp) plus, under tp, an all-gather of the
logits, and `host_overhead_s`.

Mixed iterations: `one_pass` runs all tokens through one forward pass (GEMMs at M = all tokens, weights
read once, one host overhead); `sum` costs the decode part and the prefill part as two iterations.
"""

from __future__ import annotations

import math
import sys

from sim.io.errors import ConfigError
from sim.io.notices import say
from sim.io.ops_schema import DEFAULT_HOST_OVERHEAD_S, OpsStepTime
from sim.models.collectives import Fabric, fabric_of, table_collectives
from sim.models.ops_tables import MCurve, OutOfRange, TableSet, load_table_set
from sim.models.spec import ModelSpec

REFERENCE_BANDWIDTH_GBS = 3350.0
"""H100 SXM memory bandwidth, the card SMALL_OPS was fitted on."""

SMALL_OPS = {
    # op: (count per layer, seconds at M = 1, seconds per element of M x width, width)
    "rms_norm": (2, 5.0e-6, 3.2e-12, "hidden"),
    "rope": (1, 2.5e-6, 2.4e-12, "qk"),
    "silu_and_mul": (1, 3.5e-6, 3.0e-12, "intermediate"),
}
"""Fitted on ../shared/data/profiling/vidur/compute/h100/meta-llama/Llama-2-{7b,70b}-hf/mlp.csv (2,088
rows, TP 1-8, 1-4096 tokens): the constant is the median time at 1 token, the slope a least-squares fit
through it (median abs. error: norms 30%, RoPE 12%, SiLU 7%). A100 rows of the same files give slopes
1.8x the H100's (bandwidth ratio 1.64x): the bandwidth scaling is approximate. vLLM fuses the residual
add into the norm, so adds are not counted separately."""


def qk_norm_ops(cfg: OpsStepTime, profile, qk_width: float) -> tuple[float, float]:
    """A q / k RMSNorm model's two extra norm kernels per layer (one over the GPU's q heads, one over its k heads:
    `qk_width` values a token in all): (seconds at M = 0, seconds per token per unit of bandwidth scale), from
    SMALL_OPS' rms_norm; nothing when the model has none or the engine fuses them into RoPE
    (step_time.model.qk_norm_kernels)."""
    if not profile.qk_norm or cfg.qk_norm_kernels == "fused_with_rope":
        return 0.0, 0.0
    _, a, b, _ = SMALL_OPS["rms_norm"]
    return 2 * a, b * qk_width


KV_READ_SCALE = {"bf16": 1.0, "fp16": 1.0, "fp8": 0.5}
"""Bytes a decode-attention kernel reads per cached token, relative to the BF16 KV cache the generation
tables were measured with. An FP8 cache (TensorRT-LLM's XQA, vLLM's FP8 KV) is read at half the bytes; with
no FP8-KV table, its decode attention is timed as the BF16 kernel over half the cached tokens of the same
sequences (the memory-bound part halves, the per-launch part stays). Prefill attention keeps its BF16
time (compute-bound)."""


def kv_read_scale(kv_format: str) -> float:
    """KV_READ_SCALE for a scenario's kv.format, or a ConfigError naming the formats the ops model takes."""
    try:
        return KV_READ_SCALE[kv_format]
    except KeyError:
        raise ConfigError(f"kv.format: kind ops times decode attention for a {', '.join(KV_READ_SCALE)} KV cache, "
                          f"got {kv_format!r}") from None


EXTRAPOLATION_ADVICE = ("keep iterations inside the measured shapes (e.g. scheduler.max_num_batched_tokens) or set "
                        "step_time.allow_extrapolation: true to extrapolate in proportion to the work")
"""The remedy an out-of-range lookup names (a scenario's; `capsim profile` commands put their flags in its place)."""

class OpsModel:
    """`step_s(plan)` for a StepPlan from kernel tables; see the module docstring."""

    kv_read_scale = 1.0
    """Cached-token bytes of the KV format relative to BF16 (KV_READ_SCALE); set by build_ops_model."""

    def __init__(self, cfg: OpsStepTime, spec: ModelSpec, tables: TableSet, dtype: str,
                 memory_bandwidth_gbs: float, allow_extrapolation: bool = False, stream=None,
                 fabric: Fabric | None = None):
        p = spec.profile
        if p.moe is not None or p.mla is not None:
            raise ConfigError(f"step_time.model: kind ops does not model {'MoE' if p.moe else 'MLA'} layers yet "
                              f"(model {p.name}); use kind efficiency or profile")
        tp = cfg.tp
        if p.num_attention_heads % tp:
            raise ConfigError(f"step_time.model.tp: {tp} does not divide {p.name}'s {p.num_attention_heads} attention "
                              f"heads (allowed: {[d for d in range(1, p.num_attention_heads + 1) if p.num_attention_heads % d == 0]})")
        if p.num_kv_heads % tp and tp % p.num_kv_heads:
            raise ConfigError(f"step_time.model.tp: {tp} and {p.name}'s {p.num_kv_heads} KV heads: one must divide "
                              "the other")
        self.cfg, self.spec, self.tables, self.dtype, self.tp = cfg, spec, tables, dtype, tp
        self.layers = p.num_layers
        self.heads = p.num_attention_heads // tp
        self.kv_heads = max(p.num_kv_heads // tp, 1)
        self.allow = allow_extrapolation
        self.stream = stream or sys.stderr
        self._warned = False
        self.host_s = DEFAULT_HOST_OVERHEAD_S if cfg.host_overhead_s is None else cfg.host_overhead_s
        self.host_seq_s = cfg.host_per_sequence_s
        self.mixed = cfg.mixed
        self._build_gemms(tables, dtype)
        self.context = tables.context().shape(self.heads, self.kv_heads, p.head_dim)
        self.generation = tables.generation().shape(self.heads, self.kv_heads, p.head_dim)
        self.ar, self.nccl = table_collectives(tables, fabric, cfg.all_reduce) if tp > 1 else (None, None)
        if self.ar is not None and (why := self.ar.why_not("all_reduce", tp)):
            raise ConfigError(f"{why}; the replica's tensor parallelism (parallel.tp, or step_time.model.tp; --tp) "
                              "must be one of them")
        if self.nccl is not None and (why := self.nccl.why_not("all_gather", tp)):  # the logits' all-gather (head_s)
            raise ConfigError(f"{why}; the logits' all-gather under the replica's tensor parallelism (parallel.tp, "
                              "or step_time.model.tp; --tp) needs one")
        self._small = self._small_ops(memory_bandwidth_gbs)
        self._layer_cache: dict[int, float] = {}

    def _build_gemms(self, tables: TableSet, dtype: str) -> None:
        p, tp = self.spec.profile, self.tp
        g = tables.gemm(dtype)
        hd, h = p.head_dim, p.hidden_size
        shapes = {
            "qkv": ((self.heads + 2 * self.kv_heads) * hd, h),
            "o": (h, self.heads * hd),
            "gate_up": (2 * p.intermediate_size // tp, h),
            "down": (h, p.intermediate_size // tp),
        }
        self.gemm_shapes = shapes
        self.gemms = {name: MCurve(g.ms, g.curve(n, k), f"{g.path.name}: {name} GEMM m (tokens)")
                      for name, (n, k) in shapes.items()}
        # lm_head stays BF16 in fp8 checkpoints (sim.models.spec counts its bytes that way)
        lm = tables.gemm("bf16")
        self.lm_head = MCurve(lm.ms, lm.curve(p.vocab_size / tp, h), f"{lm.path.name}: lm_head GEMM m (sequences)")

    def _small_ops(self, bandwidth_gbs: float) -> tuple[float, float]:
        """(seconds per layer at M = 0, seconds per layer per token)."""
        p = self.spec.profile
        widths = {"hidden": p.hidden_size, "qk": (self.heads + self.kv_heads) * p.head_dim,
                  "intermediate": p.intermediate_size / self.tp}
        scale = REFERENCE_BANDWIDTH_GBS / bandwidth_gbs
        const = sum(c * a for c, a, _, _ in SMALL_OPS.values())
        per_token = sum(c * b * widths[w] * scale for c, _, b, w in SMALL_OPS.values())
        extra_const, extra_width = qk_norm_ops(self.cfg, p, widths["qk"])
        return const + extra_const, per_token + extra_width * scale

    # ---- lookups with the extrapolation policy -------------------------------------------
    def _look(self, fn, *args) -> float:
        try:
            return fn(*args)
        except OutOfRange as exc:
            if not self.allow:
                raise ConfigError(f"step_time.model (kind ops, tables {self.tables.name}): {exc}; "
                                  f"{EXTRAPOLATION_ADVICE}") from None
            if not self._warned:
                self._warned = True
                say(f"ops:{self.tables.name}", f"warning: step_time.model (kind ops, tables {self.tables.name}): {exc}; "
                    "extrapolating in proportion to the work; further extrapolations are not reported", self.stream)
            return exc.extrapolated_s

    # ---- pieces -----------------------------------------------------------------------------
    def layer_linear_s(self, tokens: int) -> float:
        """One layer's GEMMs, all-reduces and small ops for a pass over `tokens` tokens."""
        t = self._layer_cache.get(tokens)
        if t is None:
            t = sum(self._look(c.at, tokens) for c in self.gemms.values())
            if self.ar is not None:
                t += 2 * self._look(self.ar.at, "all_reduce", self.tp, tokens * self.spec.profile.hidden_size * 2)
                if self.spec.profile.qk_norm and self.spec.profile.qk_norm_span == "layer":  # 2 FP32 sums a token
                    t += self._look(self.ar.at, "all_reduce", self.tp, tokens * 2 * 4)
            t += self._small[0] + self._small[1] * tokens
            if len(self._layer_cache) < 65536:
                self._layer_cache[tokens] = t
        return t

    def context_attention_s(self, seqs: int, pairs: int) -> float:
        """One layer's prefill attention for `seqs` chunks holding `pairs` causal pairs in all; with sliding-window
        layers, the mean over the model's layers (window_share)."""
        if seqs == 0:
            return 0.0
        s = (math.sqrt(1.0 + 8.0 * pairs / seqs) - 1.0) / 2.0
        full = self._look(self.context.at, seqs, max(s, 1.0))
        w = self.spec.profile.sliding_window
        if not w or s <= w:
            return full
        # a windowed layer's query attends to at most w keys: a chunk of s tokens holds s w - w (w - 1) / 2 pairs,
        # timed as the measured kernel at length w over as many sequences as hold that many pairs, in launches of
        # at most the largest batch measured (independent windows: the work adds up)
        windows = seqs * (s * w - w * (w - 1) / 2) / (w * (w + 1) / 2)
        launches = max(1, math.ceil(windows / self.context.largest_batch))
        windowed = launches * self._look(self.context.at, windows / launches, float(w))
        return (1 - self.window_share) * full + self.window_share * windowed

    def generation_attention_s(self, seqs: int, kv_tokens: int) -> float:
        """One layer's decode attention for `seqs` sequences holding `kv_tokens` cached tokens in all; with
        sliding-window layers, the mean over the model's layers, a windowed one reading at most its window."""
        if seqs == 0:
            return 0.0
        per_seq = max(kv_tokens * self.kv_read_scale / seqs, 1.0)
        full = self._look(self.generation.at, seqs, per_seq)
        w = self.spec.profile.sliding_window
        if not w or per_seq <= w * self.kv_read_scale:
            return full
        return ((1 - self.window_share) * full
                + self.window_share * self._look(self.generation.at, seqs, w * self.kv_read_scale))

    @property
    def window_share(self) -> float:
        """The share of the model's layers that attend within a sliding window (0 for most models)."""
        return self.spec.profile.sliding_window_layers / self.spec.profile.num_layers

    def head_s(self, logits: int) -> float:
        """lm_head over the sampled positions (plus the logits' all-gather under tp)."""
        if logits == 0:
            return 0.0
        t = self._look(self.lm_head.at, logits)
        if self.nccl is not None and self.tp > 1:
            t += self._look(self.nccl.at, "all_gather", self.tp, logits * self.spec.profile.vocab_size * 2)
        return t

    def pass_s(self, tokens: int, pre_seqs: int, pre_pairs: int, dec_seqs: int, dec_kv: int, logits: int,
               dec_tokens: int | None = None) -> float:
        """One forward pass: host overhead, every layer, lm_head (`dec_tokens`, the decodes' positions among
        `tokens`, matters only to attention data parallelism: ParallelOpsModel)."""
        if tokens == 0:
            return 0.0
        layer = (self.layer_linear_s(tokens) + self.context_attention_s(pre_seqs, pre_pairs)
                 + self.generation_attention_s(dec_seqs, dec_kv))
        return self.host_s + self.host_seq_s * (pre_seqs + dec_seqs) + self.layers * layer + self.head_s(logits)

    def breakdown_s(self, tokens: int, pre_seqs: int, pre_pairs: int, dec_seqs: int, dec_kv: int,
                    logits: int, dec_tokens: int | None = None) -> dict[str, float]:
        """One pass's time by component (seconds, all layers): what `pass_s` adds up (`dec_tokens` as there)."""
        L = self.layers
        gemms = {f"gemm_{name}": L * self._look(c.at, tokens) for name, c in self.gemms.items()}
        ar = 0.0
        if self.ar is not None:
            ar = 2 * L * self._look(self.ar.at, "all_reduce", self.tp, tokens * self.spec.profile.hidden_size * 2)
        return {**gemms, "context_attention": L * self.context_attention_s(pre_seqs, pre_pairs),
                "generation_attention": L * self.generation_attention_s(dec_seqs, dec_kv), "all_reduce": ar,
                "small_ops": L * (self._small[0] + self._small[1] * tokens), "lm_head": self.head_s(logits),
                "host": self.host_s + self.host_seq_s * (pre_seqs + dec_seqs)}

    # ---- the step-time model interface ----------------------------------------------------------
    def decode_part_s(self, plan) -> float:
        """The decode (and speculative verify) sequences alone, as their own iteration."""
        return self.pass_s(plan.decode_positions, 0, 0, plan.decode_seqs, plan.decode_kv_tokens, plan.decode_logits,
                           plan.decode_positions)

    def prefill_part_s(self, plan) -> float:
        """The prefill chunks alone, as their own iteration."""
        return self.pass_s(plan.prefill_tokens, plan.prefill_seqs, plan.prefill_pairs, 0, 0, plan.prefill_logits)

    def step_s(self, plan) -> float:
        """Seconds for the iteration `plan` (sim.core.step.StepPlan)."""
        if plan.prefill_seqs == 0 or plan.decode_seqs == 0 or self.mixed == "sum":
            if plan.prefill_seqs == 0:
                return self.decode_part_s(plan)
            if plan.decode_seqs == 0:
                return self.prefill_part_s(plan)
            return self.decode_part_s(plan) + self.prefill_part_s(plan)
        one = self.pass_s(plan.decode_positions + plan.prefill_tokens, plan.prefill_seqs, plan.prefill_pairs,
                          plan.decode_seqs, plan.decode_kv_tokens, plan.decode_logits + plan.prefill_logits,
                          plan.decode_positions)
        # an engine could always run the two parts apart: interpolation never makes one pass dearer
        return min(one, self.decode_part_s(plan) + self.prefill_part_s(plan))


def ops_dtype(cfg: OpsStepTime, weight_format: str, field: str = "weight_format") -> str:
    """The GEMM dtype: the configured one, else the scenario's weight format (`field` names it in the error)."""
    if cfg.dtype is not None:
        return cfg.dtype
    if weight_format in ("bf16", "fp16"):
        return "bf16"
    if weight_format in ("fp8", "nvfp4"):
        return weight_format
    raise ConfigError(f"step_time.model: kind ops has GEMM tables for bf16, fp8 and nvfp4; {field} "
                      f"{weight_format!r} needs step_time.model.dtype set explicitly (bf16, fp8 or nvfp4)")


def build_ops_model(cfg: OpsStepTime, spec: ModelSpec, hw, weight_format: str, kv_format: str,
                    allow_extrapolation: bool, stream=None) -> OpsModel:
    """The ops model for a scenario: tables default to the hardware's name, dtype to the weight format."""
    scale = kv_read_scale(kv_format)
    try:
        tables = load_table_set(cfg.tables or hw.name)
    except ConfigError as exc:  # say where the name came from
        where = "step_time.model.tables" if cfg.tables else f"step_time.model.tables (default: the hardware, {hw.name})"
        raise ConfigError(f"{where}: {exc}") from None
    model = OpsModel(cfg, spec, tables, ops_dtype(cfg, weight_format), hw.memory_bandwidth_gbs.value,
                     allow_extrapolation, stream, fabric_of(hw))
    model.kv_read_scale = scale
    return model
