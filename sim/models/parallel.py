"""A replica spread over GPUs: what each GPU holds (weights, KV per token) under a tensor / pipeline /
expert-parallel layout, which layouts a model can take, and how many distinct experts a batch touches.

Per GPU of a stage of `tp` GPUs (what vLLM and SGLang shard):
- attention: Q and O split by heads (tp divides the heads); K and V split by KV heads, each KV head
  replicated tp / kv_heads times when tp exceeds them; MLA (DeepSeek-V3): the down-projections
  (q_a, kv_a, their norms) replicated, the up-projections (q_b, kv_b) and O split by heads, and the
  latent KV cache replicated on every GPU of the stage (it has no head axis to split);
- dense FFN (and shared experts): gate, up and down split tp ways;
- routed experts: E / ep experts per GPU, each split tp / ep ways (so E / tp experts' worth of bytes);
  the router replicated;
- embedding and lm_head: split by vocabulary rows (ceil(V / tp)) on the first / last stage;
- norms (vectors) replicated.
Pipeline stages take consecutive layers, ceil(L / pp) on the first stages; the per-GPU figures are
the fullest GPU's (the one that must fit).

Attention data parallelism (`attention_dp` ranks, MoE models only; SGLang's and TensorRT-LLM's DP attention,
vLLM's data parallel with expert parallelism): each rank is tp x pp GPUs holding everything above but the
routed experts (attention, dense FFNs, shared experts, embedding, lm_head) and serving its own requests
from its own KV cache; the routed experts spread over all attention_dp x tp GPUs of a stage (ep of them,
each expert split attention_dp x tp / ep ways).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.io.errors import ConfigError
from sim.models.formats import kv_bytes_per_element, weight_bytes_per_element
from sim.models.spec import ModelSpec, distinct_experts, expert_probabilities  # noqa: F401 (re-exported)


@dataclass(frozen=True)
class Layout:
    """attention_dp x tp x pp GPUs; ep of a stage's attention_dp x tp GPUs hold experts (MoE). See
    sim.io.parallel_schema.ParallelConfig."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    micro_batches: int = 1
    expert_imbalance: float = 1.0
    routing_skew: float = 0.0
    ep_communication: str = "all_reduce"
    attention_dp: int = 1
    """Attention data-parallel ranks: each of tp x pp GPUs with its own requests and KV cache, everything but
    the routed experts replicated per rank; the routed experts spread over all ranks' GPUs of a stage."""

    @property
    def gpus(self) -> int:
        """GPUs of one replica."""
        return self.tp * self.pp * self.attention_dp

    @property
    def rank_gpus(self) -> int:
        """GPUs of one attention data-parallel rank (tp x pp): where one request's KV lives."""
        return self.tp * self.pp

    @property
    def expert_gpus(self) -> int:
        """GPUs of a stage the routed experts spread over (attention_dp x tp)."""
        return self.tp * self.attention_dp

    @property
    def moe_tp(self) -> int:
        """Ways each expert is split (attention_dp x tp / ep)."""
        return self.expert_gpus // self.ep

    @property
    def trivial(self) -> bool:
        """One GPU, nothing split."""
        return self.gpus == 1

    def describe(self) -> str:
        """tp4, tp8 ep8, tp2 pp2 ..."""
        parts = (([f"dp{self.attention_dp}"] if self.attention_dp > 1 else []) + [f"tp{self.tp}"]
                 + ([f"pp{self.pp}"] if self.pp > 1 else []) + ([f"ep{self.ep}"] if self.ep > 1 else []))
        return " ".join(parts)

    @classmethod
    def of(cls, cfg) -> "Layout":
        """From a ParallelConfig (or None: one GPU)."""
        if cfg is None:
            return cls()
        return cls(cfg.tp, cfg.pp, cfg.ep, cfg.micro_batches, cfg.expert_imbalance, cfg.routing_skew,
                   cfg.ep_communication, cfg.attention_dp)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layout_problems(spec: ModelSpec, layout: Layout, field: str = "parallel") -> list[str]:
    """Why `spec` cannot take `layout` (empty when it can): each line names the field and the allowed values."""
    p, out = spec.profile, []
    tp, pp, ep = layout.tp, layout.pp, layout.ep
    if p.num_attention_heads % tp:
        out.append(f"{field}.tp: {tp} does not divide {p.name}'s {p.num_attention_heads} attention heads "
                   f"(allowed: {_divisors(p.num_attention_heads)})")
    elif p.mla is None and p.num_kv_heads % tp and tp % p.num_kv_heads:
        ok = [d for d in _divisors(p.num_attention_heads) if p.num_kv_heads % d == 0 or d % p.num_kv_heads == 0]
        out.append(f"{field}.tp: {tp} neither divides nor is a multiple of {p.name}'s {p.num_kv_heads} KV heads "
                   f"(allowed: {ok})")
    lin = p.linear_attention
    if not out and lin is not None and lin.num_key_heads % tp:
        out.append(f"{field}.tp: {tp} does not divide {p.name}'s {lin.num_key_heads} linear-attention key heads "
                   f"(allowed: {[d for d in _divisors(p.num_attention_heads) if lin.num_key_heads % d == 0]})")
    dense_ffn = p.moe is None or p.moe.num_dense_layers > 0
    if not out and dense_ffn and p.intermediate_size % tp:
        out.append(f"{field}.tp: {tp} does not divide {p.name}'s FFN width {p.intermediate_size} "
                   f"(allowed: {[d for d in _divisors(p.num_attention_heads) if p.intermediate_size % d == 0]})")
    if pp > p.num_layers:
        out.append(f"{field}.pp: {pp} stages for {p.name}'s {p.num_layers} layers (allowed: 1..{p.num_layers})")
    if ep > 1 and p.moe is None:
        out.append(f"{field}.ep: {ep} on {p.name}, a dense model without experts (allowed: 1)")
    if layout.attention_dp > 1 and p.moe is None:
        out.append(f"{field}.attention_dp: {layout.attention_dp} on {p.name}, a dense model (allowed: 1; "
                   "independent copies of a dense model are replicas)")
    if p.moe is None:  # the experts' own settings would be ignored on a dense model
        for name, default in (("expert_imbalance", 1.0), ("routing_skew", 0.0), ("ep_communication", "all_reduce")):
            if getattr(layout, name) != default:
                out.append(f"{field}.{name}: {getattr(layout, name)!r} on {p.name}, a dense model without experts "
                           f"(allowed: {default!r}, or leave it out)")
    elif p.moe is not None:
        m = p.moe
        fits = [d for d in _divisors(layout.expert_gpus)  # ep values both the experts and their width allow
                if m.num_experts % d == 0 and m.expert_intermediate_size % (layout.expert_gpus // d) == 0]
        if m.num_experts % ep:
            out.append(f"{field}.ep: {ep} does not divide {p.name}'s {m.num_experts} experts "
                       f"(allowed: {[d for d in _divisors(m.num_experts) if layout.expert_gpus % d == 0]} "
                       f"with {layout.expert_gpus} expert GPUs)")
        elif m.expert_intermediate_size % layout.moe_tp and not any(o.startswith(f"{field}.tp:") for o in out):
            out.append(f"{field}.ep: expert GPUs / ep = {layout.moe_tp} does not divide {p.name}'s expert width "
                       f"{m.expert_intermediate_size} (allowed ep for {layout.expert_gpus} expert GPUs: "
                       f"{fits or 'none: change tp'})")
    return out


def check_layout(spec: ModelSpec, layout: Layout, field: str = "parallel") -> None:
    """Raise ConfigError naming the field and the allowed values when `spec` cannot take `layout`."""
    problems = layout_problems(spec, layout, field)
    if problems:
        raise ConfigError(problems)


def stage_layers(num_layers: int, pp: int) -> list[range]:
    """The layers of each pipeline stage: consecutive, the first L % pp stages one layer longer."""
    base, extra = divmod(num_layers, pp)
    out, start = [], 0
    for s in range(pp):
        n = base + (1 if s < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


# ---- weights per GPU -------------------------------------------------------------------------


def _attention_per_gpu(spec: ModelSpec, tp: int, linear: bool = False) -> tuple[int, int]:
    """(matrix, vector) parameters of one layer's attention on one GPU of a stage of tp (`linear`: a
    linear-attention layer's, its heads split over the GPUs)."""
    p, h = spec.profile, spec.profile.hidden_size
    if linear:
        lin = p.linear_attention
        kd, vd, nv = (lin.num_key_heads * lin.key_head_dim // tp, lin.num_value_heads * lin.value_head_dim // tp,
                      lin.num_value_heads // tp)
        return h * (2 * kd + 2 * vd) + h * 2 * nv + vd * h, h + (2 * kd + vd) * lin.conv_kernel + 2 * nv + lin.value_head_dim
    if p.mla is not None:
        m, heads = p.mla, p.num_attention_heads // tp
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            q = h * m.q_lora_rank + m.q_lora_rank * heads * qk   # q_a replicated, q_b split by heads
        else:
            q = h * heads * qk
        kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
        o = heads * m.v_head_dim * h
        vec = h + m.kv_lora_rank + (m.q_lora_rank or 0)
        return q + kv + o, vec
    heads, kvh, hd = p.num_attention_heads // tp, max(p.num_kv_heads // tp, 1), p.head_dim
    mat = h * heads * hd * (2 if p.attention_output_gate else 1) + 2 * h * kvh * hd + heads * hd * h
    vec = h + ((heads + 2 * kvh) * hd if p.qkv_bias else 0) + (2 * hd if p.qk_norm else 0)
    return mat, vec


def _ffn_per_gpu(spec: ModelSpec, layout: Layout, layer: int) -> tuple[int, int]:
    """Matrix parameters of one layer's FFN on one GPU: (routed experts, the rest: dense FFN, router, shared experts)."""
    p, h, tp = spec.profile, spec.profile.hidden_size, layout.tp
    if p.moe is None or layer < p.moe.num_dense_layers:
        return 0, 3 * h * p.intermediate_size // tp
    m = p.moe
    expert = 3 * h * m.expert_intermediate_size
    routed = (m.num_experts // layout.ep) * expert // layout.moe_tp
    return routed, h * m.num_experts + m.num_shared_experts * expert // tp


@dataclass(frozen=True)
class GpuWeights:
    """Weight bytes on the fullest GPU of a layout, by part (their sum is `total`)."""

    attention: int
    ffn: int
    """Dense FFNs, routed experts, shared experts and routers."""
    embedding: int
    lm_head: int
    norms: int
    stage: int
    """The pipeline stage of the fullest GPU."""

    @property
    def total(self) -> int:
        """All weight bytes on that GPU."""
        return self.attention + self.ffn + self.embedding + self.lm_head + self.norms

    def as_dict(self) -> dict:
        """By part, with the total (JSON)."""
        return {"attention": self.attention, "ffn": self.ffn, "embedding": self.embedding, "lm_head": self.lm_head,
                "norms": self.norms, "total": self.total, "stage": self.stage}


def stage_weights(spec: ModelSpec, layout: Layout, fmt: str = "bf16") -> list[GpuWeights]:
    """Weight bytes of one GPU of each pipeline stage. Quantised formats apply to layer matrices;
    embedding, lm_head and norms stay BF16 (as ModelSpec.weight_bytes counts them)."""
    p, tp = spec.profile, layout.tp
    b = weight_bytes_per_element(fmt)
    other = int(b) if fmt in ("fp32", "fp16", "bf16") else 2
    rows = math.ceil(p.vocab_size / tp) * p.hidden_size
    kinds = {lin: _attention_per_gpu(spec, tp, lin) for lin in ((False, True) if p.linear_attention else (False,))}
    stages = stage_layers(p.num_layers, layout.pp)
    out = []
    for s, layers in enumerate(stages):
        first, last = s == 0, s == len(stages) - 1
        att = int(math.ceil(sum(kinds[spec.linear_layer(i)][0] for i in layers) * spec.attention_bytes_per_element(fmt)))
        parts = [_ffn_per_gpu(spec, layout, i) for i in layers]
        ffn = int(math.ceil(sum(r for r, _ in parts) * spec.expert_bytes_per_element(fmt)
                            + sum(o for _, o in parts) * b))
        vecs = sum(kinds[spec.linear_layer(i)][1] for i in layers) + len(layers) * p.hidden_size + (p.hidden_size if last else 0)
        emb = rows * other if (first and not (p.tie_word_embeddings and last)) else 0
        head = rows * other if last else 0
        out.append(GpuWeights(att, ffn, emb, head, vecs * other, s))
    return out


def weights_per_gpu(spec: ModelSpec, layout: Layout, fmt: str = "bf16") -> GpuWeights:
    """Weight bytes of the fullest GPU. With one GPU the total equals ModelSpec.weight_bytes(fmt)."""
    if layout.trivial:
        return _single_gpu(spec, fmt)
    return max(stage_weights(spec, layout, fmt), key=lambda w: (w.total, -w.stage))


def replica_weight_bytes(spec: ModelSpec, layout: Layout, fmt: str = "bf16") -> int:
    """Weight bytes over all GPUs of a replica (replicated parts counted on every GPU holding them)."""
    if layout.trivial:
        return spec.weight_bytes(fmt)
    return layout.expert_gpus * sum(w.total for w in stage_weights(spec, layout, fmt))


def _single_gpu(spec: ModelSpec, fmt: str) -> GpuWeights:
    """One GPU: the parts of ModelSpec.weight_bytes (their total equals it)."""
    p = spec.profile
    b = weight_bytes_per_element(fmt)
    other = int(b) if fmt in ("fp32", "fp16", "bf16") else 2
    total = spec.weight_bytes(fmt)
    att = int(math.ceil(spec.attention_params * spec.attention_bytes_per_element(fmt)))
    emb = 0 if p.tie_word_embeddings else spec.embedding_params * other
    head = spec.lm_head_params * other
    norms = spec.vector_params * other
    return GpuWeights(att, total - att - emb - head - norms, emb, head, norms, 0)


# ---- KV per GPU ------------------------------------------------------------------------------


def kv_bytes_per_token_per_gpu(spec: ModelSpec, layout: Layout, fmt: str = "bf16") -> float:
    """KV bytes one token costs on the fullest GPU: its stage's layers x the KV heads that GPU holds
    (one when tp exceeds the KV heads), or the whole MLA latent (replicated over the stage). With
    one GPU this equals ModelSpec.kv_bytes_per_token(fmt) exactly."""
    if layout.trivial:
        return spec.kv_bytes_per_token(fmt)
    p = spec.profile
    # the stage holding the most full-attention layers (sliding-window and linear layers: ModelSpec.kv_elements_per_token)
    layers = max(sum(spec.kv_layer(i) for i in r) for r in stage_layers(p.num_layers, layout.pp))
    if p.mla is not None:
        per_layer = p.mla.kv_lora_rank + p.mla.qk_rope_head_dim
    else:
        per_layer = 2 * max(p.num_kv_heads // layout.tp, 1) * p.head_dim
    v = layers * per_layer * kv_bytes_per_element(fmt)
    return int(v) if v.denominator == 1 else float(v)


def state_bytes_per_sequence_per_gpu(spec: ModelSpec, layout: Layout) -> int:
    """The linear-attention state one sequence holds on the fullest GPU: its stage's linear layers, their heads split
    over tp (ModelSpec.state_bytes_per_sequence with one GPU; 0 without such layers)."""
    p = spec.profile
    if p.linear_attention is None:
        return 0
    layers = max(sum(spec.linear_layer(i) for i in r) for r in stage_layers(p.num_layers, layout.pp))
    return layers * spec.linear_state_bytes_per_layer(layout.tp)


def kv_replication(spec: ModelSpec, layout: Layout) -> int:
    """How many copies of each KV element the replica keeps (1 unless tp exceeds the KV heads, or MLA)."""
    p = spec.profile
    if p.mla is not None:
        return layout.tp
    return max(layout.tp // p.num_kv_heads, 1)



def kv_transfer_share(spec: ModelSpec, sender: Layout, receiver: Layout) -> float:
    """The bytes one request's KV puts through the busiest GPU's network link when a prefill replica of layout
    `sender` hands it to a decode replica of layout `receiver`, as a share of the request's KV (every layer once,
    ModelSpec.kv_bytes_per_token). A request's KV lives on one attention data-parallel rank (tp x pp GPUs) on each
    side. Per stage, GQA / MHA KV is split into min(tp, KV heads) distinct head shards; each receiving GPU takes its
    shard from the sender that holds it, and a shard held twice is sent once. MLA's latent has no head axis: every
    GPU of a stage holds all of it and every receiving GPU needs all of it, so min(tp_sender, tp_receiver) senders
    send tp_receiver copies between them. As SGLang's, TensorRT-LLM's and vLLM's connectors map ranks (SGLang
    CommonKVManager._resolve_rank_mapping, TensorRT-LLM MLACacheFormatter.needSendCache, vLLM's NIXL
    compute_tp_mapping: an MLA decode rank reads the whole latent from one prefill rank). Examples: Llama-3.1-70B
    (8 KV heads) TP4 -> TP8: 1/4 (each prefill GPU sends its two heads); DeepSeek-V3 (MLA) TP8 -> TP8: 1; MLA from
    an attention-DP prefill rank of one GPU to a TP8 decode replica: 8 (eight copies out of one link)."""
    p = spec.profile
    if p.mla is not None:
        shards_s = shards_r = 1
        senders = min(sender.tp, receiver.tp)
    else:
        shards_s, shards_r = min(sender.tp, p.num_kv_heads), min(receiver.tp, p.num_kv_heads)
        senders = shards_s
    receiving = 1.0 / (shards_r * receiver.pp)
    sending = (receiver.tp / shards_r) / (senders * sender.pp)
    return max(receiving, sending)

# ---- MoE routing (sim.models.spec: distinct_experts, expert_probabilities) and fitting layouts ---


KV_HEADROOM = 0.2
"""A layout suggested as fitting leaves at least this share of each GPU's usable memory for the KV cache."""


def smallest_fitting_layout(spec: ModelSpec, memory_bytes: int, fmt: str, reserve_bytes: int = 0,
                            max_gpus: int = 64, max_pp: int = 64) -> Layout | None:
    """The layout with the fewest GPUs (then the fewest pipeline stages, then the most expert parallelism)
    whose fullest GPU holds its weights plus `reserve_bytes` in (1 - KV_HEADROOM) of `memory_bytes`;
    tp a power of two up to 8 (one NVLink node), pp any; None if none up to `max_gpus` GPUs."""
    cands = []
    for tp in (1, 2, 4, 8):
        for pp in range(1, min(max_gpus // tp, max_pp) + 1):
            eps = [e for e in _divisors(tp) if spec.profile.moe is not None] or [1]
            for ep in eps:
                lay = Layout(tp, pp, ep)
                if not layout_problems(spec, lay):
                    cands.append(((tp * pp, pp, -ep), lay))
    for _, lay in sorted(cands, key=lambda c: c[0]):
        if weights_per_gpu(spec, lay, fmt).total + reserve_bytes <= (1 - KV_HEADROOM) * memory_bytes:
            return lay
    return None


SMALLER_FORMATS = ("fp8", "nvfp4", "int4")
"""Weight formats a refusal may suggest instead, largest first (sim.models.formats.WEIGHT_FORMATS)."""


def nothing_fits(spec: ModelSpec, memory_bytes: int, fmt: str, reserve_bytes: int, flag: str) -> str:
    """'; no layout of up to 64 GPUs fits', and the largest smaller weight format (`flag` names the field) with
    the smallest layout that would hold it, when one does."""
    from sim.models.formats import weight_bytes_per_element
    text = "; no layout of up to 64 GPUs fits"
    for smaller in SMALLER_FORMATS:
        if weight_bytes_per_element(smaller) >= weight_bytes_per_element(fmt):
            continue
        lay = smallest_fitting_layout(spec, memory_bytes, smaller, reserve_bytes)
        if lay is not None:
            return text + (f"; in {flag} {smaller} it would: tp {lay.tp}, pp {lay.pp}, ep {lay.ep} "
                           f"({lay.gpus} GPUs)")
    return text
