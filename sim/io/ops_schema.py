"""Scenario schema of the operator-level step-time model (`step_time.model: {kind: ops}`).

Kept apart from sim.models.ops so that sim.io.config can validate scenarios without loading tables.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat, PositiveInt, field_validator

from sim.io.schema import StrictModel

DEFAULT_HOST_OVERHEAD_S = 0.228e-3
"""Per-iteration host time (scheduling, sampling, launches not hidden by CUDA graphs), seconds.
Fitted by benchmarks/ops_fidelity.py: the median residual of an analytic closed-loop TPOT (mixed
one_pass) against the 177 TensorRT-LLM 1.0.0rc3 rows of Llama-3.1-8B on H100 SXM (TP 1-8) in
../shared/data/benchmarks/aiconfigurator_silicon_sample.csv; every vLLM row stays held out. An engine
with a heavier host loop (eager mode, older vLLM) needs a larger value: set host_overhead_s."""

SHARED_EXPERTS_OVERLAP_TOKENS = 256
"""vLLM runs a MoE layer's shared experts on an auxiliary CUDA stream, overlapped with the router and the routed
experts, when the layer sees at most this many tokens (vllm/envs.py, VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD,
default 256: "for large batch sizes, the separate stream execution is not beneficial"). The ops model's tables
and defaults are vLLM's, so this is the schema's default too."""


class OpsStepTime(StrictModel):
    """Iteration time composed from measured kernel tables (profiles/ops/<tables>/):
    per layer the GEMMs (QKV, O, gate/up, down) at M = the iteration's tokens, context attention for the
    prefill chunks, generation attention for the decodes, two all-reduces under tensor parallelism and
    the small element-wise ops; plus lm_head over the sampled positions and a per-iteration host time."""

    kind: Literal["ops"] = "ops"
    tables: str | None = Field(None, description="Kernel table set: a folder name under profiles/ops or a path; "
                                                 "defaults to the scenario's hardware name")
    dtype: Literal["bf16", "fp8", "nvfp4"] | None = Field(
        None, description="GEMM precision; defaults to the scenario's weight_format (bf16/fp16 -> bf16, fp8 -> fp8, "
                          "nvfp4 -> nvfp4: the table set's gemm_nvfp4 table, Blackwell cards only)")
    tp: PositiveInt = Field(1, description="Tensor-parallel GPUs of the replica (shards GEMMs and heads, adds "
                                           "all-reduces)")
    mixed: Literal["one_pass", "sum"] = Field(
        "one_pass", description="A chunked iteration (decodes + prefill chunks): one forward pass over all tokens "
                                "(weights read once), or a decode iteration plus a prefill iteration")
    moe_kernels: Literal["vllm", "sglang", "trtllm", "composed"] = Field(
        "vllm", description="MoE layers' routed experts: that engine's measured fused-MoE kernel (the table set's "
                            "moe.csv) when it has the layer's shape, dtype and expert split and routing is uniform "
                            "(parallel.routing_skew 0, expert_imbalance 1), else composed from GEMMs; `composed` "
                            "always composes")
    mla_kernels: Literal["composed", "sglang", "trtllm"] = Field(
        "composed", description="MLA models' (DeepSeek-V3, Kimi-K2.5) attention kernels: that engine's measured MLA "
                                "kernels (the table set's mla_<phase>_<engine>_<kv>.csv.gz: SGLang's attention backend "
                                "of the card, TensorRT-LLM's) for the KV cache's format where measured, else composed: "
                                "decode as the GQA table's one-KV-head kernel over the latent's bytes, prefill as MHA "
                                "scaled by the head dims")
    linear_attention_kernels: Literal["vllm", "sglang", "trtllm"] = Field(
        "vllm", description="Linear-attention models' (Qwen3.5) Gated DeltaNet kernels: that engine's measured "
                            "convolution and delta-rule kernels (the table set's gdn_<phase>_<engine>.csv.gz); vLLM's "
                            "by default, as the card's GEMM and attention tables are")
    mxfp4_activations: Literal["bf16", "mxfp8"] = Field(
        "bf16", description="MXFP4 experts (expert_weight_format mxfp4, gpt-oss): BF16 activations (w4a16_mxfp4: "
                            "vLLM's default, Hopper's Marlin and Triton kernels) or MXFP8 (w4a8_mxfp4_mxfp8: FlashInfer's "
                            "TRT-LLM-gen kernel on Blackwell, vLLM with VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1, "
                            "TensorRT-LLM's TRTLLM MoE backend); the fused kernel of that dtype, else composed")
    moe_routing: Literal["balanced", "power_law_1.2"] = Field(
        "power_law_1.2", description="Which measured routing of the fused-MoE table: power_law_1.2 (token counts per "
                                     "expert follow a power law, as real traffic's do; AIConfigurator's default, and "
                                     "the better fit of vLLM's published rows held out, docs/fidelity.md) or balanced "
                                     "(tokens spread evenly over the experts)")
    all_reduce: Literal["nccl", "vllm", "sglang", "trtllm"] = Field(
        "nccl", description="Whose all-reduce times tensor parallelism: NCCL's (nccl.csv, nccl-tests) or a serving "
                            "engine's own (all_reduce_<engine>.csv: vLLM's and SGLang's custom one-shot / two-shot "
                            "kernels in CUDA graphs, TensorRT-LLM's AllReduce plugin; NCCL only for large messages)")
    shared_experts_overlap: Literal["off", "decode", "fused"] | PositiveInt = Field(
        SHARED_EXPERTS_OVERLAP_TOKENS, description="When a MoE layer's shared experts run on a second CUDA stream beside "
        "the router and the routed experts (the layer then takes the longer of the two paths, not their sum): "
        "a number N, in passes of at most N tokens per attention rank (vLLM's aux stream, "
        "VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD, default 256); `decode`, in decode-only passes (TensorRT-LLM's "
        "maybe_execute_in_parallel, under CUDA graphs); `off`, never (one stream, the shared experts' GEMMs after the "
        "routed ones); `fused`, the shared experts folded into the routed experts' kernel as one more expert per token "
        "where the experts are not spread over GPUs (moe ep 1: SGLang's DeepSeek path, num_fused_shared_experts), "
        "in series elsewhere. Only models with shared experts (DeepSeek-V3, Kimi-K2.5) are affected")
    qk_norm_kernels: Literal["separate", "fused_with_rope"] = Field(
        "separate", description="Models with q / k RMSNorm (Qwen3, MiniMax-M2): two more norm kernels per layer over "
                                "the GPU's q and k heads (vLLM, SGLang), or none beyond RoPE's (`fused_with_rope`: "
                                "TensorRT-LLM's fused_qk_norm_rope kernel)")

    dp_prefill_gather: Literal["all_gather", "all_reduce"] = Field(
        "all_gather", description="Attention data parallelism (parallel.attention_dp > 1): how a pass that holds a "
                                  "prefill gathers the ranks' tokens to the experts and returns their outputs. "
                                  "`all_gather`: an all-gather there and a reduce-scatter back (costed as two "
                                  "all-gathers of the gathered bytes; TensorRT-LLM, vLLM, and every decode-only pass); "
                                  "`all_reduce`: every rank writes its tokens into a zeroed buffer of all the ranks' "
                                  "tokens and all-reduces it, and the experts' output is all-reduced before each rank "
                                  "takes its slice (two all-reduces of the gathered bytes: SGLang's SUM_LEN padding, "
                                  "which it uses for every batch with a prefill)")

    all_to_all: Literal["auto", "nccl", "nvlink_one_sided", "nvlink_two_sided"] = Field(
        "auto", description="Expert parallelism with parallel.ep_communication all_to_all: whose kernels dispatch each "
                            "rank's tokens to their experts' GPUs and combine them back. `auto`: DeepEP's measured "
                            "dispatch / combine with moe_kernels sglang (the card's deepep_<mode> tables; SGLang's "
                            "--moe-a2a-backend deepep), NCCL's all-to-all otherwise; `nccl`: NCCL's all-to-all "
                            "(nccl_parallel.csv); `nvlink_one_sided` / `nvlink_two_sided`: TensorRT-LLM's NVLink "
                            "kernels as measured in the card's alltoall_trtllm table (sim.models.nvlink_alltoall; "
                            "NCCL's where it lacks the shape or moe_ep)")

    @field_validator("shared_experts_overlap", mode="before")
    @classmethod
    def _off(cls, v):
        """YAML reads a bare `off` (or `no`, `false`) as False: that is `off`."""
        return "off" if v is False else v

    host_overhead_s: NonNegativeFloat | None = Field(
        None, description=f"Per-iteration host time; default {DEFAULT_HOST_OVERHEAD_S} s (see sim.models.ops)")
    host_per_sequence_s: NonNegativeFloat = Field(
        0.0, description="Host time per sequence in the pass, added to host_overhead_s: an engine whose scheduler "
                         "prepares each iteration's inputs and handles its outputs while the GPU waits (no async "
                         "scheduling: vLLM before 0.14) pays its per-request CPU work every iteration. Default 0 "
                         "(hidden behind the GPU, or negligible)")
