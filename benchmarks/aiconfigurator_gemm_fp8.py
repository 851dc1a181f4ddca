"""Per-tensor FP8 GEMM timings of the cards ../shared/data/profiling/aiconfigurator/gemm_fp8.csv leaves out,
from the same database as shipped in the aiconfigurator 0.12.0 wheel.

The shared snapshot (../shared/data/SOURCES.md section 2.1) kept FP8 GEMMs of H100 and RTX PRO 6000 Server
only, for size; the wheel carries the same tables (`aiconfigurator_core/systems/data/<gpu>/gemm/vllm/0.24.0/
gemm_perf.parquet`, Apache-2.0) for B200 and H200 too. This script writes their per-tensor FP8 rows
(`gemm_dtype` fp8, kernel CutlassFP8ScaledMMLinearKernel) in the snapshot's schema, `gpu,m,n,k,latency_ms`,
after checking that the wheel's H100 rows are the snapshot's (every (m, n, k) present, latencies within
1e-4 relative), so both come from one database. Run it with the wheel's interpreter (pandas + pyarrow):

    /work/venvs/aic/bin/python benchmarks/aiconfigurator_gemm_fp8.py --out /tmp/gemm_fp8_more.csv
    capsim profile import-ops ../shared/data/profiling/aiconfigurator --gemm-fp8-more /tmp/gemm_fp8_more.csv \
        --out profiles/ops --cards b200,h200-sxm
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from aiconfigurator_cards import same_rows  # noqa: E402  (the same check for every table taken from the wheel)

GPUS = ("b200_sxm", "h200_sxm")
VERSION = "0.24.0"   # the vLLM kernel set the snapshot's H100 / B200 / H200 tables were measured with


def _fp8(data: Path, gpu: str) -> pd.DataFrame:
    path = data / gpu / "gemm" / "vllm" / VERSION / "gemm_perf.parquet"
    if not path.exists():
        raise SystemExit(f"{path}: not found (is this the aiconfigurator 0.12.0 wheel's data folder?)")
    d = pd.read_parquet(path)
    d = d[(d.gemm_dtype == "fp8") & (d.kernel_source == "CutlassFP8ScaledMMLinearKernel")]
    if d.empty:
        raise SystemExit(f"{path}: no per-tensor FP8 rows")
    return pd.DataFrame({"gpu": gpu, "m": d.m.astype(int), "n": d.n.astype(int), "k": d.k.astype(int),
                         "latency_ms": d.latency.astype(float)})


def check_same_database(data: Path, snapshot: Path) -> int:
    """The wheel's H100 FP8 rows against the snapshot's; the number of rows compared."""
    ours = pd.read_csv(snapshot)
    ours = ours[ours.gpu == "h100_sxm"]
    return same_rows(ours, _fp8(data, "h100_sxm"), ["m", "n", "k"], "H100 FP8 GEMM")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", help="the wheel's systems/data folder (default: found from the installed package)")
    ap.add_argument("--snapshot", default=str(Path(__file__).resolve().parent.parent.parent / "shared" / "data" /
                                              "profiling" / "aiconfigurator" / "gemm_fp8.csv"))
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.data:
        data = Path(args.data)
    else:
        import aiconfigurator_core
        data = Path(aiconfigurator_core.__file__).parent / "systems" / "data"
    n = check_same_database(data, Path(args.snapshot))
    print(f"H100: the wheel's {n} per-tensor FP8 GEMM rows are the snapshot's", file=sys.stderr)
    rows = pd.concat([_fp8(data, g) for g in GPUS]).sort_values(["gpu", "n", "k", "m"])
    rows.to_csv(args.out, index=False)
    print(f"{args.out}: {len(rows)} rows ({', '.join(f'{g} {int((rows.gpu == g).sum())}' for g in GPUS)})",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
