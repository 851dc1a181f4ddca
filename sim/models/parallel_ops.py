"""Operator-level step times of a replica spread over GPUs (issue [parallel]): the ops model
(sim.models.ops) extended to pipeline stages, MoE layers with expert parallelism, and MLA attention.

Per layer on one GPU (tp GPUs per stage, see sim.models.parallel for what each holds):

- attention GEMMs at M = the pass's tokens: QKV and O split by heads, or MLA's q_a and kv_a (replicated; one
  fused GEMM of q_lora_rank + kv_lora_rank + rope columns, as vLLM's fused_qkv_a_proj, SGLang's
  fused_qkv_a_proj_with_mqa and TensorRT-LLM's fused_a run them) and q_b, kv_b, O (split by heads); one all-reduce of M x hidden BF16 values after O under tp, and one of
  M x 2 FP32 values before RoPE when the q / k norm spans the layer's heads (MiniMax-M2, `qk_norm_span: layer`);
- dense layers: gate+up and down split tp ways and an all-reduce, as in sim.models.ops;
- MoE layers: the router (M x hidden x E, replicated; from the BF16 table in every weight format, since checkpoints
  leave the gate unquantised); the routed experts from an engine's measured fused-MoE
  kernel (profiles/ops/<card>/moe.csv, sim.models.moe_tables: the whole routed step for M tokens entering
  a GPU of E / ep experts split tp / ep ways, balanced routing; `moe_kernels`: vllm by default, sglang,
  trtllm) when the table has the layer's shape, dtype and split and the layout's routing is not skewed (with
  `expert_imbalance` the busiest GPU runs the kernel at that many times the tokens: an upper bound at decode, where
  its extra tokens mostly land on experts already read); otherwise (or `moe_kernels: composed`) as one grouped GEMM per
  projection over the GPU's E / ep experts: with T tokens touching D = sum_e 1 - (1 - q_e)^T distinct
  experts (q_e = k p_e, uniform p_e = 1/E unless parallel.routing_skew gives Zipf popularity), the
  busiest GPU runs D / ep experts with T k x expert_imbalance / D tokens each, costing D / E of the
  GEMM over all its experts at that M (weights read: the touched experts'; FLOPs: the active ones');
  shared experts as a dense FFN split tp ways, on a second CUDA stream beside the router and routed experts
  (the longer path counts) where the engine does so (`shared_experts_overlap`); communication: an all-reduce over tp of the layer's output
  (ep = 1, or ep > 1 with `ep_communication: all_reduce`, the default: attention is tensor-parallel, so
  every GPU already holds every token and only the combine costs, as in vLLM's and TensorRT-LLM's MoE
  without attention data parallelism), or with `all_to_all` dispatch and combine of each GPU's T k / ep
  routed token vectors (nccl_parallel.csv; SGLang's DeepEP, sim.models.deepep; TensorRT-LLM's NVLink kernels,
  sim.models.nvlink_alltoall) plus an all-reduce over the tp / ep GPUs that split each expert when that exceeds one;
- attention kernels from the tables: GQA / MHA as sim.models.ops; MLA (no measured kernel): context
  attention as MHA of the GPU's heads at head_dim 128 scaled by (qk 192 + v 128) / 256 = 1.25 (FLOPs),
  generation attention as MQA (1 KV head) of the GPU's heads over the latent's bytes per token in cached tokens,
  (512 + 64) / (2 x 128) = 2.25 times as many (decode attention reads the cache, bandwidth bound; the kernel's
  per-launch time stays, as for an FP8 cache's half bytes, sim.models.ops.KV_READ_SCALE);
- small element-wise ops as sim.models.ops, over the widths this GPU sees (with a q / k norm model's two norms
  unless the engine fuses them into RoPE, `qk_norm_kernels`; with MLA's two latent norms, q_a_layernorm over
  q_lora_rank values a token and kv_a_layernorm over kv_lora_rank, which every engine runs as kernels of their own).

Pipeline (pp > 1): stage s runs its layers (the last adds lm_head); an iteration split into m
micro-batches takes sum_s t_s(T/m) + (m - 1) max_s t_s(T/m) + (pp - 1) send/recv(T/m x hidden x 2 B) (over the
NICs where a boundary leaves a node: sim.models.collectives.stage_crossings), so with m = 1 every stage waits for the
others: the bubble, (pp - 1) / (m + pp - 1) of each GPU's time, shows in the iteration times. One host overhead per
iteration.
"""

from __future__ import annotations

import math
import sys
from typing import NamedTuple

from sim.io.errors import ConfigError
from sim.io.notices import say_once
from sim.io.ops_schema import DEFAULT_HOST_OVERHEAD_S, OpsStepTime
from sim.models.ops import OpsModel, SMALL_OPS, REFERENCE_BANDWIDTH_GBS, ops_dtype, qk_norm_ops
from sim.models.collectives import Collectives, Fabric, fabric_of, stage_crossings, table_collectives
from sim.models.deepep import DeepEP
from sim.models.nvlink_alltoall import nvlink_exchange
from sim.models.linear_ops import LinearAttentionOps
from sim.models.moe_tables import MoeTable
from sim.models.ops_tables import MCurve, NcclTable, TableSet, _cached, find_table, load_table_set
from sim.models.parallel import Layout, distinct_experts, expert_probabilities, stage_layers
from sim.models.spec import ModelSpec

