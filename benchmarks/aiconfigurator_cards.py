"""Kernel tables of the cards ../shared/data/profiling/aiconfigurator leaves out (B300, GB200, GB300), from the
same database as shipped in the aiconfigurator 0.12.0 wheel, in the snapshot's CSV schema.

The shared snapshot (../shared/data/SOURCES.md section 2.1) converted the vLLM 0.24.0 GEMM and attention tables
and the NCCL 2.29.2 tables of six GPUs and names the others "available at the same commit". The wheel ships
them (`aiconfigurator_core/systems/data/<gpu>/...`, Apache-2.0). This script converts them exactly as the
snapshot describes its conversion, and first converts B200 the same way and checks the result against the
snapshot's B200 rows, table by table (every key present, latencies within 1e-4 relative), so the new cards
come from the same database through the same cuts. Run it with the wheel's interpreter (pandas + pyarrow):

    /work/venvs/aic/bin/python benchmarks/aiconfigurator_cards.py --out /tmp/aic_more
    capsim profile import-ops ../shared/data/profiling/aiconfigurator --more /tmp/aic_more \
        --out profiles/ops --cards b300,gb200,gb300

Writes gemm_bf16.csv, gemm_fp8.csv, context_attention_bf16.csv, generation_attention_bf16.csv and nccl.csv
under --out, each with the snapshot's columns; and gemm_nvfp4.csv, the NVFP4 GEMMs (vLLM 0.24.0's
FlashInferCuteDslNvFp4LinearKernel: 4-bit values with an FP8 scale per 16, activations quantised too) of every
Blackwell GPU that has them, B200 included: the snapshot cut NVFP4 for size.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

GPUS = ("b300_sxm", "gb200", "gb300")
CHECK = "b200_sxm"      # converted too, and compared with the snapshot's rows
NVFP4 = ("b200_sxm", "b300_sxm", "gb200", "gb300")   # the GPUs with NVFP4 GEMM rows for gemm_nvfp4.csv
VLLM = "0.24.0"         # the kernel set of the snapshot's Hopper / Blackwell tables
NCCL = "2.29.2"
HEAD_DIMS = (64, 128)   # the snapshot's attention cut
KEYS = {
    "gemm_bf16.csv": ["m", "n", "k"],
    "gemm_fp8.csv": ["m", "n", "k"],
    "context_attention_bf16.csv": ["kernel_source", "batch_size", "seq_len", "num_heads", "num_key_value_heads",
                                   "head_dim"],
    "generation_attention_bf16.csv": ["kernel_source", "batch_size", "kv_len", "num_heads", "num_key_value_heads",
                                      "head_dim"],
    "nccl.csv": ["op_name", "nccl_dtype", "num_gpus", "message_size_elements"],
}


def _read(path: Path) -> pd.DataFrame:
    if not path.exists():
        raise SystemExit(f"{path}: not found (is this the aiconfigurator 0.12.0 wheel's data folder?)")
    return pd.read_parquet(path)


def _gemm(data: Path, gpu: str, dtype: str, kernel: str) -> pd.DataFrame:
    d = _read(data / gpu / "gemm" / "vllm" / VLLM / "gemm_perf.parquet")
    d = d[(d.gemm_dtype == dtype) & (d.kernel_source == kernel)]
    return pd.DataFrame({"gpu": gpu, "m": d.m.astype(int), "n": d.n.astype(int), "k": d.k.astype(int),
                         "latency_ms": d.latency.astype(float)})


def _attention(data: Path, gpu: str, phase: str, head_dims: tuple[int, ...] = HEAD_DIMS,
               version: str = VLLM) -> pd.DataFrame:
    d = _read(data / gpu / "attention" / "vllm" / version / f"{phase}_attention_perf.parquet")
    no_window = (d.window_size == 0) if "window_size" in d else True   # (vLLM 0.14.0's tables have no windows)
    d = d[(d.kv_cache_dtype == "bfloat16") & (d.attn_dtype == "bfloat16") & no_window
          & d.head_dim.isin(head_dims) & (d.beam_width == 1)]
    length = ("seq_len", d.isl) if phase == "context" else ("kv_len", d.step)
    return pd.DataFrame({"gpu": gpu, "kernel_source": d.kernel_source, "batch_size": d.batch_size.astype(int),
                         length[0]: length[1].astype(int), "num_heads": d.num_heads.astype(int),
                         "num_key_value_heads": d.num_key_value_heads.astype(int), "head_dim": d.head_dim.astype(int),
                         "latency_ms": d.latency.astype(float)})


def _nccl(data: Path, gpu: str) -> pd.DataFrame:
    d = _read(data / gpu / "comm" / "nccl" / NCCL / "nccl_perf.parquet")
    size = d.message_size.astype(int)
    return pd.DataFrame({"gpu": gpu, "op_name": d.op_name, "nccl_dtype": d.nccl_dtype, "num_gpus": d.num_gpus.astype(int),
                         "message_size_elements": size, "message_size_bytes": size * d.nccl_dtype.map({"half": 2, "int8": 1}),
                         "latency_ms": d.latency.astype(float)})


def tables(data: Path, gpu: str) -> dict[str, pd.DataFrame]:
    """One GPU's five tables in the snapshot's schema."""
    return {
        "gemm_bf16.csv": _gemm(data, gpu, "bfloat16", "torch.nn.functional.linear"),
        "gemm_fp8.csv": _gemm(data, gpu, "fp8", "CutlassFP8ScaledMMLinearKernel"),
        "context_attention_bf16.csv": _attention(data, gpu, "context"),
        "generation_attention_bf16.csv": _attention(data, gpu, "generation"),
        "nccl.csv": _nccl(data, gpu),
    }


def check_same_conversion(mine: dict[str, pd.DataFrame], snapshot: Path, gpu: str) -> dict[str, int]:
    """`gpu`'s converted tables against the snapshot's rows for it; rows compared per table. The snapshot has
    no FP8 GEMMs of B200 (benchmarks/aiconfigurator_gemm_fp8.py checked those against H100's)."""
    compared = {}
    for name, keys in KEYS.items():
        ours = pd.read_csv(snapshot / name)
        ours = ours[ours.gpu == gpu]
        if ours.empty:
            continue
        compared[name] = same_rows(ours, mine[name], keys, f"{name} {gpu}")
    return compared


def same_rows(snapshot: pd.DataFrame, wheel: pd.DataFrame, keys: list[str], what: str, tol: float = 1e-4,
              col: str = "latency_ms") -> int:
    """The keys compared, after checking that `wheel` has exactly `snapshot`'s keys (repeats averaged) with
    `col` within `tol` relative; exits naming `what` otherwise."""
    a = snapshot.groupby(keys, as_index=False)[col].mean()
    b = wheel.groupby(keys, as_index=False)[col].mean()
    both = a.merge(b, on=keys, suffixes=("", "_wheel"))
    if len(both) != len(a) or len(b) != len(a):
        raise SystemExit(f"{what}: snapshot {len(a)} keys, the wheel's {len(b)}, {len(both)} in both: "
                         "not the same database and conversion")
    worst = float(((both[col + "_wheel"] - both[col]) / both[col]).abs().max())
    if worst > tol:
        raise SystemExit(f"{what}: latencies differ by up to {worst:.2e} relative: not the same database")
    return len(both)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", help="the wheel's systems/data folder (default: found from the installed package)")
    ap.add_argument("--snapshot", default=str(Path(__file__).resolve().parent.parent.parent / "shared" / "data" /
                                              "profiling" / "aiconfigurator"))
    ap.add_argument("--gpus", default=",".join(GPUS), help="aiconfigurator gpu ids to convert")
    ap.add_argument("--out", required=True, help="folder for the five CSVs")
    args = ap.parse_args(argv)
    if args.data:
        data = Path(args.data)
    else:
        import aiconfigurator_core
        data = Path(aiconfigurator_core.__file__).parent / "systems" / "data"
    compared = check_same_conversion(tables(data, CHECK), Path(args.snapshot), CHECK)
    print(f"{CHECK}: this conversion equals the snapshot's: "
          + ", ".join(f"{n} {k} keys" for n, k in compared.items()), file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    per_gpu = [tables(data, g) for g in args.gpus.split(",")]
    for name in KEYS:
        frame = pd.concat([t[name] for t in per_gpu], ignore_index=True)
        frame.to_csv(out / name, index=False)
        print(f"{out / name}: {len(frame)} rows ({', '.join(args.gpus.split(','))})", file=sys.stderr)
    fp4 = pd.concat([_gemm(data, g, "nvfp4", "FlashInferCuteDslNvFp4LinearKernel") for g in NVFP4], ignore_index=True)
    fp4.to_csv(out / "gemm_nvfp4.csv", index=False)
    print(f"{out / 'gemm_nvfp4.csv'}: {len(fp4)} rows ({', '.join(NVFP4)})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
