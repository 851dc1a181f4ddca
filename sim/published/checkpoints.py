"""What each published checkpoint quantizes, where it is not what a row's precision column says.

A silicon-sample row states one precision (bf16, fp8, fp4) for the whole run; some released checkpoints quantize
only part of the model. `checkpoint_formats` gives a row's model the weight format and ModelSpec (expert and
attention formats) its checkpoint really has. Read in the checkpoints' model cards and quantization configs, never
fitted to the rows.
"""

from __future__ import annotations

from sim.models.spec import ModelSpec

EXPERTS_ONLY_FP4 = {
    "minimax-m2.5": "nvidia/MiniMax-M2.5-NVFP4: ModelOpt's nvfp4_experts_only-fp8_kv recipe (routed experts NVFP4; "
                    "attention, router, embeddings and lm_head BF16)",
    "kimi-k2.5": "NVIDIA's Kimi-K2.x NVFP4 checkpoints (nvidia/Kimi-K2.6-NVFP4 and the requantizations that copy its "
                 "split): routed experts NVFP4; MLA attention, the shared expert and the dense first layer BF16",
    "qwen3.5-397b-a17b": "nvidia/Qwen3.5-397B-A17B-NVFP4: hf_quant_config exclude_modules lm_head, every layer's "
                         "linear_attn* or self_attn* and mlp.shared_expert* (routed experts NVFP4, the rest BF16)",
}
"""Models whose published NVFP4 checkpoint quantizes the routed experts only: an fp4 row of one is replayed with
weight_format bf16 and expert_weight_format nvfp4 (the rest's GEMMs from the BF16 table, the experts' from the NVFP4
table and fused-MoE kernels, memory counted so). Read in the checkpoints' model cards and quantization configs, not
fitted; the other fp4 models (dense Llama-3.1-70B, whose checkpoint quantizes every linear layer; DeepSeek-R1 / V3,
ATTENTION_BF16_FP4) keep NVFP4 for every GEMM."""

MXFP4_EXPERTS = {
    "gpt-oss-120b": "openai/gpt-oss-120b as released: quantization_config quant_method mxfp4 with self_attn, the "
                    "router, embed_tokens and lm_head in modules_to_not_convert (routed experts MXFP4, the rest BF16)",
}
"""Models whose fp4 rows ran their released MXFP4 checkpoint, whatever the row's quant-mode columns say (the
silicon sample labels gpt-oss's fp4 rows nvfp4, the recipe name; the runs load openai/gpt-oss-120b): replayed with
weight_format bf16 and expert_weight_format mxfp4 (the experts from the engine's w4a16_mxfp4 fused-MoE kernel, or
composed from the card's NVFP4 GEMMs; sim.models.parallel_ops). Read in the checkpoint's config, not fitted."""

ATTENTION_BF16_FP4: dict[str, str] = {}
"""Models whose fp4 rows are replayed with attention_weight_format bf16 (their NVFP4 checkpoint keeps the attention
blocks' matrices in BF16). Empty: NVIDIA's DeepSeek-R1 NVFP4 checkpoints list every layer's self_attn* in
exclude_modules (the -v2 ones quantize its output projection), but replayed so, DeepSeek's fp4 rows lost on the even
lines, agg and disaggregated (docs/fidelity.md "DeepSeek's NVFP4 attention in BF16"), so they keep NVFP4 for every
GEMM."""


def checkpoint_formats(model: str, fmt: str, spec: ModelSpec) -> tuple[str, ModelSpec]:
    """The weight format and ModelSpec of the published checkpoint a row of `fmt` ran: an NVFP4 checkpoint that
    quantizes the routed experts alone (EXPERTS_ONLY_FP4: bf16 with NVFP4 experts; MXFP4_EXPERTS: with MXFP4 ones)
    or keeps attention in BF16 (ATTENTION_BF16_FP4)."""
    if fmt == "nvfp4" and model in MXFP4_EXPERTS:
        return "bf16", ModelSpec(spec.profile, expert_format="mxfp4")
    if fmt == "nvfp4" and model in EXPERTS_ONLY_FP4:
        return "bf16", ModelSpec(spec.profile, expert_format="nvfp4")
    if fmt == "nvfp4" and model in ATTENTION_BF16_FP4:
        return fmt, ModelSpec(spec.profile, attention_format="bf16")
    return fmt, spec


MXFP4_ACTIVATIONS = {
    True: ("mxfp8", "InferenceX's Blackwell recipes: benchmarks/gptoss_fp4_b200.sh exports "
                    "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1, gptoss_fp4_b200_trt.sh sets moe_config backend TRTLLM"),
    False: ("bf16", "InferenceX's Hopper recipe: benchmarks/gptoss_fp4_h100.sh exports VLLM_MXFP4_USE_MARLIN=1 "
                    "(MXFP4 weights, BF16 activations)"),
}
"""Whether a card with FP4 tensor cores (Blackwell) -> the activations its published runs gave MXFP4 experts
(step_time.model.mxfp4_activations), and the launch recipe that says so. Read in the recipes, not fitted."""


def mxfp4_activations(spec: ModelSpec, blackwell: bool) -> str | None:
    """step_time.model.mxfp4_activations for a row whose experts are MXFP4 (None for any other row)."""
    return MXFP4_ACTIVATIONS[blackwell][0] if spec.expert_format == "mxfp4" else None
