#!/usr/bin/env python
"""Whether a disaggregated deployment keeps the first wave's cohort (a benchmark, not a test;
docs/disaggregation.md, "SGLang's cohort after the first wave").

    SAMPLE=../shared/data/benchmarks/aiconfigurator_silicon_sample.csv
    capsim validate-published $SAMPLE --mode disagg --out vp
    python benchmarks/disagg_cohort.py regimes vp/report.json     # the replay's two parts combined both ways
    python benchmarks/disagg_cohort.py waves 277 276              # the simulator's own ten waves, per wave

`regimes` recombines each replayed row's two simulated parts (`components`: the cold first wave and the steady
state) under both rules a cold benchmark of N = 10 waves may follow: `cohort` (every wave repeats the first, the
replay's rule for SGLang) and `spread` (the later waves are the steady state, its rule for vLLM and TensorRT-LLM),
the engine's front end added as the replay adds it; it prints the median |TTFT error| with each engine under each
rule, on the even lines, the odd lines and all rows. `waves` runs rows of the sample as the simulator's own closed
loop (every user's first request at once, ten requests per user, no recombination) and prints each wave's mean TTFT
and TPOT. Nothing is fitted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SAMPLE = HERE.parent.parent / "shared" / "data" / "benchmarks" / "aiconfigurator_silicon_sample.csv"


def _combined(row: dict, regime: str, rounds: int) -> float:
    first, steady = row["components"]["first_wave"]["ttft_ms"], row["components"]["steady"]["ttft_ms"]
    base = first if regime == "cohort" else (first + (rounds - 1) * steady) / rounds
    return base + row.get("frontend_ms", 0.0)


def regimes(report: str) -> None:
    data = json.loads(Path(report).read_text())
    rounds = int(data.get("rounds", 10))
    rows = [r for r in data["rows"] if "predicted" in r and r["mode"] == "disagg" and "components" in r]
    if not rows:
        raise SystemExit(f"{report}: no replayed disaggregated row with its two parts (run with --start cold)")
    engines = sorted({r["backend"] for r in rows})
    print(f"{report}: {len(rows)} disaggregated rows, N = {rounds}; median |TTFT error| (signed median)")
    groups = [("even lines", lambda r: r["line"] % 2 == 0), ("odd lines", lambda r: r["line"] % 2 == 1),
              ("all", lambda r: True)]
    for e in engines:
        groups += [(e, lambda r, e=e: r["backend"] == e),
                   (f"{e} even", lambda r, e=e: r["backend"] == e and r["line"] % 2 == 0),
                   (f"{e} odd", lambda r, e=e: r["backend"] == e and r["line"] % 2 == 1)]
    print(f"{'group':12s} {'rows':>5s}  {'cohort':>16s}  {'spread':>16s}")
    for name, keep in groups:
        sel = [r for r in rows if keep(r)]
        cells = []
        for regime in ("cohort", "spread"):
            err = np.array([_combined(r, regime, rounds) / r["measured"]["ttft_ms"] - 1 for r in sel])
            cells.append(f"{np.median(np.abs(err)) * 100:6.1f}% ({np.median(err) * 100:+6.1f}%)")
        print(f"{name:12s} {len(sel):5d}  {cells[0]:>16s}  {cells[1]:>16s}")


def waves(lines: list[int], sample: Path, per_user: int) -> None:
    from sim.published.predict import _run, build_case
    from sim.published.rows import read_published
    rows = {r.line: r for r in read_published(sample)}
    for line in lines:
        if line not in rows:
            raise SystemExit(f"{sample}: no row on line {line}")
        row = rows[line]
        case = build_case(row, per_user=per_user, start="burst")
        if case.scenario is None:
            print(f"line {line}: skipped: {case.skipped}")
            continue
        req = _run(case.scenario, f"line {line}").requests.sort_values("id")
        wave = req["id"] // row.concurrency
        means = req.groupby(wave)[["ttft_s", "tpot_s"]].mean() * 1e3
        print(f"line {line} ({row.backend}, {row.system}, {row.isl} / {row.osl}, {row.concurrency} users): "
              f"measured TTFT {row.ttft_ms:.1f} ms, TPOT {row.tpot_ms:.2f} ms; simulated mean TTFT "
              f"{req['ttft_s'].mean() * 1e3:.1f} ms + front end {case.frontend_s * 1e3:.1f} ms")
        print("  wave  " + " ".join(f"{int(w):>8d}" for w in means.index))
        print("  TTFT  " + " ".join(f"{v:8.1f}" for v in means["ttft_s"]))
        print("  TPOT  " + " ".join(f"{v:8.2f}" for v in means["tpot_s"]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("regimes", help="recombine a disaggregated replay's two parts under both rules")
    r.add_argument("report", help="report.json of capsim validate-published --mode disagg")
    w = sub.add_parser("waves", help="run rows as the simulator's own closed loop and print each wave")
    w.add_argument("lines", nargs="+", type=int, help="line numbers of the sample (as report.json names them)")
    w.add_argument("--sample", type=Path, default=SAMPLE)
    w.add_argument("--requests-per-user", type=int, default=10)
    args = ap.parse_args()
    if args.what == "regimes":
        regimes(args.report)
    else:
        waves(args.lines, args.sample, args.requests_per_user)
    return 0


if __name__ == "__main__":
    sys.exit(main())
