#!/usr/bin/env python
"""Whether a disaggregated deployment keeps the first wave's cohort (a benchmark, not a test;
docs/disaggregation.md, "SGLang's cohort after the first wave").

    SAMPLE=../shared/data/benchmarks/aiconfigurator_silicon_sample.csv
    capsim validate-published $SAMPLE --mode disagg --out vp
    python benchmarks/disagg_cohort.py regimes vp/report.json     # the replay's two parts combined both ways
    python benchmarks/disagg_cohort.py waves 277 276              # the simulator's own ten waves, per wave
    python benchmarks/disagg_cohort.py lengths vp/report.json     # the benchmark's length: the candidates, chosen

`regimes` recombines each replayed row's two simulated parts (`components`: the cold first wave and the steady
state) under both rules a cold benchmark of N = 10 waves may follow: `cohort` (every wave repeats the first, the
replay's rule for SGLang) and `spread` (the later waves are the steady state, its rule for vLLM and TensorRT-LLM),
the engine's front end added as the replay adds it; it prints the median |TTFT error| with each engine under each
rule, on the even lines, the odd lines and all rows. `waves` runs rows of the sample as the simulator's own closed
loop (every user's first request at once, ten requests per user, no recombination) and prints each wave's mean TTFT
and TPOT. `lengths` recombines the same parts under each candidate benchmark a disaggregated row may have been
measured with (sim.published.predict.DISAGG_ROUNDS: N = 10 as on agg rows, Dynamo's benchmark utility, AIConfigurator's
generated benchmark with its warm-up left out), with SGLang's agg `cohort` or every engine `spread`, and marks the one
with the lowest median |TTFT error| on the even lines (the odd lines are reported, never chosen on). Nothing is fitted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
SAMPLE = HERE.parent.parent / "shared" / "data" / "benchmarks" / "aiconfigurator_silicon_sample.csv"


def _combined(row: dict, regime: str, rounds: float, metric: str = "ttft_ms") -> float:
    from sim.published.predict import combine_cold
    mean = combine_cold(row["components"]["first_wave"], row["components"]["steady"], rounds, regime)[metric]
    return mean + (row.get("frontend_ms", 0.0) if metric == "ttft_ms" else 0.0)


def _disagg_rows(report: str) -> tuple[dict, list[dict]]:
    data = json.loads(Path(report).read_text())
    rows = [r for r in data["rows"] if "predicted" in r and r["mode"] == "disagg" and "components" in r]
    if not rows:
        raise SystemExit(f"{report}: no replayed disaggregated row with its two parts (run with --start cold)")
    return data, rows


def _groups(rows: list[dict]) -> list[tuple]:
    groups = [("even lines", lambda r: r["line"] % 2 == 0), ("odd lines", lambda r: r["line"] % 2 == 1),
              ("all", lambda r: True)]
    for e in sorted({r["backend"] for r in rows}):
        groups += [(e, lambda r, e=e: r["backend"] == e),
                   (f"{e} even", lambda r, e=e: r["backend"] == e and r["line"] % 2 == 0),
                   (f"{e} odd", lambda r, e=e: r["backend"] == e and r["line"] % 2 == 1)]
    return groups


def _median_err(sel: list[dict], pred, metric: str = "ttft_ms") -> tuple[float, float]:
    err = np.array([pred(r) / r["measured"][metric] - 1 for r in sel])
    return float(np.median(np.abs(err))), float(np.median(err))


def regimes(report: str) -> None:
    from sim.published.predict import benchmark_rounds
    data, rows = _disagg_rows(report)
    given = data.get("disagg_rounds", data.get("rounds", 10))    # reports before 2026-12-06 replayed N = rounds
    print(f"{report}: {len(rows)} disaggregated rows, N = {given}; median |TTFT error| (signed median)")
    print(f"{'group':12s} {'rows':>5s}  {'cohort':>16s}  {'spread':>16s}")
    for name, keep in _groups(rows):
        sel = [r for r in rows if keep(r)]
        cells = []
        for regime in ("cohort", "spread"):
            med, signed = _median_err(sel, lambda r: _combined(
                r, regime, benchmark_rounds(given, "disagg", r["concurrency"])))
            cells.append(f"{med * 100:6.1f}% ({signed * 100:+6.1f}%)")
        print(f"{name:12s} {len(sel):5d}  {cells[0]:>16s}  {cells[1]:>16s}")


LENGTHS = (("N = 10", 10), ("dynamo: max(3c, 10) requests", "dynamo"), ("AIConfigurator: warm-up left out", 10 ** 9))
"""The candidate benchmarks of `lengths`: N = 10 (the agg rows' ROUNDS), Dynamo's benchmark utility
(benchmarks/utils/aiperf.py: max(3 x concurrency, 10) requests, no warm-up), AIConfigurator's generated benchmark
(bench_run.sh.j2: 50 x concurrency requests after 2 x concurrency warm-up ones: the steady state alone)."""


def lengths(report: str) -> None:
    from sim.published.engines import ENGINES
    from sim.published.predict import benchmark_rounds
    _, rows = _disagg_rows(report)
    cands = [(f"{name}, {'SGLang cohort' if kept else 'every engine spread'}", rounds, kept)
             for name, rounds in LENGTHS for kept in (True, False)]

    def pred(rounds, kept, metric="ttft_ms"):
        def one(r):
            regime = ENGINES[r["backend"]].later_waves if kept else "spread"
            return _combined(r, regime, benchmark_rounds(rounds, "disagg", r["concurrency"]), metric)
        return one
    even = [r for r in rows if r["line"] % 2 == 0]
    best = min(cands, key=lambda c: _median_err(even, pred(c[1], c[2]))[0])
    print(f"{report}: {len(rows)} disaggregated rows; median |error| (signed median); * chosen on the even lines")
    groups = _groups(rows)
    print("| benchmark | " + " | ".join(f"TTFT {g[0]}" for g in groups) + " | TPOT all |")
    print("|---|" + "---:|" * (len(groups) + 1))
    for name, rounds, kept in cands:
        cells = []
        for _, keep in groups:
            med, signed = _median_err([r for r in rows if keep(r)], pred(rounds, kept))
            cells.append(f"{med * 100:.1f}% ({signed * 100:+.0f}%)")
        tpot = _median_err(rows, pred(rounds, kept, "tpot_ms"), "tpot_ms")
        mark = " *" if (name, rounds, kept) == best else ""
        print(f"| {name}{mark} | " + " | ".join(cells) + f" | {tpot[0] * 100:.1f}% ({tpot[1] * 100:+.0f}%) |")


def waves(lines: list[int], sample: Path, per_user: int) -> None:
    from sim.published.predict import _run, build_case
    from sim.published.rows import read_published
    rows = {r.line: r for r in read_published(sample)}
    for line in lines:
        if line not in rows:
            raise SystemExit(f"{sample}: no row on line {line}")
        row = rows[line]
        case = build_case(row, per_user=per_user, start="burst", client="fixed")  # fixed lengths: the cohort kept
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
    ln = sub.add_parser("lengths", help="recombine a disaggregated replay's two parts under each candidate benchmark")
    ln.add_argument("report", help="report.json of capsim validate-published --mode disagg")
    w = sub.add_parser("waves", help="run rows as the simulator's own closed loop and print each wave")
    w.add_argument("lines", nargs="+", type=int, help="line numbers of the sample (as report.json names them)")
    w.add_argument("--sample", type=Path, default=SAMPLE)
    w.add_argument("--requests-per-user", type=int, default=10)
    args = ap.parse_args()
    if args.what == "regimes":
        regimes(args.report)
    elif args.what == "lengths":
        lengths(args.report)
    else:
        waves(args.lines, args.sample, args.requests_per_user)
    return 0


if __name__ == "__main__":
    sys.exit(main())
