"""What a model profile implies: parameter counts, weight bytes, bytes read per step, KV per token.

Pure arithmetic over :class:`sim.io.profiles.ModelProfile`; shared by the memory model, the roofline,
the step-time models and calibration (so measurement and simulation count the same bytes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from sim.models.formats import kv_bytes_per_element, weight_bytes_per_element
from sim.io.errors import ConfigError
from sim.io.profiles import ModelProfile


@dataclass(frozen=True)
class ModelSpec:
    """Derived quantities of one model. Parameter counts are exact integers."""

    profile: ModelProfile
    expert_format: str | None = None
    """The routed experts' weight format when it is not the rest's (scenario `expert_weight_format`: an NVFP4
    checkpoint that quantizes its experts only); None: every layer matrix in the format each method is given."""
    attention_format: str | None = None
    """The attention matrices' weight format when it is not the rest's (scenario `attention_weight_format`: an NVFP4
    checkpoint that keeps self_attn in BF16); None: the format each method is given."""

    # --- per-layer pieces ------------------------------------------------------------------
    @cached_property
    def attention_matrix_params(self) -> int:
        """Matrix parameters of one layer's attention (biases excluded)."""
        p, h = self.profile, self.profile.hidden_size
        if p.mla is not None:
            m = p.mla
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            q = (h * m.q_lora_rank + m.q_lora_rank * p.num_attention_heads * qk) if m.q_lora_rank else h * p.num_attention_heads * qk
            kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * p.num_attention_heads * (m.qk_nope_head_dim + m.v_head_dim)
            o = p.num_attention_heads * m.v_head_dim * h
            return q + kv + o
        q = h * p.num_attention_heads * p.head_dim * (2 if p.attention_output_gate else 1)  # the gate beside q
        kv = 2 * h * p.num_kv_heads * p.head_dim
        o = p.num_attention_heads * p.head_dim * h
        return q + kv + o

    @cached_property
    def linear_attention_matrix_params(self) -> int:
        """Matrix parameters of one linear-attention (Gated DeltaNet) layer: in_proj_qkvz (q and k of every key
        head, v and the output gate z of every value head), in_proj_ba (each value head's b and a) and out_proj;
        0 for a model without such layers."""
        p, h, lin = self.profile, self.profile.hidden_size, self.profile.linear_attention
        if lin is None:
            return 0
        kd, vd = lin.num_key_heads * lin.key_head_dim, lin.num_value_heads * lin.value_head_dim
        return h * (2 * kd + 2 * vd) + h * 2 * lin.num_value_heads + vd * h

    @cached_property
    def linear_attention_vector_params(self) -> int:
        """Everything else of one linear-attention layer: the input norm, the depthwise convolution over q, k and v
        (conv_kernel taps a channel), A_log and dt_bias per value head, the gated output norm."""
        p, lin = self.profile, self.profile.linear_attention
        if lin is None:
            return 0
        conv = 2 * lin.num_key_heads * lin.key_head_dim + lin.num_value_heads * lin.value_head_dim
        return p.hidden_size + conv * lin.conv_kernel + 2 * lin.num_value_heads + lin.value_head_dim

    def linear_layer(self, layer: int) -> bool:
        """Whether `layer` is a linear-attention one. The profile gives how many are, not which: they are taken as
        spread evenly from the first layer on (Qwen3.5: layers 0-2, 4-6, ..., every fourth attending in full)."""
        lin = self.profile.linear_attention
        return lin is not None and _spread(lin.layers, self.profile.num_layers, layer)

    def layer_attention_params(self, layer: int) -> int:
        """Matrix parameters of `layer`'s attention, linear or full."""
        return self.linear_attention_matrix_params if self.linear_layer(layer) else self.attention_matrix_params

    @cached_property
    def attention_params(self) -> int:
        """Matrix parameters of every layer's attention."""
        return sum(self.layer_attention_params(i) for i in range(self.profile.num_layers))

    @cached_property
    def attention_vector_params(self) -> int:
        """Norms and biases of one layer's attention block (incl. the input norm)."""
        p, h = self.profile, self.profile.hidden_size
        n = h  # input_layernorm
        if p.qkv_bias:
            n += (p.num_attention_heads + 2 * p.num_kv_heads) * p.head_dim
        if p.qk_norm:
            n += 2 * p.head_dim
        if p.mla is not None:
            n += p.mla.kv_lora_rank + (p.mla.q_lora_rank or 0)
        return n

    def _ffn_params(self, layer: int) -> tuple[int, int]:
        """(total, active per token) matrix parameters of one layer's FFN."""
        p, h = self.profile, self.profile.hidden_size
        if p.moe is None or layer < p.moe.num_dense_layers:
            dense = 3 * h * p.intermediate_size
            return dense, dense
        m = p.moe
        expert = 3 * h * m.expert_intermediate_size
        router = h * m.num_experts
        shared = m.num_shared_experts * expert
        return router + m.num_experts * expert + shared, router + m.experts_per_token * expert + shared

    # --- whole model -----------------------------------------------------------------------
    @cached_property
    def embedding_params(self) -> int:
        """Parameters of the input embedding table (vocab x hidden)."""
        return self.profile.vocab_size * self.profile.hidden_size

    @cached_property
    def lm_head_params(self) -> int:
        """lm_head matrix (the same tensor as the embedding when tied; its FLOPs count either way)."""
        return self.profile.vocab_size * self.profile.hidden_size

    @cached_property
    def layer_matrix_params(self) -> int:
        """All layers' matrix parameters (every expert counted)."""
        p = self.profile
        return self.attention_params + sum(self._ffn_params(i)[0] for i in range(p.num_layers))

    @cached_property
    def active_matrix_params(self) -> int:
        """Layer matrix parameters one token passes through (for FLOPs): 2 FLOPs each per token."""
        p = self.profile
        return self.attention_params + sum(self._ffn_params(i)[1] for i in range(p.num_layers))

    @cached_property
    def vector_params(self) -> int:
        """Norms and biases of all layers plus the final norm."""
        p = self.profile
        linear = p.linear_attention.layers if p.linear_attention else 0
        return ((p.num_layers - linear) * self.attention_vector_params + linear * self.linear_attention_vector_params
                + p.num_layers * p.hidden_size + p.hidden_size)

    @cached_property
    def total_params(self) -> int:
        """Every parameter stored: layers, norms, embeddings, and the LM head unless tied."""
        lm = 0 if self.profile.tie_word_embeddings else self.lm_head_params
        return self.layer_matrix_params + self.vector_params + self.embedding_params + lm

    @cached_property
    def active_params(self) -> int:
        """Parameters one token computes with (MoE: routed experts it uses plus shared ones)."""
        lm = 0 if self.profile.tie_word_embeddings else self.lm_head_params
        return self.active_matrix_params + self.vector_params + self.embedding_params + lm

    @cached_property
    def routed_expert_params(self) -> int:
        """Matrix parameters of every routed expert of every MoE layer (0 for a dense model)."""
        m = self.profile.moe
        if m is None:
            return 0
        expert = 3 * self.profile.hidden_size * m.expert_intermediate_size
        return (self.profile.num_layers - m.num_dense_layers) * m.num_experts * expert

    def expert_bytes_per_element(self, fmt: str) -> float:
        """Bytes per routed-expert matrix element: `expert_format`'s when set, else `fmt`'s."""
        return weight_bytes_per_element(self.expert_format or fmt)

    def attention_bytes_per_element(self, fmt: str) -> float:
        """Bytes per attention matrix element: `attention_format`'s when set, else `fmt`'s."""
        return weight_bytes_per_element(self.attention_format or fmt)

    def weight_bytes(self, fmt: str = "bf16") -> int:
        """Bytes of all weights. Float formats (fp32/fp16/bf16) store every tensor at their width;
        quantised formats (fp8, int4, q2_k) apply to layer matrices while embeddings, lm_head and
        norms stay BF16 (what vLLM-style fp8/int4 checkpoints do)."""
        return self._bytes(self.layer_matrix_params, fmt, include_embedding=True)

    def weight_read_bytes(self, fmt: str = "bf16") -> int:
        """Bytes one iteration reads: all weights except the embedding table (a per-row lookup).
        With tied embeddings the lm_head *is* that table and is read in full. For MoE this is the
        upper bound with every expert touched (large batches)."""
        return self._bytes(self.layer_matrix_params, fmt, include_embedding=False)

    def weight_read_bytes_at(self, tokens: float, fmt: str = "bf16", skew: float = 0.0) -> int:
        """Bytes one iteration over `tokens` tokens reads: weight_read_bytes less, in every MoE layer, the
        routed experts no token touches (E - D of them, D = distinct_experts(E, k, tokens, skew)).
        Dense models, and MoE batches that touch every expert, read weight_read_bytes."""
        full = self.weight_read_bytes(fmt)
        m = self.profile.moe
        if m is None:
            return full
        untouched = m.num_experts - distinct_experts(m.num_experts, m.experts_per_token, tokens, skew)
        expert = 3 * self.profile.hidden_size * m.expert_intermediate_size * self.expert_bytes_per_element(fmt)
        return int(math.ceil(full - (self.profile.num_layers - m.num_dense_layers) * untouched * expert))

    def _bytes(self, matrices: int, fmt: str, include_embedding: bool) -> int:
        b = weight_bytes_per_element(fmt)
        # the routed experts and the attention matrices each in their own format where the checkpoint says so
        routed = self.routed_expert_params if self.expert_format is not None else 0
        att = self.attention_params if self.attention_format is not None else 0
        matrix_bytes = ((matrices - routed - att) * b + routed * self.expert_bytes_per_element(fmt)
                        + att * self.attention_bytes_per_element(fmt))
        other = b if fmt in ("fp32", "fp16", "bf16") else 2
        vectors = self.vector_params * other
        lm_table = self.lm_head_params * other  # lm_head (== embedding when tied)
        emb = self.embedding_params * other if (include_embedding and not self.profile.tie_word_embeddings) else 0
        return int(math.ceil(matrix_bytes + vectors + lm_table + emb))

    # --- KV cache --------------------------------------------------------------------------
    @cached_property
    def full_attention_layers(self) -> int:
        """Layers whose attention spans the whole context: all but the sliding-window and linear-attention ones."""
        lin = self.profile.linear_attention
        return self.profile.num_layers - self.profile.sliding_window_layers - (lin.layers if lin else 0)

    def windowed_layer(self, layer: int) -> bool:
        """Whether `layer` attends within the sliding window. The profile gives how many do, not which: they are
        taken as spread evenly from the first layer on (gpt-oss: the even layers, 0, 2, ..., 34 of 36)."""
        return _spread(self.profile.sliding_window_layers, self.profile.num_layers, layer)

    def kv_layer(self, layer: int) -> bool:
        """Whether `layer` keeps KV for every token of the context (neither windowed nor linear)."""
        return not (self.windowed_layer(layer) or self.linear_layer(layer))

    @cached_property
    def state_bytes_per_sequence(self) -> int:
        """Bytes of fixed state one sequence holds in the linear-attention layers, whatever its length (0 without
        them): per layer the convolution's last conv_kernel - 1 inputs of each q, k and v channel (BF16) and a
        key_head_dim x value_head_dim matrix per value head (state_format). Qwen3.5-397B-A17B: 45 layers x
        (12,288 x 3 x 2 B + 64 x 128 x 128 x 4 B) = 192,061,440 B, as many as 6,252 tokens of its KV in BF16."""
        lin = self.profile.linear_attention
        if lin is None:
            return 0
        return lin.layers * self.linear_state_bytes_per_layer(1)

    def linear_state_bytes_per_layer(self, tp: int) -> int:
        """One linear-attention layer's state for one sequence on one GPU of `tp` (heads split over them)."""
        lin = self.profile.linear_attention
        conv = (2 * lin.num_key_heads * lin.key_head_dim + lin.num_value_heads * lin.value_head_dim) // tp
        state = 4 if lin.state_format == "fp32" else 2
        return conv * (lin.conv_kernel - 1) * 2 + lin.num_value_heads // tp * lin.key_head_dim * lin.value_head_dim * state

    @cached_property
    def kv_elements_per_token(self) -> int:
        """KV cache elements one more token of context adds over all layers (MLA: the compact latent and rope key).
        A sliding-window layer keeps at most its window a sequence, so it adds nothing per token once the context
        is longer: its KV is window_kv_elements_per_sequence, outside this count."""
        p = self.profile
        if p.mla is not None:
            return p.num_layers * (p.mla.kv_lora_rank + p.mla.qk_rope_head_dim)
        return 2 * self.full_attention_layers * p.num_kv_heads * p.head_dim

    @cached_property
    def window_kv_elements_per_sequence(self) -> int:
        """KV elements the sliding-window layers keep for one sequence at most (its last `sliding_window` tokens in
        each; 0 for a model without them). capsim's KV pool does not charge them: with gpt-oss-120b's 18 windowed
        layers of 128 tokens, 2,304 layer-tokens a sequence, 6% of a 2,048-token request's KV."""
        p = self.profile
        return 2 * p.sliding_window_layers * p.num_kv_heads * p.head_dim * (p.sliding_window or 0)

    def kv_bytes_per_token(self, fmt: str = "bf16") -> float:
        """K and V of every layer for one token, in `fmt` (q8_0 and q4_0 include group scales)."""
        v = self.kv_elements_per_token * kv_bytes_per_element(fmt)
        return int(v) if v.denominator == 1 else float(v)

    def kv_bytes_of_sequence(self, tokens: int, fmt: str = "bf16") -> float:
        """What one sequence of `tokens` tokens holds over all layers, the bytes a disaggregated prefill hands over:
        kv_bytes_per_token each, plus, in the sliding-window layers, at most the window's last tokens, and in the
        linear-attention layers their fixed state (state_bytes_per_sequence, in its own format whatever `fmt`)."""
        w = self.profile.sliding_window
        per_layer_token = 0 if not w else self.window_kv_elements_per_sequence // w
        v = (tokens * self.kv_elements_per_token + min(tokens, w or 0) * per_layer_token) * kv_bytes_per_element(fmt)
        v += self.state_bytes_per_sequence
        return int(v) if v.denominator == 1 else float(v)

    def kv_bytes_per_token_without_gqa(self, fmt: str = "bf16") -> float:
        """KV bytes per token if every query head kept its own K and V (what GQA saves against)."""
        p = self.profile
        return float(2 * p.num_layers * p.num_attention_heads * p.head_dim * kv_bytes_per_element(fmt))

    # --- attention FLOPs -------------------------------------------------------------------
    @cached_property
    def attention_flops_per_pair(self) -> int:
        """FLOPs of one causal query-key pair over all layers: QK^T and PV, 2 FLOPs per MAC."""
        p = self.profile
        if p.mla is not None:
            qk = p.mla.qk_nope_head_dim + p.mla.qk_rope_head_dim
            return 2 * p.num_layers * p.num_attention_heads * (qk + p.mla.v_head_dim)
        linear = p.linear_attention.layers if p.linear_attention else 0  # no pairs: their work is per token
        return 4 * (p.num_layers - linear) * p.num_attention_heads * p.head_dim

    def lora_adapter_bytes(self, rank: int, targets: tuple[str, ...] = ("q", "v"), fmt: str = "bf16") -> int:
        """One LoRA adapter: rank x (in + out) per targeted projection per layer."""
        p, h = self.profile, self.profile.hidden_size
        shapes = {
            "q": (h, p.num_attention_heads * p.head_dim),
            "k": (h, p.num_kv_heads * p.head_dim),
            "v": (h, p.num_kv_heads * p.head_dim),
            "o": (p.num_attention_heads * p.head_dim, h),
            "gate": (h, p.intermediate_size),
            "up": (h, p.intermediate_size),
            "down": (p.intermediate_size, h),
        }
        unknown = [t for t in targets if t not in shapes]
        if unknown:
            raise ValueError(f"unknown LoRA target(s) {unknown}; known: {', '.join(shapes)}")
        per_layer = sum(rank * (shapes[t][0] + shapes[t][1]) for t in targets)
        return int(p.num_layers * per_layer * weight_bytes_per_element(fmt))

    def ffn_bytes_per_layer(self, fmt: str = "bf16") -> int:
        """One dense FFN (gate, up, down), the unit offloaded in reference section 7."""
        p = self.profile
        return int(3 * p.hidden_size * p.intermediate_size * weight_bytes_per_element(fmt))


