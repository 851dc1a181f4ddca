"""Which measured routing of the fused-MoE kernels fits the published MoE rows: chosen on half of them, reported
on the other half (a benchmark, not a test).

    capsim validate-published ROWS.csv --out A                                  # --moe-routing balanced
    capsim validate-published ROWS.csv --moe-routing power_law_1.2 --out B
    python benchmarks/moe_routing_held_out.py A/report.json B/report.json \\
        --sample ../shared/data/benchmarks/aiconfigurator_silicon_sample.csv [--aic aic.csv]

For each engine, the routing whose median |TPOT error| is lower on the rows with an even line number in the
silicon sample is chosen (TPOT: the kernel's direct effect; TTFT also carries the benchmark's unknown length);
the table reports every (system, engine) group on its odd rows under the choice, beside both routings and,
given the peer's per-row CSV (benchmarks/aiconfigurator_peer.py), AIConfigurator on the same odd rows.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np

ROUTINGS = ("balanced", "power_law_1.2")


def sample_lines(path: str) -> dict[str, int]:
    """id -> line number in the silicon sample (the header is line 1)."""
    with open(path, newline="") as fh:
        return {r["id"]: i for i, r in enumerate(csv.DictReader(fh), start=2)}


def predicted(report: str) -> dict[str, dict]:
    """id -> row of a validate-published report, predicted rows only."""
    return {r["id"]: r for r in json.loads(Path(report).read_text())["rows"] if "predicted" in r}


def _err(row: dict, metric: str) -> float:
    return abs(row["predicted"][metric] / row["measured"][metric] - 1)


def _med(rows: list[dict], metric: str) -> float:
    return float(np.median([_err(r, metric) for r in rows])) if rows else float("nan")


def choose(runs: dict[str, dict], lines: dict[str, int]) -> dict[str, str]:
    """engine -> the routing with the lower median |TPOT error| on the even-line rows both runs predicted."""
    both = set.intersection(*(set(r) for r in runs.values()))
    engines = sorted({runs[ROUTINGS[0]][i]["backend"] for i in both})
    out = {}
    for eng in engines:
        even = [i for i in both if runs[ROUTINGS[0]][i]["backend"] == eng and lines.get(i, 1) % 2 == 0]
        scores = {k: _med([runs[k][i] for i in even], "tpot_ms") for k in ROUTINGS}
        out[eng] = min(ROUTINGS, key=lambda k: (scores[k], ROUTINGS.index(k)))
        print(f"{eng}: chosen on {len(even)} even rows: {out[eng]} "
              f"(median |TPOT err| {', '.join(f'{k} {v:.1%}' for k, v in scores.items())})", file=sys.stderr)
    return out


def held_out_table(runs: dict[str, dict], lines: dict[str, int], chosen: dict[str, str],
                   aic: dict[str, dict] | None) -> str:
    """Markdown: per (system, engine, model) the odd rows' median |error| under the choice and both routings."""
    both = set.intersection(*(set(r) for r in runs.values()))
    odd = sorted(i for i in both if lines.get(i, 0) % 2 == 1)
    groups: dict[tuple, list[str]] = {}
    for i in odd:
        r = runs[ROUTINGS[0]][i]
        groups.setdefault((r["system"], r["backend"], r["model"].split("/")[-1]), []).append(i)
    head = ("| system | engine | model | odd rows | chosen | TTFT | TPOT | TTFT balanced / power law | "
            "TPOT balanced / power law |" + (" AIConfigurator TTFT / TPOT (rows) |" if aic else ""))
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for (system, eng, model), ids in sorted(groups.items()):
        pick = runs[chosen[eng]]
        cells = [system, eng, model, str(len(ids)), chosen[eng], f"{_med([pick[i] for i in ids], 'ttft_ms'):.1%}",
                 f"{_med([pick[i] for i in ids], 'tpot_ms'):.1%}",
                 " / ".join(f"{_med([runs[k][i] for i in ids], 'ttft_ms'):.1%}" for k in ROUTINGS),
                 " / ".join(f"{_med([runs[k][i] for i in ids], 'tpot_ms'):.1%}" for k in ROUTINGS)]
        if aic is not None:
            a = [i for i in ids if i in aic]
            if a:
                ttft = np.median([abs(aic[i]["ttft"] / pick[i]["measured"]["ttft_ms"] - 1) for i in a])
                tpot = np.median([abs(aic[i]["tpot"] / pick[i]["measured"]["tpot_ms"] - 1) for i in a])
                cells.append(f"{ttft:.1%} / {tpot:.1%} ({len(a)})")
            else:
                cells.append("refused")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def load_aic(path: str) -> dict[str, dict]:
    """id -> the peer's TTFT / TPOT (ms) where it gave one."""
    with open(path, newline="") as fh:
        return {r["id"]: {"ttft": float(r["aic_ttft_ms"]), "tpot": float(r["aic_tpot_ms"])}
                for r in csv.DictReader(fh) if r["aic_ttft_ms"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("balanced", help="report.json of the run with --moe-routing balanced")
    ap.add_argument("power_law", help="report.json of the run with --moe-routing power_law_1.2")
    ap.add_argument("--sample", required=True, help="the silicon sample CSV (its line numbers split the rows)")
    ap.add_argument("--aic", help="benchmarks/aiconfigurator_peer.py output for the same rows")
    args = ap.parse_args(argv)
    runs = {"balanced": predicted(args.balanced), "power_law_1.2": predicted(args.power_law)}
    lines = sample_lines(args.sample)
    chosen = choose(runs, lines)
    print(held_out_table(runs, lines, chosen, load_aic(args.aic) if args.aic else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
