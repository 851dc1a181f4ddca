"""TensorRT-LLM's NVLink all-to-all for wide expert parallelism in the ops model (parallel.ep_communication: all_to_all
with step_time.model.all_to_all: nvlink_one_sided or nvlink_two_sided).

With attention data parallelism and the experts spread over the ranks' GPUs (moe_tp 1), TensorRT-LLM's MoE modules
dispatch each rank's tokens to their experts' GPUs and combine the outputs back with their own NVLink kernels:
NVLinkOneSided by default (the CUTLASS and TRTLLM-gen backends), NVLinkTwoSided where a deployment forces it
(`TRTLLM_FORCE_COMM_METHOD=NVLINK_TWO_SIDED`, the FP8 DeepGEMM decode workers of the GB200 / GB300 recipes). The card's
alltoall_trtllm.csv.gz (benchmarks/aiconfigurator_alltoall.py, from the aiconfigurator 0.12.0 wheel) measures both:
`method,dtype,hidden,topk,experts,moe_ep,tokens,prepare_us,dispatch_us,combine_us`, one MoE layer's exchange for
`tokens` tokens per rank over moe_ep GPUs, the dispatched activations in `dtype` (the experts' format: NVFP4, FP8 or
BF16), the combine in BF16. A layer costs prepare + dispatch + combine at the rank's tokens. The table measures
DeepSeek's 256 experts; a model of the same hidden size and top-k with another expert count (Kimi-K2.5's 384) takes
that measurement, since what a token sends and gets back does not depend on how many experts there are.

Where the table lacks the model's shape, the activations' dtype or the layout's moe_ep (the one-sided kernel was
measured on 2-32 GPUs, the two-sided on 2-64), the exchange keeps NCCL's all-to-all and a note says so once.
"""

from __future__ import annotations

from pathlib import Path

from sim.io.errors import ConfigError
from sim.io.notices import say_once
from sim.models.ops_tables import MCurve, _cached, find_table, read_table

COLUMNS = ("method", "dtype", "hidden", "topk", "experts", "moe_ep", "tokens", "prepare_us", "dispatch_us",
           "combine_us")
TEXT = ("method", "dtype")
METHODS = {"nvlink_one_sided": "one_sided", "nvlink_two_sided": "two_sided"}
"""step_time.model.all_to_all -> the table's method."""
DISPATCH_DTYPE = {"nvfp4": "nvfp4", "fp8": "fp8", "bf16": "bf16"}
"""The experts' GEMM dtype -> the dispatched activations' (TensorRT-LLM quantizes them before the dispatch)."""


class NvlinkAlltoallTable:
    """prepare + dispatch + combine curves over tokens per rank, one per (method, dtype, hidden, topk, experts,
    moe_ep)."""

    def __init__(self, path: Path):
        t = read_table(path, COLUMNS, TEXT)
        self.path = path
        points: dict[tuple, dict[float, float]] = {}
        for i in range(len(t["tokens"])):
            if t["method"][i] not in METHODS.values():
                raise ConfigError(f"{path}: line {i + 2}, column method: expected one of "
                                  f"{', '.join(METHODS.values())}, got {t['method'][i]!r}")
            if t["tokens"][i] < 1:
                raise ConfigError(f"{path}: line {i + 2}, column tokens: expected at least 1, got {t['tokens'][i]:g}")
            key = (t["method"][i], t["dtype"][i]) + tuple(int(t[c][i]) for c in ("hidden", "topk", "experts", "moe_ep"))
            total = t["prepare_us"][i] + t["dispatch_us"][i] + t["combine_us"][i]
            if total <= 0:
                raise ConfigError(f"{path}: line {i + 2}: expected a positive prepare + dispatch + combine time")
            points.setdefault(key, {})[t["tokens"][i]] = total * 1e-6
        self._points = points

    def curve(self, method: str, dtype: str, hidden: int, topk: int, experts: int, moe_ep: int) -> MCurve | None:
        """One layer's exchange over tokens per rank, or None when not measured. A model whose expert count was not
        measured takes the nearest measured count of the same hidden size and top-k: a token's dispatch sends its
        hidden vector to the GPUs of its top-k experts and its combine brings as many back, whatever the number of
        experts those GPUs hold between them."""
        same = [k for k in self._points if k[:4] == (method, dtype, hidden, topk) and k[5] == moe_ep]
        if not same:
            return None
        key = min(same, key=lambda k: (abs(k[4] - experts), k[4]))
        pts = self._points[key]
        ms = sorted(pts)
        return MCurve(ms, [pts[m] for m in ms], f"{self.path.name}: NVLink {method.replace('_', '-')} all-to-all "
                                                 f"({dtype}, {hidden} hidden, {key[4]} experts top-{topk}, moe_ep "
                                                 f"{moe_ep}), tokens per rank")


def nvlink_exchange(tables, spec, layout, cfg, expert_dtype: str, stream) -> MCurve | None:
    """The exchange curve of a layout of all-to-all expert parallelism under TensorRT-LLM's NVLink kernels, or None
    (another method, another layout, or the card's table lacks it: NCCL's all-to-all, with a note)."""
    moe = spec.profile.moe
    method = METHODS.get(cfg.all_to_all)
    if method is None or moe is None or layout.ep <= 1 or layout.ep_communication != "all_to_all":
        return None
    dtype = DISPATCH_DTYPE.get(expert_dtype, "bf16")
    path = find_table(tables.folder, "alltoall_trtllm")
    curve = None if path is None else _cached(NvlinkAlltoallTable, path).curve(
        method, dtype, spec.profile.hidden_size, moe.experts_per_token, moe.num_experts, layout.ep)
    if curve is None:
        what = "no alltoall_trtllm table" if path is None else (
            f"no NVLink {method.replace('_', '-')} all-to-all of {spec.profile.name}'s shape in {dtype} at moe_ep "
            f"{layout.ep}")
        say_once((tables.folder, "nvlink a2a", method, dtype, spec.profile.name, layout.ep),
                 f"note: {tables.folder}: {what}; the experts' all-to-all is NCCL's", stream)
    return curve
