#!/usr/bin/env python
"""What a disaggregated row's stated batch sizes are: the engine's limit, or the concurrency divided? (a benchmark,
not a test)

    python benchmarks/disagg_stated_batch.py ../shared/data/benchmarks/aiconfigurator_silicon_sample.csv [REPORT]

A disaggregated row states `prefill_batch_size` and `decode_batch_size` beside each pool's workers and attention-DP
ranks. `capsim validate-published --pool-batch stated` reads them as each rank's launch limit (its engine's
max-running-requests, max-num-seqs or max_batch_size). This script counts, per engine, the rows where
`decode_batch_size x decode_num_workers x decode_attention_dp_size` equals the row's client concurrency (every
decode slot filled by one user, exactly), where it is above (slots to spare) and where below, and how the stated
prefill batch is spread. With REPORT (a validate-published report.json), only the rows it replayed are counted.
The recipes the rows ran (srt-slurm, docs/disaggregation.md "The stated batch is the concurrency, divided") set
their engines' limits apart from the sweep's concurrencies; a column that equals the concurrency on every row is a
description of the sweep, not of the engine.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim.published.rows import read_published  # noqa: E402


def decode_slots(row) -> int | None:
    """Decode slots the row states: decode_batch_size x workers x attention-DP ranks (None where one is not stated)."""
    d = row.decode
    if d is None or not d.batch or not d.workers:
        return None
    return int(d.batch * d.workers * d.attention_dp)


def tally(rows) -> dict[str, Counter]:
    """Per engine: rows whose stated decode slots equal the concurrency, exceed it, fall short, or are not stated;
    and the stated prefill batch sizes."""
    out: dict[str, Counter] = {}
    for r in rows:
        c = out.setdefault(r.backend, Counter())
        slots = decode_slots(r)
        if slots is None:
            c["decode not stated"] += 1
        else:
            c["slots = concurrency" if slots == r.concurrency else
              "slots > concurrency" if slots > r.concurrency else "slots < concurrency"] += 1
        c[f"prefill_batch_size {r.prefill.batch if r.prefill else None}"] += 1
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", type=Path, help="CSV in the schema of aiconfigurator's silicon_sample.csv")
    ap.add_argument("report", type=Path, nargs="?", help="a validate-published report.json: only its replayed rows")
    args = ap.parse_args(argv)
    rows = [r for r in read_published(args.csv) if r.mode == "disagg"]
    if args.report is not None:
        replayed = {x["line"] for x in json.loads(args.report.read_text())["rows"] if x.get("predicted")}
        rows = [r for r in rows if r.line in replayed]
    print(f"{len(rows)} disaggregated rows" + (f" replayed in {args.report}" if args.report else ""))
    for backend, c in sorted(tally(rows).items()):
        print(f"  {backend}: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
