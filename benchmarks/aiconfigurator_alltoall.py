"""TensorRT-LLM's NVLink all-to-all for wide expert parallelism, from the database in the aiconfigurator 0.12.0 wheel,
written as profiles/ops/<card>/alltoall_trtllm.csv.gz.

With attention data parallelism and expert parallelism (moe_tp 1) TensorRT-LLM's MoE modules move each rank's tokens
to their experts' GPUs and back with its own NVLink kernels rather than gathering every rank's tokens: NVLinkOneSided
by default for the CUTLASS and TRTLLM-gen backends, NVLinkTwoSided where a recipe forces it (the FP8 DeepGEMM decode
workers of the GB200 / GB300 recipes, `TRTLLM_FORCE_COMM_METHOD=NVLINK_TWO_SIDED`; docs/parallel.md). The wheel
measures both (Apache-2.0, measured by NVIDIA) in `comm/trtllm/<version>/trtllm_alltoall_perf.parquet`: dispatch and
combine (and the two-sided kernel's prepare step) of `num_tokens` tokens per rank over moe_ep GPUs, DeepSeek's shape
(7,168 hidden, top-8 of 256 experts), the dispatched activations in BF16, FP8 or NVFP4. Written as
`method,dtype,hidden,topk,experts,moe_ep,tokens,prepare_us,dispatch_us,combine_us` (method `one_sided` or `two_sided`;
combine in BF16, as measured; prepare 0 for the one-sided kernel, which has none). The low-precision combine some
recipes turn on is measured for the two-sided kernel only and is not taken.

Only GB200 has the table in 0.12.0; other cards keep NCCL's all-to-all (sim.models.nvlink_alltoall).

    /work/venvs/aic/bin/python benchmarks/aiconfigurator_alltoall.py --out profiles/ops
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from aiconfigurator_moe import REPO, _version_key, card_folders, moe_shapes, wheel_args, wheel_note, write_tables  # noqa: E402

METHODS = {"NVLinkOneSided": "one_sided", "NVLinkTwoSided": "two_sided"}
DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "nvfp4": "nvfp4"}
STEPS = {"alltoall_prepare": "prepare_us", "alltoall_dispatch": "dispatch_us", "alltoall_combine": "combine_us"}
COLUMNS = ["method", "dtype", "hidden", "topk", "experts", "moe_ep", "tokens", "prepare_us", "dispatch_us", "combine_us"]
NOTE = " TensorRT-LLM's NVLink all-to-all (alltoall_trtllm.csv.gz):"


def _sig(v: float) -> float:
    return float(f"{v:.4g}")


def alltoall_rows(path: Path, shapes) -> pd.DataFrame:
    """The NVLink all-to-all parquet's rows of `shapes`' (hidden, topk, experts), one row per point, in microseconds
    (the mean where a point was measured more than once)."""
    d = pd.read_parquet(path)
    keep = {(h, k, e) for h, _, k, e in shapes}
    d = d[d.kernel_source.isin(METHODS) & d.moe_dtype.isin(DTYPES) & d.op_name.isin(STEPS)]
    d = d[[k in keep for k in zip(d.hidden_size, d.topk, d.num_experts)]]
    key = ["kernel_source", "moe_dtype", "hidden_size", "topk", "num_experts", "moe_ep_size", "num_tokens"]
    wide = d.pivot_table(index=key, columns="op_name", values="latency", aggfunc="mean").reset_index()
    wide = wide.dropna(subset=["alltoall_dispatch", "alltoall_combine"])
    prepare = wide["alltoall_prepare"].fillna(0.0) if "alltoall_prepare" in wide else 0.0 * wide.alltoall_dispatch
    out = pd.DataFrame({"method": wide.kernel_source.map(METHODS), "dtype": wide.moe_dtype.map(DTYPES),
                        "hidden": wide.hidden_size.astype(int), "topk": wide.topk.astype(int),
                        "experts": wide.num_experts.astype(int), "moe_ep": wide.moe_ep_size.astype(int),
                        "tokens": wide.num_tokens.astype(int),
                        "prepare_us": [_sig(v * 1000) for v in prepare],
                        "dispatch_us": [_sig(v * 1000) for v in wide.alltoall_dispatch],
                        "combine_us": [_sig(v * 1000) for v in wide.alltoall_combine]})
    return out[COLUMNS].sort_values(COLUMNS[:7]).reset_index(drop=True)


def main(argv=None) -> int:
    from aiconfigurator_moe import CARDS
    args, data = wheel_args(__doc__.split("\n")[0], "profiles/ops: writes <card>/alltoall_trtllm.csv.gz and notes "
                                                    "the source", argv)
    shapes = set(moe_shapes(REPO / "profiles" / "models"))
    for card, folder in card_folders(args):
        best = (None, None)
        paths = (data / CARDS[card] / "comm" / "trtllm").glob("*/trtllm_alltoall_perf.parquet")
        for path in sorted(paths, key=lambda p: _version_key(p.parent.name)):
            rows = alltoall_rows(path, shapes)
            if len(rows):
                best = (rows, path.parent.name)
        if best[0] is None:
            print(f"{card}: no NVLink all-to-all measurements of the shipped shapes", file=sys.stderr)
            continue
        rows, version = best
        write_tables(folder, {"alltoall_trtllm": rows})
        note = f"alltoall_trtllm from trtllm {version} ({len(rows)} rows)"
        wheel_note(folder, NOTE, CARDS[card], "TensorRT-LLM's NVLinkOneSided and NVLinkTwoSided dispatch / combine",
                   "comm/trtllm", "trtllm_alltoall_perf", [note], "aiconfigurator_alltoall.py")
        print(f"{card}: {note}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
