"""Measured fused-MoE kernel timings (profiles/ops/<card>/moe.csv[.gz]).

One row is the latency of an engine's routed-expert step of one MoE layer on one GPU (gate/up, activation,
down and the weighted sum, as that engine's fused kernel) for `tokens` tokens entering a GPU that holds
experts / moe_ep experts, each split moe_tp ways, for a model shape (hidden, inter = one expert's width, topk,
experts), a weight dtype (bfloat16, fp8 per tensor, fp8_block, nvfp4, w4a16_mxfp4 and w4a8_mxfp4_mxfp8: MXFP4
weights with BF16 or MXFP8 activations) and a routing distribution of the tokens over the experts (balanced, or power_law_1.2: the busiest
experts get more than their share). Columns:

    engine,dtype,routing,hidden,inter,topk,experts,moe_tp,moe_ep,tokens,latency_us

engine: vllm, sglang or trtllm (MoE kernels differ between engines far more than GEMMs do).

A shape's points over `tokens` form a curve interpolated as a power law between measured points (like the GEMM
tables' m), the first point's latency below it, out of range beyond the last (extrapolated in proportion only
when the scenario allows it). benchmarks/aiconfigurator_moe.py writes the shipped tables.
"""

from __future__ import annotations

from pathlib import Path

from sim.io.errors import ConfigError
from sim.models.ops_tables import MCurve, read_table

MOE_COLUMNS = ("engine", "dtype", "routing", "hidden", "inter", "topk", "experts", "moe_tp", "moe_ep", "tokens", "latency_us")
MOE_DTYPES = ("bfloat16", "fp8", "fp8_block", "nvfp4", "w4a16_mxfp4", "w4a8_mxfp4_mxfp8")
MOE_ENGINES = ("vllm", "sglang", "trtllm")
MOE_ROUTINGS = ("balanced", "power_law_1.2")


class MoeTable:
    """Curves over tokens, one per (engine, dtype, routing, hidden, inter, topk, experts, moe_tp, moe_ep)."""

    def __init__(self, path: Path):
        t = read_table(path, MOE_COLUMNS, text_columns=("engine", "dtype", "routing"))
        self.path = path
        points: dict[tuple, dict[float, float]] = {}
        for i, (engine, dtype, routing) in enumerate(zip(t["engine"], t["dtype"], t["routing"])):
            line = i + 2
            for col, value, allowed in (("engine", engine, MOE_ENGINES), ("dtype", dtype, MOE_DTYPES),
                                        ("routing", routing, MOE_ROUTINGS)):
                if value not in allowed:
                    raise ConfigError(f"{path}: line {line}, column {col}: expected one of {', '.join(allowed)}, "
                                      f"got {value!r}")
            key = (engine, dtype, routing) + tuple(int(t[c][i]) for c in MOE_COLUMNS[3:9])
            tokens = t["tokens"][i]
            if tokens < 1:
                raise ConfigError(f"{path}: line {line}, column tokens: expected at least 1, got {tokens:g}")
            curve = points.setdefault(key, {})
            if tokens in curve:
                raise ConfigError(f"{path}: line {line}: a second row for {dict(zip(MOE_COLUMNS, key))} at "
                                  f"tokens {tokens:g}")
            curve[tokens] = t["latency_us"][i] * 1e-6
        self._points = points

    def keys(self) -> list[tuple]:
        """Every (engine, dtype, routing, hidden, inter, topk, experts, moe_tp, moe_ep) measured."""
        return sorted(self._points)

    def curve(self, engine: str, dtype: str, routing: str, hidden: int, inter: int, topk: int, experts: int,
              moe_tp: int, moe_ep: int) -> MCurve | None:
        """One engine's latency curve over tokens of one shape, split and routing, or None when not measured."""
        pts = self._points.get((engine, dtype, routing, hidden, inter, topk, experts, moe_tp, moe_ep))
        if pts is None:
            return None
        ms = sorted(pts)
        what = (f"{self.path.name}: {engine} fused MoE {dtype} {routing} routing, {experts} experts top-{topk} ({hidden} x {inter}), "
                f"moe_tp {moe_tp} moe_ep {moe_ep}, tokens")
        return MCurve(ms, [pts[m] for m in ms], what)
