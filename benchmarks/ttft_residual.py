#!/usr/bin/env python
"""How a replayed row's TTFT error follows from its E2E and TPOT errors (a benchmark, not a test).

    SAMPLE=../shared/data/benchmarks/aiconfigurator_silicon_sample.csv
    capsim validate-published $SAMPLE --mode disagg --out vp-disagg
    python benchmarks/ttft_residual.py vp-disagg/report.json

Every row of the silicon sample is a closed loop: `concurrency` users, each sending its next request when the last
one ends, every request making `osl` tokens. A request's mean latency is E2E = TTFT + (osl - 1) x TPOT and the
deployment serves about concurrency / E2E requests per second (derived, not measured: the file has no throughput
column; it takes TTFT and TPOT as means and no pause between a user's requests), so the error of E2E is (with its sign
turned) the error of that rate, the number a capacity plan rests on. TTFT is E2E less the decode time. For the measurement and the
prediction alike, that makes the relative errors obey, exactly,

    e_TTFT = k x e_E2E - (k - 1) x e_TPOT,      k = measured E2E / measured TTFT

(an identity of the definitions, not a finding; the script asserts it on every row as a guard against a report
whose rows do not match their osl). Where a pool is saturated, E2E is set by its throughput and TTFT is
what is left of it: with k = 15, a rate 2% off with TPOT exact reads as a TTFT 30% off. The table gives, per group,
per band of k and per band of users, the rows, the median k and the median |error| (signed median) of TTFT, TPOT and E2E, and the
served rate's median |error|. Nothing is fitted; it reads what validate-published wrote.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.published.rows import multi_gpu_lines  # noqa: E402

BANDS = ((0.0, 5.0), (5.0, 15.0), (15.0, float("inf")))
USERS = ((1, 16), (17, 64), (65, 10**9))


def row_errors(r: dict) -> dict:
    """k and the relative errors of one replayed row; raises if the report's own e2e_ms (validate-published's
    `derived`) disagrees with ttft + (osl - 1) x tpot, or the identity above does not hold."""
    m, p, osl = r["measured"], r["predicted"], r["osl"]
    e2e_m, e2e_p = m["ttft_ms"] + (osl - 1) * m["tpot_ms"], p["ttft_ms"] + (osl - 1) * p["tpot_ms"]
    k = e2e_m / m["ttft_ms"]
    e = {"ttft": p["ttft_ms"] / m["ttft_ms"] - 1, "tpot": p["tpot_ms"] / m["tpot_ms"] - 1, "e2e": e2e_p / e2e_m - 1}
    reported = r.get("derived", {}).get("e2e_ms")
    if reported is not None and not (abs(reported["measured"] / e2e_m - 1) < 1e-9
                                     and abs(reported["predicted"] / e2e_p - 1) < 1e-9):
        raise AssertionError(f"line {r['line']}: the report's derived e2e_ms is not ttft + (osl - 1) x tpot")
    if abs(e["ttft"] - (k * e["e2e"] - (k - 1) * e["tpot"])) > 1e-9 * max(1.0, k):
        raise AssertionError(f"line {r['line']}: e_TTFT != k e_E2E - (k - 1) e_TPOT")
    return {"line": r["line"], "mode": r["mode"], "backend": r["backend"], "system": r["system"], "k": k,
            "concurrency": r["concurrency"], **e, "rate": 1 / (1 + e["e2e"]) - 1}


def _group(name: str, rows: list[dict]) -> dict:
    out = {"group": name, "n": len(rows), "k": float(np.median([r["k"] for r in rows])) if rows else float("nan")}
    for m in ("ttft", "tpot", "e2e", "rate"):
        e = np.array([r[m] for r in rows])
        out[m] = (float(np.median(np.abs(e))), float(np.median(e))) if len(e) else (float("nan"), float("nan"))
    return out


def table(report: dict, multi_gpu: set[int] | None = None) -> list[dict]:
    """Per mode: all rows, the agg rows on several GPUs (lines in `multi_gpu`, when given), each engine, each card x engine,
    each band of k, each band of users."""
    rows = [row_errors(r) for r in report["rows"] if "predicted" in r and "ttft_ms" in r["predicted"]]
    out = []
    for mode in sorted({r["mode"] for r in rows}):
        mine = [r for r in rows if r["mode"] == mode]
        out.append(_group(f"{mode}: all rows", mine))
        if multi_gpu is not None and mode == "agg":  # a disaggregated row is two pools, always several GPUs
            out.append(_group(f"{mode}: TP > 1, PP, EP or attention DP", [r for r in mine if r["line"] in multi_gpu]))
        out += [_group(f"{mode}: {b}", [r for r in mine if r["backend"] == b]) for b in sorted({r["backend"] for r in mine})]
        out += [_group(f"{mode}: {s} {b}", [r for r in mine if (r["system"], r["backend"]) == (s, b)])
                for s, b in sorted({(r["system"], r["backend"]) for r in mine})]
        out += [_group(f"{mode}: k in [{lo:g}, {hi:g})", [r for r in mine if lo <= r["k"] < hi]) for lo, hi in BANDS]
        out += [_group(f"{mode}: {lo}-{hi} users" if hi < 10**9 else f"{mode}: {lo}+ users",
                       [r for r in mine if lo <= (r["concurrency"] or 0) <= hi]) for lo, hi in USERS]
    return out


def markdown(groups: list[dict]) -> str:
    lines = ["| group | rows | median k | TTFT | TPOT | E2E | served rate |", "|---|---:|---:|---:|---:|---:|---:|"]
    for g in groups:
        cells = " | ".join(f"{g[m][0]:.1%} ({g[m][1]:+.0%})" for m in ("ttft", "tpot", "e2e", "rate"))
        lines.append(f"| {g['group']} | {g['n']} | {g['k']:.1f} | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", help="report.json written by capsim validate-published --out")
    ap.add_argument("--json", help="also write the table here")
    ap.add_argument("--sample", help="the silicon-sample file replayed: adds the group of rows on several GPUs")
    args = ap.parse_args(argv)
    try:
        report = json.loads(Path(args.report).read_text())
    except (OSError, ValueError) as exc:
        print(f"ttft_residual: {args.report}: cannot read a validate-published report ({exc})", file=sys.stderr)
        return 2
    groups = table(report, None if args.sample is None else multi_gpu_lines(args.sample))
    if not groups:
        print(f"ttft_residual: {args.report}: no replayed row with TTFT and TPOT", file=sys.stderr)
        return 1
    print("median |error| (signed median) of each metric; k = measured E2E / measured TTFT")
    print(markdown(groups))
    if args.json:
        Path(args.json).write_text(json.dumps(groups, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
