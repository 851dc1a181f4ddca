#!/usr/bin/env python
"""Async scheduling on or off, per engine, chosen on even lines (a benchmark, not a test).

    S=../shared/data/benchmarks/aiconfigurator_silicon_sample.csv
    capsim validate-published $S --mode agg --async-scheduling off --out r_off
    capsim validate-published $S --mode agg --async-scheduling on --out r_on
    python benchmarks/async_scheduling_choice.py r_off/report.json r_on/report.json --sample $S

Every engine's code plans an iteration while the one before runs (vLLM's async scheduling, default since 0.14;
TensorRT-LLM's and SGLang's overlap scheduler), so a request that arrives meanwhile joins one iteration later
(`scheduler.async_scheduling`). The front end (sim.published.engines `frontend_ms`) was fitted with the option off
and partly stands in for the same delay, so each side gets its own front end, chosen on the even lines
(published_peer.py `_best_frontend`). Per engine: the median |TTFT error| on the even lines (what chooses), on the
odd lines, and with each benchmark collection left out in turn (front end chosen on the others); TPOT on the odd
lines. REPORTs may hold other engines' rows or a subset: only the rows both predicted count.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

_spec = importlib.util.spec_from_file_location("published_peer", Path(__file__).with_name("published_peer.py"))
peer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peer)


def _rows(report: str) -> dict:
    return {r["id"]: r for r in json.loads(Path(report).read_text())["rows"] if "predicted" in r and r["mode"] == "agg"}


def _tpot(rows: list[dict]) -> float:
    return float(np.median([abs(r["predicted"]["tpot_ms"] / r["measured"]["tpot_ms"] - 1) for r in rows]))


def choice_table(off: str, on: str, sample: str) -> list[dict]:
    """Per engine and side (off, on): the front end chosen on even lines and the medians described above."""
    with open(sample, newline="") as fh:
        coll = {r["id"]: peer.collection(r["silicon_data_source"]) for r in csv.DictReader(fh)}
    sides = {"off": _rows(off), "on": _rows(on)}
    both = sorted(set(sides["off"]) & set(sides["on"]))
    out = []
    for backend in sorted({sides["off"][i]["backend"] for i in both}):
        ids = [i for i in both if sides["off"][i]["backend"] == backend]
        for side, rows in sides.items():
            mine = [rows[i] for i in ids]
            even = [r for r in mine if r["line"] % 2 == 0]
            odd = [r for r in mine if r["line"] % 2 == 1]
            pair = peer._best_frontend(even)
            held = []
            for c in sorted({coll[r["id"]] for r in mine}):
                test = [r for r in mine if coll[r["id"]] == c]
                rest = [r for r in mine if coll[r["id"]] != c]
                if rest:
                    chosen = peer._best_frontend(rest)
                    held += [peer._frontend_err(r, chosen) for r in test]
            out.append({"backend": backend, "side": side, "n": len(mine), "pair": pair,
                        "even": peer._median_err(even, pair), "odd": peer._median_err(odd, pair),
                        "left_out": float(np.median(held)) if held else float("nan"), "tpot_odd": _tpot(odd)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("off", help="report.json of a run with --async-scheduling off")
    ap.add_argument("on", help="report.json of a run with --async-scheduling on")
    ap.add_argument("--sample", required=True, help="the silicon sample CSV (its silicon_data_source: collections)")
    args = ap.parse_args(argv)
    table = choice_table(args.off, args.on, args.sample)
    if not table:
        print("no agg row predicted in both reports", file=sys.stderr)
        return 1
    print("| engine | async scheduling | rows | front end (ms, ms per user) | TTFT even lines | TTFT odd lines | "
          "TTFT, each collection left out | TPOT odd lines |\n|---|---|---:|---|---:|---:|---:|---:|")
    for r in table:
        print(f"| {r['backend']} | {r['side']} | {r['n']} | {r['pair']} | {r['even']:.1%} | {r['odd']:.1%} | "
              f"{r['left_out']:.1%} | {r['tpot_odd']:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
