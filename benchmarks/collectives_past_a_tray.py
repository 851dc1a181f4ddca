#!/usr/bin/env python
"""Can a card's collectives on more GPUs than its tables measure be predicted from the counts they do? (a benchmark,
not a test)

    python benchmarks/collectives_past_a_tray.py

GB200 and GB300 tables measure NCCL on the 2 and 4 GPUs of one compute tray, while an NVL72 rack's NVLink domain holds
72. Each table that measures more than 4 GPUs (NCCL's and the engines' own all-reduce, profiles/ops/<card>/) is
predicted there from its 2- and 4-GPU series by four rules, per message size: `ring` (a + b (n - 1) / n, fitted
through 2 and 4), `log2` (linear in log2 n), `linear` (linear in n) and `const` (the 4-GPU time). The table printed is
the median |error| over message sizes per card, table, op and GPU count. Nothing in capsim reads it: it is why the
replay refuses such layouts instead of extrapolating (docs/fidelity.md, "Which table a collective is checked in").
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

OPS = Path(__file__).resolve().parents[1] / "profiles" / "ops"
TABLES = ("nccl", "all_reduce_trtllm", "all_reduce_sglang", "all_reduce_vllm")


def rules(t2: pd.Series, t4: pd.Series, n: int) -> dict[str, pd.Series]:
    """Each rule's prediction of the n-GPU series from the 2- and 4-GPU ones."""
    f = lambda g: (g - 1) / g  # noqa: E731: a ring's share of the message each GPU sends
    b = (t4 - t2) / (f(4) - f(2))
    return {"ring": t2 + b * (f(n) - f(2)), "log2": t4 + (t4 - t2) * (np.log2(n) - 2),
            "linear": t4 + (t4 - t2) * (n - 4) / 2, "const": t4}


def error_table(folder: Path = OPS) -> pd.DataFrame:
    """Per card, table, op and GPU count over 4: the median |error| of each rule over the message sizes."""
    out = []
    for card in sorted(p.name for p in folder.iterdir() if p.is_dir()):
        for stem in TABLES:
            path = folder / card / f"{stem}.csv"
            if not path.exists():
                continue
            t = pd.read_csv(path)
            for op in sorted(t["op"].unique()):
                p = t[t["op"] == op].pivot(index="bytes", columns="gpus", values="latency_us")
                if 2 not in p or 4 not in p:
                    continue
                for n in (g for g in p.columns if g > 4):
                    row = {"card": card, "table": stem, "op": op, "gpus": int(n)}
                    for rule, pred in rules(p[2], p[4], n).items():
                        row[rule] = float(np.median(np.abs((pred / p[n] - 1).dropna())))
                    out.append(row)
    return pd.DataFrame(out)


def main() -> int:
    table = error_table()
    if table.empty:
        print(f"{OPS}: no table measures more than 4 GPUs", file=sys.stderr)
        return 1
    print("median |error| of each rule over message sizes\n")
    print("| card | table | op | GPUs | ring | log2 | linear | const |\n|---|---|---|---:|---:|---:|---:|---:|")
    for r in table.itertuples():
        print(f"| {r.card} | {r.table} | {r.op} | {r.gpus} | {r.ring:.0%} | {r.log2:.0%} | {r.linear:.0%} | {r.const:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