MOE_DTYPES = {"bf16": ("bfloat16",), "fp8": ("fp8_block", "fp8"), "nvfp4": ("nvfp4",), "mxfp4": ("w4a16_mxfp4",)}
"""GEMM dtype -> the fused-MoE table's dtypes to look for, in order (released FP8 MoE checkpoints are
block-quantised: DeepSeek-V3, Qwen3-235B-A22B-FP8, MiniMax-M2.5; gpt-oss's MXFP4 experts run with BF16
activations, the checkpoint's own format and AIConfigurator's reading of it, `w4a16_mxfp4`)."""


MXFP8_ACTIVATIONS = "w4a8_mxfp4_mxfp8"
"""The fused-MoE table's dtype of MXFP4 experts run with MXFP8 activations (step_time.model.mxfp4_activations)."""


def expert_ops_dtype(cfg: OpsStepTime, expert_format: str) -> str:
    """The routed experts' dtype: ops_dtype's, or mxfp4 (no GEMM table of its own: _expert_gemm_dtype)."""
    return "mxfp4" if expert_format == "mxfp4" and cfg.dtype is None else ops_dtype(cfg, expert_format,
                                                                                   "expert_weight_format")


def _expert_gemm_dtype(tables: TableSet, dtype: str) -> str:
    """The GEMM table that times experts composed from GEMMs: their own, or for MXFP4 experts (no table measures
    them) the card's NVFP4 one where it has one (4-bit weights, Blackwell), else BF16 (the weights dequantized)."""
    if dtype != "mxfp4":
        return dtype
    return "nvfp4" if find_table(tables.folder, "gemm_nvfp4") is not None else "bf16"
MLA_CONTEXT_SCALE = (192 + 128) / 256
"""MLA prefill per head: QK over 192 dims and PV over 128, against the 128 + 128 of the measured MHA kernel."""
MLA_GENERATION_SCALE = (512 + 64) / (2 * 128)
"""MLA decode reads the latent (512 + 64 values) per token per layer, against one KV head's 2 x 128."""


class RankLoad(NamedTuple):
    """One attention data-parallel rank's part of a pass (ParallelOpsModel.busiest_rank)."""

    tokens: float
    pre_seqs: float
    pre_pairs: float
    dec_seqs: float
    dec_kv: float
    logits: float
    dec_tokens: float | None = None
    """The decodes' positions (speculative verification: k + 1 a sequence); None: one each, or every token of a
    pass without prefill (busiest_rank's default)."""

    def decode_positions(self) -> float:
        """dec_tokens, or its default."""
        if self.dec_tokens is not None:
            return self.dec_tokens
        return self.tokens if self.pre_seqs == 0 else min(self.dec_seqs, self.tokens)


