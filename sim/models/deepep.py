"""SGLang's DeepEP path for wide expert parallelism in the ops model (parallel.ep_communication: all_to_all with
step_time.model.moe_kernels: sglang).

With `--moe-a2a-backend deepep` SGLang runs a MoE layer as DeepEP's dispatch of each rank's tokens to the GPUs of
their experts, the local experts' grouped GEMMs (DeepGEMM, kernel `deepepmoe`), and DeepEP's combine back:
low-latency mode on decode passes, normal mode on passes with a prompt. The card's tables measure both
(benchmarks/aiconfigurator_deepep.py, from the aiconfigurator 0.12.0 wheel):

- moe_deepep_{generation,context}.csv.gz (the fused-MoE tables' schema, sim.models.moe_tables): the experts' step on
  one GPU of moe_ep for a pass's tokens over the expert group, generation on decode passes, context on the others;
- deepep_{ll,normal}.csv.gz: `hidden,topk,experts,tokens,dispatch_us,combine_us`, one node's dispatch and combine
  for `tokens` tokens per rank. A rank sends each token to its top-k experts' GPUs whatever the group's size, so the
  per-rank time is taken at the rank's tokens for any moe_ep (measured on one node; across nodes the NICs are not
  told apart: docs/parallel.md).

A moe_ep between two measured splits takes the experts' time between theirs (geometric in moe_ep at the token counts
both measure; the wheel measures 2, 4, 16, 32, 64, 128 and 256 on prompts, not 8). Where a table lacks the model's
shape, dtype or split, that part keeps the general path (the fused-MoE kernel table; NCCL's all-to-all), and a note
says so once.
"""

from __future__ import annotations

import math
from pathlib import Path

from sim.io.errors import ConfigError
from sim.io.notices import say_once
from sim.models.moe_tables import MoeTable
from sim.models.ops_tables import MCurve, _cached, find_table, read_table

DEEPEP_COLUMNS = ("hidden", "topk", "experts", "tokens", "dispatch_us", "combine_us")
MODES = {True: "ll", False: "normal"}
"""DeepEP's mode by whether the pass is decode-only (SGLang's deepep-mode auto; the recipes set low_latency on decode
workers, normal on prefill workers)."""


class DeepEPTable:
    """Dispatch + combine latency curves over tokens per rank, one per (hidden, topk, experts)."""

    def __init__(self, path: Path):
        t = read_table(path, DEEPEP_COLUMNS)
        self.path = path
        points: dict[tuple[int, int, int], dict[float, float]] = {}
        for i in range(len(t["tokens"])):
            key = tuple(int(t[c][i]) for c in DEEPEP_COLUMNS[:3])
            tokens = t["tokens"][i]
            if tokens < 1:
                raise ConfigError(f"{path}: line {i + 2}, column tokens: expected at least 1, got {tokens:g}")
            points.setdefault(key, {})[tokens] = (t["dispatch_us"][i] + t["combine_us"][i]) * 1e-6
        self._points = points

    def curve(self, hidden: int, topk: int, experts: int) -> MCurve | None:
        """Dispatch + combine over tokens per rank of one shape, or None when not measured."""
        pts = self._points.get((hidden, topk, experts))
        if pts is None:
            return None
        ms = sorted(pts)
        return MCurve(ms, [pts[m] for m in ms], f"{self.path.name}: DeepEP dispatch + combine ({hidden} hidden, "
                                                 f"{experts} experts top-{topk}), tokens per rank")


class DeepEP:
    """A replica's DeepEP path: `routed_s` (None where the experts' table lacks it) and `exchange_s`."""

    def __init__(self, routed: dict[bool, MCurve | None], exchange: dict[bool, MCurve]):
        self.routed, self.exchange = routed, exchange

    @classmethod
    def build(cls, tables, spec, layout, cfg, candidates: list[tuple[str, str]], stream) -> "DeepEP | None":
        """The path for a layout of all-to-all expert parallelism under SGLang's kernels, or None (another layout or
        engine, or the card has no DeepEP table of the model's shape)."""
        moe = spec.profile.moe
        if (moe is None or layout.ep <= 1 or layout.ep_communication != "all_to_all" or cfg.moe_kernels != "sglang"
                or cfg.all_to_all != "auto"):
            return None
        shape = (spec.profile.hidden_size, moe.experts_per_token, moe.num_experts)
        exchange = {}
        for decode, mode in MODES.items():
            path = find_table(tables.folder, f"deepep_{mode}")
            curve = _cached(DeepEPTable, path).curve(*shape) if path is not None else None
            if curve is None:
                say_once((tables.folder, "deepep", shape), f"note: {tables.folder}: no DeepEP {mode} measurement of "
                         f"{spec.profile.name}'s shape; its all-to-all is NCCL's", stream)
                return None
            exchange[decode] = curve
        routed = {}
        for decode, phase in ((True, "generation"), (False, "context")):
            path = find_table(tables.folder, f"moe_deepep_{phase}")
            table = _cached(MoeTable, path) if path is not None else None
            names = [name for engine, name in candidates if engine == "sglang"]
            routed[decode] = None if table is None else next(
                (c for name in names if (c := _experts_curve(table, name, cfg.moe_routing, spec.profile.hidden_size,
                                                             moe, layout)) is not None), None)
            if routed[decode] is None:
                say_once((tables.folder, "deepep moe", phase, spec.profile.name, layout.ep),
                         f"note: {tables.folder}: no DeepEP {phase} MoE kernel for {spec.profile.name}'s experts at "
                         f"moe_ep {layout.ep}; they take the fused-MoE kernel table", stream)
        return cls(routed, exchange)

    def routed_s(self, tokens: float, decode_only: bool, look) -> float | None:
        """The local experts' step for a pass of `tokens` over the expert group (None: not measured)."""
        curve = self.routed[decode_only]
        return None if curve is None else look(curve.at, tokens)

    def exchange_s(self, rank_tokens: float, decode_only: bool, look) -> float:
        """DeepEP's dispatch and combine of one rank's tokens."""
        return look(self.exchange[decode_only].at, max(rank_tokens, 1.0))


def _experts_curve(table: MoeTable, name: str, routing: str, hidden: int, moe, layout) -> MCurve | None:
    """The experts' curve at the layout's moe_ep, or, where that split was not measured, between the nearest measured
    splits on each side: geometric in moe_ep at each token count both measure (a GPU's share of the experts and of
    their work goes as 1 / moe_ep)."""
    def at(ep):
        return table.curve("sglang", name, routing, hidden, moe.expert_intermediate_size, moe.experts_per_token,
                           moe.num_experts, layout.moe_tp, ep)
    exact = at(layout.ep)
    if exact is not None:
        return exact
    eps = sorted({k[8] for k in table.keys() if k[:8] == ("sglang", name, routing, hidden, moe.expert_intermediate_size,
                                                          moe.experts_per_token, moe.num_experts, layout.moe_tp)})
    lo = max((e for e in eps if e < layout.ep), default=None)
    hi = min((e for e in eps if e > layout.ep), default=None)
    if lo is None or hi is None:
        return None
    a, b = at(lo), at(hi)
    ms = sorted(set(a.ms) & set(b.ms))
    if not ms:
        return None
    w = math.log(layout.ep / lo) / math.log(hi / lo)
    ts = [a.at(m) ** (1 - w) * b.at(m) ** w for m in ms]
    return MCurve(ms, ts, f"{table.path.name}: sglang DeepEP MoE {name} {routing}, {moe.num_experts} experts "
                          f"top-{moe.experts_per_token}, moe_ep {layout.ep} between {lo} and {hi}, tokens")
