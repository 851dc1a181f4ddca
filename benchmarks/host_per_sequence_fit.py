"""Fit vLLM's host time per sequence on the rows of versions that schedule synchronously, report it held out.

    python benchmarks/host_per_sequence_fit.py ../shared/data/benchmarks/aiconfigurator_silicon_sample.csv \
        [--grid-us 0,20,30,40,50,60,70,80] [--workers 2] [--json OUT.json]

Why: on the silicon sample's vLLM 0.12.0 rows (Qwen3-32B on H100, TP 2 / 4 / 8) the replay's TPOT falls short of the
measured one by a margin that grows with the users and hardly depends on TP, ISL or OSL (about 50-70 us per user at
ISL 1,024, OSL >= 512), while the rows of 0.17-0.19 on B200 and H100 show no such trend. Before 0.14 vLLM scheduled
synchronously: each step's inputs are built and its outputs handled while the GPU waits, so per-request CPU work adds
to every step; from 0.14 async scheduling hides it (sim.published.engines.EngineDefaults.async_since). The ops model
states that cost as `step_time.model.host_per_sequence_s`.

What it does: replays every vLLM agg row of the cards that have rows of such versions (`capsim validate-published
--host-per-sequence-ms X` for X on the grid), keeps the rows whose version is before `async_since`, picks the value
with the least median |TPOT error| on their even lines (TPOT is the observable a per-step cost moves first) and prints
TTFT and TPOT on the even lines, the odd lines and all of them for every value; the chosen value goes into
EngineDefaults.sync_host_per_sequence_s by hand. Nothing else is fitted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.published.engines import ENGINES, release_number  # noqa: E402
from sim.published.report import validate_published  # noqa: E402
from sim.published.rows import read_published  # noqa: E402


def synchronous(version: str, since: str) -> bool:
    """Whether a row of `version` ran before the engine's async scheduling default."""
    release = release_number(version)
    return release is not None and release < release_number(since)


def medians(records: list[dict]) -> dict:
    """Median |error| of TTFT and TPOT over the predicted records, and how many there are."""
    done = [r for r in records if "error" in r]
    out = {"n": len(done)}
    for m in ("ttft_ms", "tpot_ms"):
        out[m] = float(np.median([abs(r["error"][m]) for r in done])) if done else None
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--grid-us", default="0,20,30,40,50,60,70,80",
                    help="values to try, microseconds per sequence (default 0,20,...,80)")
    ap.add_argument("--workers", type=int, default=None, help="Dask workers (default: one per core)")
    ap.add_argument("--json", type=Path, default=None, help="write every value's per-row errors here")
    args = ap.parse_args(argv)
    since = ENGINES["vllm"].async_since
    rows = [r for r in read_published(args.file) if r.backend == "vllm" and r.mode == "agg"]
    sync = {r.line for r in rows if synchronous(r.backend_version, since)}
    systems = sorted({r.system for r in rows if r.line in sync})
    if not sync:
        raise SystemExit(f"host_per_sequence_fit: no vLLM agg row of {args.file} is of a version before {since}")
    print(f"{len(sync)} vLLM agg rows before {since} on {', '.join(systems)}", file=sys.stderr)
    grid = [float(x) for x in args.grid_us.split(",") if x.strip()]
    results = {}
    for us in grid:
        recs = []
        for system in systems:
            report = validate_published(args.file, "vllm", system, "agg", workers=args.workers,
                                        host_per_sequence_s=us * 1e-6)
            recs += [r for r in report["rows"] if r["line"] in sync]
        results[us] = {"even": medians([r for r in recs if r["line"] % 2 == 0]),
                       "odd": medians([r for r in recs if r["line"] % 2 == 1]), "all": medians(recs),
                       "rows": [[r["line"], *(round(r["error"][m], 6) if "error" in r else None
                                              for m in ("ttft_ms", "tpot_ms"))] for r in recs]}
        print(f"  {us:g} us: even TPOT {results[us]['even']['tpot_ms']:.1%}", file=sys.stderr)
    best = min(grid, key=lambda us: results[us]["even"]["tpot_ms"])
    print(f"| us per sequence | even TPOT | even TTFT | odd TPOT | odd TTFT | all TPOT | all TTFT |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for us in grid:
        r = results[us]
        mark = " (chosen)" if us == best else ""
        print(f"| {us:g}{mark} | {r['even']['tpot_ms']:.1%} | {r['even']['ttft_ms']:.1%} | {r['odd']['tpot_ms']:.1%} "
              f"| {r['odd']['ttft_ms']:.1%} | {r['all']['tpot_ms']:.1%} | {r['all']['ttft_ms']:.1%} |")
    print(f"\nrows: {results[best]['even']['n']} even, {results[best]['odd']['n']} odd predicted "
          f"({len(sync)} before {since}, the others skipped)")
    if args.json:
        # rows: [line, signed TTFT error, signed TPOT error] (None where the row is skipped)
        args.json.write_text(json.dumps({"file": str(args.file), "async_since": since, "chosen_us": best,
                                         "results": {f"{k:g}": v for k, v in results.items()}}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
