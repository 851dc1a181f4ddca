#!/usr/bin/env python
"""Two replays of the disaggregated rows set side by side, one rule chosen per engine on the even lines (a benchmark,
not a test).

    SAMPLE=../shared/data/benchmarks/aiconfigurator_silicon_sample.csv
    capsim validate-published $SAMPLE --mode disagg --first-token prefill --out vp-prefill
    capsim validate-published $SAMPLE --mode disagg --first-token engine --out vp-engine
    python benchmarks/disagg_compare.py vp-prefill/report.json vp-engine/report.json

BEFORE is the replay as it was, AFTER the same rows under one changed rule: above, where the client's first token
comes from (`disaggregation.first_token: prefill` against each engine's way as read in its code, sim.published.engines
`disagg_first_token`); likewise `--start cold` against `--start burst --requests-per-user 10` (how the benchmark's
waves follow the first). Per engine, AFTER is chosen where its median |TTFT error| on the even lines is lower (a tie
keeps BEFORE); the odd lines, held out from that choice, report it. Every group is printed, each with its rows,
median |error| and signed median of TTFT and TPOT under both. Nothing is fitted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def _rows(report: str) -> dict[str, dict]:
    rows = json.loads(Path(report).read_text())["rows"]
    return {r["id"]: r for r in rows if "predicted" in r and r["mode"] == "disagg"}


def _err(r: dict, metric: str) -> float:
    return r["predicted"][metric] / r["measured"][metric] - 1


def _stats(rows: list[dict], metric: str) -> tuple[float, float]:
    e = np.array([_err(r, metric) for r in rows])
    return (float(np.median(np.abs(e))), float(np.median(e))) if len(e) else (float("nan"), float("nan"))


def compare(before: str, after: str) -> dict:
    """Per group (even / odd lines, engine, card x engine): rows and TTFT / TPOT errors under both replays; per
    engine the rule chosen on the even lines, and all rows and the odd lines under the rules chosen."""
    a, b = _rows(before), _rows(after)
    ids = sorted(set(a) & set(b), key=lambda i: a[i]["line"])
    groups = [("even lines", lambda r: r["line"] % 2 == 0), ("odd lines", lambda r: r["line"] % 2 == 1)]
    groups += [(e, lambda r, e=e: r["backend"] == e) for e in sorted({a[i]["backend"] for i in ids})]
    groups += [(f"{s} {e}", lambda r, s=s, e=e: (r["system"], r["backend"]) == (s, e))
               for s, e in sorted({(a[i]["system"], a[i]["backend"]) for i in ids})]
    table = []
    for name, keep in groups:
        sel = [i for i in ids if keep(a[i])]
        table.append({"group": name, "n": len(sel),
                      **{f"{side}_{m}": _stats([src[i] for i in sel], f"{m}_ms")
                         for side, src in (("before", a), ("after", b)) for m in ("ttft", "tpot")}})
    chosen = {}
    for engine in sorted({a[i]["backend"] for i in ids}):
        even = [i for i in ids if a[i]["backend"] == engine and a[i]["line"] % 2 == 0]
        chosen[engine] = "after" if _stats([b[i] for i in even], "ttft_ms")[0] < _stats([a[i] for i in even],
                                                                                       "ttft_ms")[0] else "before"
    pick = {i: (b if chosen[a[i]["backend"]] == "after" else a)[i] for i in ids}
    totals = {part: {m: _stats([pick[i] for i in ids if keep(a[i])], f"{m}_ms")[0] for m in ("ttft", "tpot")}
              for part, keep in (("all", lambda r: True), ("odd lines", lambda r: r["line"] % 2 == 1))}
    return {"groups": table, "chosen": chosen, "totals": totals}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", help="report.json of the replay as it was")
    ap.add_argument("after", help="report.json of the same rows under the changed rule")
    args = ap.parse_args(argv)
    out = compare(args.before, args.after)
    if not out["groups"] or out["groups"][0]["n"] + out["groups"][1]["n"] == 0:
        print(f"{args.before}, {args.after}: no disaggregated row predicted in both", file=sys.stderr)
        return 1
    print("| group | rows | TTFT before (signed) | TTFT after (signed) | TPOT before (signed) | TPOT after (signed) |")
    print("|---|---:|---:|---:|---:|---:|")
    for g in out["groups"]:
        cells = [f"{g[k][0]:.1%} ({g[k][1]:+.0%})" for k in ("before_ttft", "after_ttft", "before_tpot", "after_tpot")]
        print(f"| {g['group']} | {g['n']} | " + " | ".join(cells) + " |")
    print("\nchosen on the even lines: " + ", ".join(f"{e} {'after' if c == 'after' else 'before'}"
                                                   for e, c in out["chosen"].items()))
    for part, t in out["totals"].items():
        print(f"{part}, each engine's choice: TTFT {t['ttft']:.1%}, TPOT {t['tpot']:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