class ParallelOpsModel(OpsModel):
    """`step_s(plan)` of a replica under `layout` (pipeline, MoE / expert parallelism, MLA); see the module."""

    def __init__(self, cfg: OpsStepTime, spec: ModelSpec, tables: TableSet, dtype: str, memory_bandwidth_gbs: float,
                 layout: Layout, allow_extrapolation: bool = False, stream=None, fabric: Fabric | None = None):
        p = spec.profile
        self.cfg, self.spec, self.tables, self.dtype, self.layout = cfg, spec, tables, dtype, layout
        self.tp = tp = layout.tp
        self.layers = p.num_layers
        self.heads = p.num_attention_heads // tp
        self.kv_heads = 1 if p.mla is not None else max(p.num_kv_heads // tp, 1)
        self.allow, self.stream, self._warned = allow_extrapolation, stream or sys.stderr, False
        self.host_s = DEFAULT_HOST_OVERHEAD_S if cfg.host_overhead_s is None else cfg.host_overhead_s
        self.host_seq_s = cfg.host_per_sequence_s
        self.mixed = cfg.mixed
        self.moe = p.moe
        self._probs = expert_probabilities(p.moe.num_experts, layout.routing_skew) if p.moe else None
        self._attention_tables(tables)
        # the routed experts' GEMMs in their own format when the checkpoint quantizes them alone (ModelSpec.expert_format)
        self.expert_dtype = dtype if spec.expert_format is None else expert_ops_dtype(cfg, spec.expert_format)
        # and the attention's when the checkpoint keeps them apart (ModelSpec.attention_format)
        self.attention_dtype = dtype if spec.attention_format is None else ops_dtype(cfg, spec.attention_format,
                                                                                     "attention_weight_format")
        self._build_curves(tables, dtype)
        self.linear = None  # a linear-attention model's Gated DeltaNet layers (sim.models.linear_ops)
        if p.linear_attention is not None:
            self.linear = LinearAttentionOps(spec, tables, tables.gemm(self.attention_dtype),
                                             cfg.linear_attention_kernels, tp, self._look)
        self.moe_kernel = self._moe_kernel(tables, self.expert_dtype) if p.moe else None
        self.deepep = DeepEP.build(tables, spec, layout, cfg, self._moe_candidates(self.expert_dtype), self.stream)
        self.nvlink = nvlink_exchange(tables, spec, layout, cfg, self.expert_dtype, self.stream)
        self.dp = layout.attention_dp
        sum_len = self.dp > 1 and cfg.dp_prefill_gather == "all_reduce"  # all-reduces over the expert GPUs (_combine_s)
        self.ar = self.nccl = None
        if tp > 1 or layout.moe_tp > 1 or sum_len:
            self.ar, self.nccl = table_collectives(tables, fabric, cfg.all_reduce)
        if tp > 1 or self.dp > 1:
            self.nccl = self.nccl or Collectives(tables.nccl(), fabric)
        else:
            self.nccl = None
        self.net = None
        if (layout.ep > 1 and layout.ep_communication == "all_to_all") or layout.pp > 1:
            path = find_table(tables.folder, "nccl_parallel")
            if path is None:
                raise ConfigError(f"{tables.folder}: no nccl_parallel.csv (all-to-all and send/recv for expert and "
                                  "pipeline parallelism; benchmarks/parallel_collectives.py writes it)")
            self.net = Collectives(_cached(NcclTable, path), fabric)
        self.pp_crossings = stage_crossings(layout.expert_gpus, layout.pp, fabric and fabric.scale_up_gpus)
        self._check_collectives()
        self._scale = REFERENCE_BANDWIDTH_GBS / memory_bandwidth_gbs
        self.stages = stage_layers(p.num_layers, layout.pp)
        dense_upto = p.moe.num_dense_layers if p.moe else p.num_layers
        self.stage_kinds = [(sum(1 for i in r if i < dense_upto), sum(1 for i in r if i >= dense_upto))
                            for r in self.stages]
        self.stage_linear = [sum(1 for i in r if spec.linear_layer(i)) for r in self.stages]
        self._layer_cache: dict = {}

    # ---- construction ---------------------------------------------------------------------
    def _attention_tables(self, tables: TableSet) -> None:
        p = self.spec.profile
        if p.mla is None:
            self.context = tables.context().shape(self.heads, self.kv_heads, p.head_dim)
            self.generation = tables.generation().shape(self.heads, self.kv_heads, p.head_dim)
            self.context_scale = self.generation_scale = 1.0
        else:
            self.context = tables.context().shape(self.heads, self.heads, 128)
            self.generation = tables.generation().shape(self.heads, 1, 128)
            self.context_scale, self.generation_scale = MLA_CONTEXT_SCALE, MLA_GENERATION_SCALE

    def measure_mla(self, kv_format: str) -> None:
        """Time MLA attention with the engine's measured kernels (step_time.model.mla_kernels) for this KV format, where
        the table set has them: heads per GPU as measured, the latent's bytes inside the kernel. Keeps the composition
        (and says so once) where they are missing."""
        engine, p = self.cfg.mla_kernels, self.spec.profile
        if engine == "composed" or p.mla is None:
            return
        kv = "fp8" if kv_format == "fp8" else "bf16"
        kv = kv if self.tables.mla("generation", engine, kv) is not None else "bf16"
        gen, ctx = self.tables.mla("generation", engine, kv), self.tables.mla("context", engine, kv)
        if gen is None or ctx is None:
            say_once((str(self.tables.folder), engine, "mla"),
                     f"note: {self.tables.folder}: no {engine} MLA kernel table (mla_generation_{engine}_{kv}, "
                     f"mla_context_{engine}_{kv}); {p.name}'s attention is composed (step_time.model.mla_kernels)",
                     self.stream)
            return
        dim = p.mla.kv_lora_rank + p.mla.qk_rope_head_dim
        self.generation, self.context = gen.shape(self.heads, 1, dim), ctx.shape(self.heads, 1, dim)
        self.context_scale = self.generation_scale = 1.0
        if kv == kv_format or kv_format == "fp16":
            self.kv_read_scale = 1.0

    def _shapes(self) -> tuple[dict, dict, dict]:
        """(attention, dense FFN, MoE) GEMM shapes (n, k) on one GPU."""
        p, lay, h, H = self.spec.profile, self.layout, self.spec.profile.hidden_size, self.heads
        if p.mla is None:
            hd = p.head_dim
            q = H * (2 if p.attention_output_gate else 1)  # the output gate is projected with the queries
            att = {"qkv": ((q + 2 * self.kv_heads) * hd, h), "o": (h, H * hd)}
        else:
            m = p.mla
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            kv_a = m.kv_lora_rank + m.qk_rope_head_dim
            att = {"kv_b": (H * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank), "o": (h, H * m.v_head_dim)}
            if m.q_lora_rank:  # q_a and kv_a read the same input: one GEMM in vLLM, SGLang and TensorRT-LLM
                att.update(qkv_a=(m.q_lora_rank + kv_a, h), q_b=(H * qk, m.q_lora_rank))
            else:
                att.update(kv_a=(kv_a, h), q=(H * qk, h))
        dense = {"gate_up": (2 * p.intermediate_size // lay.tp, h), "down": (h, p.intermediate_size // lay.tp)}
        moe = {}
        if p.moe is not None:
            e = p.moe
            local = e.num_experts // lay.ep
            width = e.expert_intermediate_size // lay.moe_tp
            moe = {"router": (e.num_experts, h), "experts_gate_up": (local * 2 * width, h),
                   "experts_down": (local * h, width)}
            if e.num_shared_experts:
                shared = e.num_shared_experts * e.expert_intermediate_size // lay.tp
                moe.update(shared_gate_up=(2 * shared, h), shared_down=(h, shared))
        return att, dense, moe

    def _build_curves(self, tables: TableSet, dtype: str) -> None:
        p = self.spec.profile
        g = tables.gemm(dtype)
        ge = g if self.expert_dtype == dtype else tables.gemm(_expert_gemm_dtype(tables, self.expert_dtype))
        ga = g if self.attention_dtype == dtype else tables.gemm(self.attention_dtype)
        att, dense, moe = self._shapes()
        self.gemm_shapes = {**att, **dense, **moe}
        lm = tables.gemm("bf16")
        curve = {name: MCurve(t.ms, t.curve(n, k), f"{t.path.name}: {name} GEMM m (tokens)")
                 for name, (n, k) in self.gemm_shapes.items()
                 for t in [ge if name.startswith("experts_") else ga if name in att else lm if name == "router" else g]}
        self.att_gemms = {k: curve[k] for k in att}
        self.dense_gemms = {k: curve[k] for k in dense}
        self.moe_gemms = {k: curve[k] for k in moe}
        self.gemms = {**self.att_gemms, **self.dense_gemms}  # what OpsModel.breakdown_s names
        self.lm_head = MCurve(lm.ms, lm.curve(p.vocab_size / self.tp, p.hidden_size),
                              f"{lm.path.name}: lm_head GEMM m (sequences)")

    def _moe_kernel(self, tables: TableSet, dtype: str):
        """The measured fused-MoE curve over tokens for this layer's shape, dtype and expert split, or None
        (no table, engine, shape or split not measured, skewed routing, or `moe_kernels: composed`). Imbalance
        keeps the kernel: the busiest GPU runs it at expert_imbalance times the tokens (`_moe_ffn_s`)."""
        lay, e = self.layout, self.moe
        if self.cfg.moe_kernels == "composed":
            return None
        path = find_table(tables.folder, "moe")
        if path is None:
            return None
        if lay.routing_skew != 0:  # the tables measure balanced and power-law routing, not this popularity
            say_once((path, "skew", self.spec.profile.name, lay.routing_skew),
                     f"note: parallel.routing_skew {lay.routing_skew:g}: {self.spec.profile.name}'s routed experts are "
                     f"composed from GEMMs (the measured fused-MoE kernels of {path} assume "
                     f"{self.cfg.moe_routing} routing)", self.stream)
            return None
        table = _cached(MoeTable, path)
        for engine, name in self._moe_candidates(dtype):
            curve = table.curve(engine, name, self.cfg.moe_routing, self.spec.profile.hidden_size,
                                e.expert_intermediate_size, e.experts_per_token, e.num_experts, lay.moe_tp, lay.ep)
            if curve is not None:
                if engine != self.cfg.moe_kernels or name not in MOE_DTYPES[dtype]:
                    say_once((path, self.cfg.moe_kernels, name, engine, self.spec.profile.name, lay.moe_tp, lay.ep),
                             f"note: {path}: {self.spec.profile.name}'s MXFP4 experts with MXFP8 activations take "
                             f"{engine}'s measured {name} kernel (FlashInfer's TRT-LLM-gen MoE, the one "
                             f"{self.cfg.moe_kernels} calls; not measured under {self.cfg.moe_kernels})", self.stream)
                return curve
        tried = ", ".join(name if engine == self.cfg.moe_kernels else f"{engine}'s {name}"
                          for engine, name in self._moe_candidates(dtype))
        say_once((path, self.cfg.moe_kernels, dtype, self.cfg.moe_routing, self.spec.profile.name, lay.moe_tp, lay.ep),
                 f"note: {path}: no {self.cfg.moe_kernels} fused-MoE kernel for {self.spec.profile.name}'s experts "
                 f"({tried}, {self.cfg.moe_routing}, moe_tp {lay.moe_tp} moe_ep {lay.ep}); "
                 "its routed experts are composed from GEMMs", self.stream)  # once: a sweep builds it many times
        return None

    def _moe_candidates(self, dtype: str) -> list[tuple[str, str]]:
        """(engine, table dtype) to look for, in order: the engine's kernels of the dtype; for MXFP4 experts with
        MXFP8 activations (step_time.model.mxfp4_activations) the engine's w4a8_mxfp4_mxfp8 kernel, else SGLang's
        (FlashInfer's trtllm_fp4_block_scale_moe, which vLLM's MXFP8 path calls too; their BF16-activation
        measurements of it agree within 1% on B200), and nothing else: no silent fall-back to BF16 activations."""
        engine = self.cfg.moe_kernels
        if dtype == "mxfp4" and self.cfg.mxfp4_activations == "mxfp8":
            return [(engine, MXFP8_ACTIVATIONS)] + ([("sglang", MXFP8_ACTIVATIONS)] if engine == "vllm" else [])
        return [(engine, name) for name in MOE_DTYPES[dtype]]

    def _check_collectives(self) -> None:
        lay = self.layout
        need = []
        if lay.tp > 1:  # the layers' all-reduces, and the logits' all-gather (OpsModel.head_s)
            need += [(self.ar, "all_reduce", lay.tp, "parallel.tp"), (self.nccl, "all_gather", lay.tp, "parallel.tp")]
        if self.dp > 1 and lay.ep_communication == "all_reduce":
            need.append((self.nccl, "all_gather", lay.expert_gpus, "parallel.attention_dp"))
            if self.cfg.dp_prefill_gather == "all_reduce":
                need.append((self.ar, "all_reduce", lay.expert_gpus, "parallel.attention_dp"))
        if lay.ep > 1 and lay.ep_communication == "all_to_all":
            need.append((self.net, "alltoall", lay.ep, "parallel.ep"))
            if lay.moe_tp > 1:
                need.append((self.ar, "all_reduce", lay.moe_tp, "parallel.tp / parallel.ep"))
        if lay.pp > 1:
            need.append((self.net, "send_recv", 2, "parallel.pp"))
            if self.pp_crossings and self.net.fabric.scale_out_bytes_per_s is None:
                raise ConfigError(f"parallel.pp: {self.net.cross_domain_why()}")
        for table, op, gpus, field in need:
            if why := table.why_not(op, gpus):
                raise ConfigError(f"{field}: {why}; allowed: those GPU counts (sim.models.collectives)")

    # ---- per layer --------------------------------------------------------------------------
    def _small_s(self, tokens: float, ffn_width: float) -> float:
        p = self.spec.profile
        rope = (self.heads + self.kv_heads) * (p.head_dim if p.mla is None else p.mla.qk_rope_head_dim)
        widths = {"hidden": p.hidden_size, "qk": rope, "intermediate": ffn_width}
        const = sum(c * a for c, a, _, _ in SMALL_OPS.values())
        qk_const, qk_width = qk_norm_ops(self.cfg, p, (self.heads + self.kv_heads) * p.head_dim)
        if p.mla is not None:  # MLA's own RMSNorms of the compressed q and kv (q_a_layernorm, kv_a_layernorm)
            _, a, b, _ = SMALL_OPS["rms_norm"]
            norms = [w for w in (p.mla.q_lora_rank, p.mla.kv_lora_rank) if w]
            qk_const, qk_width = qk_const + a * len(norms), qk_width + b * sum(norms)
        return (const + qk_const + tokens * (sum(c * b * widths[w] * self._scale for c, _, b, w in SMALL_OPS.values())
                                             + qk_width * self._scale))

    def _all_reduce(self, gpus: int, tokens: float, nbytes_per_token: float | None = None) -> float:
        if gpus <= 1:
            return 0.0
        per_token = self.spec.profile.hidden_size * 2 if nbytes_per_token is None else nbytes_per_token
        return self._look(self.ar.at, "all_reduce", gpus, tokens * per_token)

    def _qk_norm_s(self, tokens: float) -> float:
        """A layer-wide q / k norm's all-reduce of each token's two FP32 sums of squares (qk_norm_span: layer)."""
        p = self.spec.profile
        if not (p.qk_norm and p.qk_norm_span == "layer"):
            return 0.0
        return self._all_reduce(self.tp, tokens, 2 * 4)

    def _shared_overlaps(self, rank_tokens: float, decode_only: bool) -> bool:
        """Whether the shared experts run beside the routed ones in this pass (step_time.model.shared_experts_overlap)."""
        mode = self.cfg.shared_experts_overlap
        if mode in ("off", "fused") or not self.moe.num_shared_experts:
            return False
        return decode_only if mode == "decode" else rank_tokens <= mode

    def _moe_ffn_s(self, tokens: float, decode_only: bool = False, rank: float | None = None) -> float:
        """Router, routed and shared experts and their communication for one MoE layer; the shared experts on a
        second stream (the longer path counts) when `_shared_overlaps`. `rank`: the busiest attention
        data-parallel rank's tokens (default: an even share; all of them without data parallelism)."""
        e, lay = self.moe, self.layout
        g = self.moe_gemms
        rank = tokens / self.dp if rank is None else rank
        wide = self.deepep.routed_s(tokens * lay.expert_imbalance, decode_only, self._look) if self.deepep else None
        if wide is not None:  # SGLang's DeepEP path (sim.models.deepep)
            routed, routed_width = wide, 0.0
        elif self.moe_kernel is not None:  # measured: the activation is inside the fused kernel; the busiest GPU's
            routed = self._look(self.moe_kernel.at, tokens * lay.expert_imbalance)  # experts get imbalance x the work
            routed_width = 0.0
        else:
            touched = distinct_experts(e.num_experts, e.experts_per_token, tokens, lay.routing_skew)
            per_expert = tokens * e.experts_per_token * lay.expert_imbalance / max(touched, 1e-9)
            share = touched / e.num_experts
            routed = share * (self._look(g["experts_gate_up"].at, per_expert) + self._look(g["experts_down"].at, per_expert))
            routed_width = e.experts_per_token * lay.expert_imbalance / lay.ep * e.expert_intermediate_size / lay.moe_tp
        t = self._look(g["router"].at, rank)
        if "shared_gate_up" in g and self._shared_fused():
            # the shared experts as more experts every token is routed to, no GEMMs of their own. A decode-only pass
            # is bound by the experts' weights: the kernel reads `shared` more experts beside the D its tokens
            # touch, (D + shared) / D; a pass with a prefill by the tokens' work: (k + shared) / k of it
            s = e.num_shared_experts
            base = (distinct_experts(e.num_experts, e.experts_per_token, tokens, lay.routing_skew) if decode_only
                    else e.experts_per_token)
            grow = (base + s) / base
            return (t + routed * grow + self._combine_s(tokens, decode_only)
                    + self._small_s(rank, routed_width * (e.experts_per_token + s) / e.experts_per_token))
        t += routed
        if "shared_gate_up" in g:
            shared = self._look(g["shared_gate_up"].at, rank) + self._look(g["shared_down"].at, rank)
            t = max(t, shared) if self._shared_overlaps(rank, decode_only) else t + shared
        width = routed_width + e.num_shared_experts * e.expert_intermediate_size / lay.tp
        return t + self._combine_s(tokens, decode_only) + self._small_s(rank, width)

    def _shared_fused(self) -> bool:
        """Whether the shared experts run inside the routed kernel (shared_experts_overlap `fused`, experts not spread
        over GPUs: SGLang turns the fusion off under expert parallelism on NVIDIA cards)."""
        return self.cfg.shared_experts_overlap == "fused" and self.layout.ep == 1

    def _combine_s(self, tokens: float, decode_only: bool = False) -> float:
        """A MoE layer's communication: the experts' outputs combined over the GPUs (see the module)."""
        lay, e, h = self.layout, self.moe, self.spec.profile.hidden_size
        if self.dp > 1 and lay.ep_communication == "all_reduce":
            if self.cfg.dp_prefill_gather == "all_reduce" and not decode_only:
                # SGLang's SUM_LEN gather: a zeroed buffer of every rank's tokens all-reduced in, and the experts'
                # output all-reduced before each rank copies its slice out
                return 2 * self._all_reduce(lay.expert_gpus, tokens)
            # every rank's tokens gathered to the expert GPUs and the outputs scattered back (reduce-scatter,
            # costed as an all-gather of the same bytes)
            return 2 * self._look(self.nccl.at, "all_gather", lay.expert_gpus, tokens * h * 2)
        if lay.ep == 1 or lay.ep_communication == "all_reduce":
            return self._all_reduce(lay.tp, tokens)
        if self.deepep is not None:  # DeepEP's dispatch and combine of a rank's tokens (sim.models.deepep)
            return self.deepep.exchange_s(tokens / self.dp, decode_only, self._look) + self._all_reduce(lay.moe_tp, tokens)
        if self.nvlink is not None:  # TensorRT-LLM's NVLink dispatch and combine of a rank's tokens
            return self._look(self.nvlink.at, max(tokens / self.dp, 1.0)) + self._all_reduce(lay.moe_tp, tokens)
        routed = tokens * e.experts_per_token * h * 2 / lay.ep
        return 2 * self._look(self.net.at, "alltoall", lay.ep, routed) + self._all_reduce(lay.moe_tp, tokens)

    def layer_linear_s(self, tokens: float, moe: bool = False, decode_only: bool = False,
                       rank: float | None = None) -> float:
        """One layer's GEMMs, collectives and small ops for a pass over `tokens` tokens (`decode_only`: the pass
        has no prefill chunk; `rank`: the busiest attention data-parallel rank's tokens, default an even share)."""
        r = tokens / self.dp if rank is None else rank  # attention and dense FFNs run on each rank's own tokens
        key = (tokens, r, moe, decode_only and moe)
        t = self._layer_cache.get(key)
        if t is None:
            t = (sum(self._look(c.at, r) for c in self.att_gemms.values()) + self._all_reduce(self.tp, r)
                 + self._qk_norm_s(r))
            if moe:
                t += self._moe_ffn_s(tokens, decode_only, r)
            else:
                t += sum(self._look(c.at, r) for c in self.dense_gemms.values()) + self._all_reduce(self.tp, r)
                t += self._small_s(r, self.spec.profile.intermediate_size / self.tp)
            if len(self._layer_cache) < 65536:
                self._layer_cache[key] = t
        return t

    def context_attention_s(self, seqs: float, pairs: float) -> float:
        """One layer's prefill attention (MLA scaled, see the module)."""
        return self.context_scale * super().context_attention_s(seqs, pairs)

    def generation_attention_s(self, seqs: float, kv_tokens: float) -> float:
        """One layer's decode attention (MLA: over generation_scale times the cached tokens, see the module)."""
        return super().generation_attention_s(seqs, kv_tokens * self.generation_scale)

    # ---- a pass -------------------------------------------------------------------------------
    def busiest_rank(self, tokens: float, pre_seqs: float, pre_pairs: float, dec_seqs: float, dec_kv: float,
                     logits: float, dec_tokens: float | None = None) -> RankLoad:
        """The busiest attention data-parallel rank's part of a pass. A sequence runs on one rank (a prompt's
        attention is never split over ranks), so the busiest rank holds ceil(n / dp) of the pass's prefill
        sequences and ceil(n / dp) of its decodes, each with the mean sequence's tokens, pairs and KV; the pass
        waits for it. Without data parallelism: the whole pass. `dec_tokens`: the decodes' positions (default:
        one each, or every token of a pass without prefill)."""
        dp = self.dp
        if dp == 1:
            return RankLoad(tokens, pre_seqs, pre_pairs, dec_seqs, dec_kv, logits, dec_tokens)
        if dec_tokens is None:
            dec_tokens = tokens if pre_seqs == 0 else min(dec_seqs, tokens)
        kp, kd = math.ceil(pre_seqs / dp - 1e-9), math.ceil(dec_seqs / dp - 1e-9)
        fp = kp / pre_seqs if pre_seqs else 0.0
        fd = kd / dec_seqs if dec_seqs else 0.0
        return RankLoad((tokens - dec_tokens) * fp + dec_tokens * fd, kp, pre_pairs * fp, kd, dec_kv * fd,
                        math.ceil(logits / dp - 1e-9), dec_tokens * fd)

    def stage_s(self, stage: int, tokens: float, rank: RankLoad) -> float:
        """One pipeline stage's time for (a micro-batch of) the pass: `tokens` in all, `rank` the busiest
        attention data-parallel rank's part (busiest_rank)."""
        dense, moe = self.stage_kinds[stage]
        att = (self.context_attention_s(rank.pre_seqs, rank.pre_pairs)
               + self.generation_attention_s(rank.dec_seqs, rank.dec_kv))
        t = dense * (self.layer_linear_s(tokens, rank=rank.tokens) + att) if dense else 0.0
        if moe:
            t += moe * (self.layer_linear_s(tokens, True, rank.pre_seqs == 0, rank.tokens) + att)
        if self.stage_linear[stage]:  # linear-attention layers: their own GEMMs and kernels in place of attention's
            t += self.stage_linear[stage] * (self._linear_block_s(rank) - att
                                             - sum(self._look(c.at, rank.tokens) for c in self.att_gemms.values()))
        if stage == len(self.stages) - 1:
            t += self.head_s(rank.logits)
        return t

    def _linear_block_s(self, rank: RankLoad) -> float:
        """One linear-attention layer's GEMMs and kernels for the busiest rank's part of a pass: its prefill tokens (all
        but the decodes' positions) in one chunked call, its decodes as one recurrent call per position a sequence
        (a speculative verification of k + 1 positions: k + 1 steps)."""
        lin = self.linear
        dec_pos = rank.decode_positions()
        prefill = max(rank.tokens - dec_pos, rank.pre_seqs) if rank.pre_seqs else 0.0
        steps = max(dec_pos / rank.dec_seqs, 1.0) if rank.dec_seqs else 0.0
        return lin.gemms_s(rank.tokens) + lin.prefill_s(rank.pre_seqs, prefill) + steps * lin.decode_s(rank.dec_seqs)

    def _rank_pass_s(self, tokens: float, rank: RankLoad) -> float:
        """One pass without pipeline stages as `rank` (the busiest attention data-parallel rank) makes it last."""
        return self.host_s + self.host_seq_s * (rank.pre_seqs + rank.dec_seqs) + self.stage_s(0, tokens, rank)

    def pass_s(self, tokens: int, pre_seqs: int, pre_pairs: int, dec_seqs: int, dec_kv: int, logits: int,
               dec_tokens: int | None = None, ranks: list[RankLoad] | None = None) -> float:
        """One forward pass: host overhead, the stages (pipelined over micro-batches), lm_head. `ranks`: each
        attention data-parallel rank's own part where requests are bound to ranks (StepPlan.rank_loads): the pass
        waits for the one that takes longest; else busiest_rank's even share."""
        if tokens == 0:
            return 0.0
        pp = self.layout.pp
        busy = [r for r in ranks if r.tokens] if ranks is not None else None
        if pp == 1:
            if busy:
                return max(self._rank_pass_s(tokens, r) for r in busy)
            return self._rank_pass_s(tokens, self.busiest_rank(tokens, pre_seqs, pre_pairs, dec_seqs, dec_kv, logits,
                                                              dec_tokens))
        m = max(1, min(self.layout.micro_batches, pre_seqs + dec_seqs))
        f = 1.0 / m
        if busy:
            top = max(busy, key=lambda r: self.stage_s(0, tokens, r))
            rank = RankLoad(*(None if v is None else v * f for v in top))
        else:
            dec_f = None if dec_tokens is None else dec_tokens * f
            rank = self.busiest_rank(tokens * f, pre_seqs * f, pre_pairs * f, dec_seqs * f, dec_kv * f, logits * f,
                                     dec_f)
        ts = [self.stage_s(s, tokens * f, rank) for s in range(pp)]
        hops = self._look(self.net.boundaries_s, tokens * f * self.spec.profile.hidden_size * 2, pp - 1,
                          self.pp_crossings)
        host = self.host_s + self.host_seq_s * (rank.pre_seqs + rank.dec_seqs) * m  # the busiest rank's sequences
        return host + sum(ts) + (m - 1) * max(ts) + hops

    # ---- ranks bound to their requests (StepPlan.rank_loads) ------------------------------------
    @staticmethod
    def _rank_parts(loads: tuple, part: str) -> list[RankLoad]:
        """Each rank's load (StepPlan.rank_loads, RANK_LOAD_FIELDS) for the plan's `part`: decode, prefill or
        pass (both in one)."""
        out = []
        for pt, ps, pq, pl, dp_, ds, dkv, dl in loads:
            if part == "decode":
                out.append(RankLoad(dp_, 0, 0, ds, dkv, dl, dp_))
            elif part == "prefill":
                out.append(RankLoad(pt, ps, pq, 0, 0, pl, 0))
            else:
                out.append(RankLoad(pt + dp_, ps, pq, ds, dkv, pl + dl, dp_))
        return out

    def decode_part_s(self, plan) -> float:
        """The decode sequences alone, as their own iteration (each bound rank's own, where the plan has them)."""
        if plan.rank_loads is None:
            return super().decode_part_s(plan)
        return self.pass_s(plan.decode_positions, 0, 0, plan.decode_seqs, plan.decode_kv_tokens, plan.decode_logits,
                           plan.decode_positions, self._rank_parts(plan.rank_loads, "decode"))

    def prefill_part_s(self, plan) -> float:
        """The prefill chunks alone, as their own iteration (each bound rank's own, where the plan has them)."""
        if plan.rank_loads is None:
            return super().prefill_part_s(plan)
        return self.pass_s(plan.prefill_tokens, plan.prefill_seqs, plan.prefill_pairs, 0, 0, plan.prefill_logits,
                           None, self._rank_parts(plan.rank_loads, "prefill"))

    def step_s(self, plan) -> float:
        """Seconds for the iteration `plan` (OpsModel.step_s), each bound rank's own part where the plan has them."""
        if plan.rank_loads is None or plan.prefill_seqs == 0 or plan.decode_seqs == 0 or self.mixed == "sum":
            return super().step_s(plan)
        one = self.pass_s(plan.decode_positions + plan.prefill_tokens, plan.prefill_seqs, plan.prefill_pairs,
                          plan.decode_seqs, plan.decode_kv_tokens, plan.decode_logits + plan.prefill_logits,
                          plan.decode_positions, self._rank_parts(plan.rank_loads, "pass"))
        return min(one, self.decode_part_s(plan) + self.prefill_part_s(plan))

    def breakdown_s(self, tokens: int, pre_seqs: int, pre_pairs: int, dec_seqs: int, dec_kv: int,
                    logits: int, dec_tokens: int | None = None) -> dict[str, float]:
        """One pass by component (seconds, whole pass; pipeline waits and send/recv in `pipeline`)."""
        dense = sum(d for d, _ in self.stage_kinds)
        moe = sum(m for _, m in self.stage_kinds)
        rank = self.busiest_rank(tokens, pre_seqs, pre_pairs, dec_seqs, dec_kv, logits, dec_tokens)
        per_layer = sum(self._look(c.at, rank.tokens) for c in self.att_gemms.values())
        att_g = (dense + moe) * per_layer
        ffn = (dense * (self.layer_linear_s(tokens, rank=rank.tokens) - per_layer)
               + moe * (self.layer_linear_s(tokens, True, pre_seqs == 0, rank.tokens) - per_layer))
        lin = sum(self.stage_linear)   # linear-attention layers: their own block in place of attention's
        full = dense + moe - lin
        out = {"attention_gemms": att_g - lin * per_layer, "ffn_and_collectives": ffn,
               "context_attention": full * self.context_attention_s(rank.pre_seqs, rank.pre_pairs),
               "generation_attention": full * self.generation_attention_s(rank.dec_seqs, rank.dec_kv),
               "lm_head": self.head_s(rank.logits),
               "host": self.host_s + self.host_seq_s * (rank.pre_seqs + rank.dec_seqs)}
        if lin:
            out["linear_attention"] = float(lin * self._linear_block_s(rank))
        out["pipeline"] = (self.pass_s(tokens, pre_seqs, pre_pairs, dec_seqs, dec_kv, logits, dec_tokens)
                           - sum(out.values()))
        return out


def build_replica_ops_model(cfg: OpsStepTime, spec: ModelSpec, hw, layout: Layout, weight_format: str,
                            kv_format: str, allow_extrapolation: bool, stream=None) -> OpsModel:
    """The ops model of a replica: OpsModel for one stage of a dense GQA model (TP from the layout),
    ParallelOpsModel for pipelines, MoE or MLA."""
    from sim.models.ops import build_ops_model, kv_read_scale
    p = spec.profile
    if (layout.pp == 1 and p.moe is None and p.mla is None and p.linear_attention is None
            and not p.attention_output_gate and spec.attention_format is None):
        if cfg.tp != layout.tp:
            cfg = cfg.model_copy(update={"tp": layout.tp})
        return build_ops_model(cfg, spec, hw, weight_format, kv_format, allow_extrapolation, stream)
    scale = kv_read_scale(kv_format)
    try:
        tables = load_table_set(cfg.tables or hw.name)
    except ConfigError as exc:  # say where the name came from
        where = "step_time.model.tables" if cfg.tables else f"step_time.model.tables (default: the hardware, {hw.name})"
        raise ConfigError(f"{where}: {exc}") from None
    model = ParallelOpsModel(cfg, spec, tables, ops_dtype(cfg, weight_format), hw.memory_bandwidth_gbs.value, layout,
                             allow_extrapolation, stream, fabric_of(hw))
    model.kv_read_scale = scale
    model.measure_mla(kv_format)
    return model