def _spread(n: int, layers: int, layer: int) -> bool:
    """Whether `layer` is one of `n` of `layers` layers spread evenly from the first on."""
    return -(-(layer + 1) * n // layers) > -(-layer * n // layers)


def expert_probabilities(num_experts: int, skew: float) -> list[float]:
    """Each expert's share of routing picks: uniform for skew 0, else Zipf(skew) over popularity rank."""
    w = [1.0 / (r + 1) ** skew for r in range(num_experts)]
    s = sum(w)
    return [x / s for x in w]


def distinct_experts(num_experts: int, top_k: int, tokens: float, skew: float = 0.0) -> float:
    """Expected distinct experts `tokens` tokens touch in one MoE layer, each choosing `top_k`: a token
    picks expert e with probability q_e = min(1, k p_e), so sum_e 1 - (1 - q_e)^T; uniform routing gives
    E (1 - (1 - k/E)^T)."""
    if tokens <= 0:
        return 0.0
    if skew == 0.0:
        return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)
    return sum(1.0 - (1.0 - min(1.0, top_k * q)) ** tokens for q in expert_probabilities(num_experts, skew))


def scenario_spec(scenario, profile: ModelProfile) -> ModelSpec:
    """A scenario's ModelSpec: its model profile with the routed experts' own weight format if the scenario states
    one (`expert_weight_format`); a model without routed experts cannot take one (ConfigError naming the field)."""
    fmt = getattr(scenario, "expert_weight_format", None)
    if fmt is not None and profile.moe is None:
        raise ConfigError(f"expert_weight_format: {profile.name} has no routed experts (a dense model); remove the "
                          "field, or set weight_format for every matrix")
    return ModelSpec(profile, expert_format=fmt, attention_format=getattr(scenario, "attention_weight_format", None))
