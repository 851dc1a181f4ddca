"""Regenerate profiles/ops/<card>/nccl_parallel.csv: the collectives expert and pipeline parallelism
need beside the all-reduce / all-gather of nccl.csv (read by sim.models.parallel_ops).

- alltoall: AIConfigurator's nccl-tests all-to-all of FP16 messages on 2, 4 and 8 GPUs of one node, per
  card (../shared/data/profiling/aiconfigurator/nccl.csv, `message_size_bytes` = each rank's buffer);
- send_recv: Vidur's point-to-point send/recv between two GPUs of one H100 DGX node (NVLink,
  ../shared/data/profiling/vidur/network/h100_dgx/send_recv.csv, devices_per_node 2, median of the
  repeats per size in bytes). Only H100 was measured: every card's file carries the H100 numbers, a
  stated approximation (pipeline stages hand over one activation tensor per micro-batch, a small term).

B300, GB200 and GB300 are not in the shared snapshot: their nccl.csv rows come from the folder
benchmarks/aiconfigurator_cards.py writes (`--more`, the same database as shipped in the aiconfigurator wheel).

    python benchmarks/parallel_collectives.py [--shared ../shared/data/profiling] [--more /tmp/aic_more]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

CARDS = {"h100-sxm": "h100_sxm", "h200-sxm": "h200_sxm", "b200": "b200_sxm", "a100-80g-sxm": "a100_sxm",
         "l40s": "l40s", "rtx-pro-6000-server": "rtx_pro_6000_server", "b300": "b300_sxm", "gb200": "gb200",
         "gb300": "gb300"}


def main() -> None:
    """Write one nccl_parallel.csv per card folder."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared/data/profiling"))
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "profiles/ops"))
    ap.add_argument("--more", help="benchmarks/aiconfigurator_cards.py's output folder (B300, GB200, GB300)")
    args = ap.parse_args()
    shared = Path(args.shared)
    nccl = pd.read_csv(shared / "aiconfigurator/nccl.csv")
    if args.more:
        nccl = pd.concat([nccl, pd.read_csv(Path(args.more) / "nccl.csv")], ignore_index=True)
    sr = pd.read_csv(shared / "vidur/network/h100_dgx/send_recv.csv")
    sr = sr[sr["devices_per_node"] == 2].groupby("size")["time_stats.send_recv.median"].median()
    # ~1,000 linearly spaced sizes: keep the one nearest each half-octave (log-space interpolation)
    import numpy as np
    targets = 2048 * 2 ** (np.arange(0, 31) / 2)
    keep = sorted({int(sr.index[np.abs(np.log(sr.index / t)).argmin()]) for t in targets})
    sr = sr.loc[keep]
    sr_rows = pd.DataFrame({"op": "send_recv", "gpus": 2, "bytes": sr.index.astype(int),
                            "latency_us": (sr.to_numpy() * 1e3)})
    for folder, gpu in CARDS.items():
        a = nccl[(nccl.gpu == gpu) & (nccl.op_name == "alltoall") & (nccl.nccl_dtype == "half")]
        if a.empty:
            print(folder, "no all-to-all rows (B300 / GB200 / GB300 need --more); skipped")
            continue
        a = a.groupby(["num_gpus", "message_size_bytes"], as_index=False)["latency_ms"].mean()
        rows = pd.DataFrame({"op": "alltoall", "gpus": a["num_gpus"], "bytes": a["message_size_bytes"],
                             "latency_us": a["latency_ms"] * 1e3})
        out = pd.concat([rows, sr_rows], ignore_index=True)
        out["latency_us"] = out["latency_us"].map(lambda v: float(f"{v:.4g}"))
        out.to_csv(Path(args.out) / folder / "nccl_parallel.csv", index=False)
        print(folder, len(out), "rows")


if __name__ == "__main__":
    main()
