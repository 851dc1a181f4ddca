"""Linear-attention (Gated DeltaNet) layers in the ops model: Qwen3.5's three of every four layers.

Per such layer on one GPU of a tensor-parallel group of tp (heads split over the GPUs, as every engine shards them):

- GEMMs at M = the pass's tokens: in_proj_qkvz (N = (2 key heads x key dim + 2 value heads x value dim) / tp: q, k,
  v and the output gate z), in_proj_ba (N = 2 value heads / tp: each head's b and a), out_proj (N = hidden,
  K = value heads x value dim / tp); one all-reduce after out_proj, as after a full-attention layer's O;
- kernels from an engine's measured table (step_time.model.linear_attention_kernels; gdn_<phase>_<engine>.csv.gz,
  benchmarks/aiconfigurator_gdn.py), the short convolution and the delta rule added: the prefill chunks as one
  chunked call over b chunks of their mean length (the work is linear in tokens: no pairs), in launches of at most
  the largest batch measured; the decodes as one recurrent call over their count (a decode's state is the same
  size at any context).

Not counted: the layer's small element-wise work (q / k L2 norms, the gated RMSNorm, the gate's sigmoid): the full
layers' small ops (sim.models.ops.SMALL_OPS) stand for them.
"""

from __future__ import annotations

import math

from sim.io.errors import ConfigError
from sim.models.ops_tables import MCurve, TableSet, find_table, _cached, AttentionTable


class LinearAttentionOps:
    """One linear-attention layer's attention block on one GPU (its GEMMs and kernels, not the all-reduce)."""

    def __init__(self, spec, tables: TableSet, gemm_table, engine: str, tp: int, look):
        lin, h = spec.profile.linear_attention, spec.profile.hidden_size
        self.look = look
        kd, vd, nv = (lin.num_key_heads * lin.key_head_dim // tp, lin.num_value_heads * lin.value_head_dim // tp,
                      lin.num_value_heads // tp)
        g = gemm_table
        self.gemm_shapes = {"in_proj_qkvz": (2 * kd + 2 * vd, h), "in_proj_ba": (2 * nv, h), "out_proj": (h, vd)}
        self.gemms = {name: MCurve(g.ms, g.curve(n, k), f"{g.path.name}: {name} GEMM m (tokens)")
                      for name, (n, k) in self.gemm_shapes.items()}
        heads = (lin.num_key_heads // tp, lin.num_value_heads // tp, lin.key_head_dim)
        self.context = self._table(tables, "context", engine).shape(*heads)
        self.generation = self._table(tables, "generation", engine).shape(*heads)
        self._cache: dict[float, float] = {}

    @staticmethod
    def _table(tables: TableSet, phase: str, engine: str) -> AttentionTable:
        stem = f"gdn_{phase}_{engine}"
        path = find_table(tables.folder, stem)
        if path is None:
            have = sorted(p.name.split(".")[0] for p in tables.folder.glob("gdn_*"))
            raise ConfigError(f"{tables.folder}: no {stem}.csv[.gz] for the linear-attention layers "
                              f"(step_time.model.linear_attention_kernels: {engine}); this table set has "
                              f"{', '.join(have) or 'none'} (benchmarks/aiconfigurator_gdn.py writes them)")
        return _cached(AttentionTable, path, phase == "generation")

    def gemms_s(self, tokens: float) -> float:
        """The layer's three GEMMs over `tokens` tokens."""
        t = self._cache.get(tokens)
        if t is None:
            t = sum(self.look(c.at, tokens) for c in self.gemms.values())
            if len(self._cache) < 65536:
                self._cache[tokens] = t
        return t

    def prefill_s(self, seqs: float, tokens: float) -> float:
        """The kernels over `seqs` prefill chunks of `tokens` tokens in all."""
        if seqs <= 0 or tokens <= 0:
            return 0.0
        launches = max(1, math.ceil(seqs / self.context.largest_batch))
        return launches * self.look(self.context.at, seqs / launches, max(tokens / seqs, 1.0))

    def decode_s(self, seqs: float) -> float:
        """The kernels over `seqs` decoding sequences."""
        return self.look(self.generation.at, seqs, 1.0) if seqs > 0 else 0.0
