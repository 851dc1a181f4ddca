"""Which option of the replay fits the published rows, chosen per engine on half of the rows and reported on the
other half (a benchmark, not a test). Written for the MoE kernel timings (each engine's measured fused-MoE kernel
under balanced or power-law routing, or the composition from GEMMs); any set of validate-published runs of the
same rows that differ in one option works the same way, e.g. whose all-reduce times tensor parallelism:

    capsim validate-published ROWS.csv --out A                                  # the row's engine, balanced
    capsim validate-published ROWS.csv --moe-routing power_law_1.2 --out B
    capsim validate-published ROWS.csv --moe-kernels composed --out C
    python benchmarks/moe_routing_held_out.py balanced=A/report.json power_law_1.2=B/report.json \
        composed=C/report.json --sample ../shared/data/benchmarks/aiconfigurator_silicon_sample.csv [--aic aic.csv]

    capsim validate-published ROWS.csv --all-reduce nccl --out N
    capsim validate-published ROWS.csv --all-reduce own --out O
    python benchmarks/moe_routing_held_out.py nccl=N/report.json own=O/report.json --sample ...

For each engine, the option whose median |TPOT error| (or --metric ttft_ms) is lowest on the rows with an even line number in the
silicon sample is chosen (TPOT: the option's direct effect; TTFT also carries the benchmark's unknown length;
ties go to the option listed first); the table reports every (system, engine, model) group on its odd rows
under the choice, beside every option and, given the peer's per-row CSV (benchmarks/aiconfigurator_peer.py),
AIConfigurator on the same odd rows.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np

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


def choose(runs: dict[str, dict], lines: dict[str, int], metric: str = "tpot_ms") -> dict[str, str]:
    """engine -> the option with the lowest median |error| of `metric` on the even-line rows every run predicted."""
    names = list(runs)
    both = set.intersection(*(set(r) for r in runs.values()))
    engines = sorted({runs[names[0]][i]["backend"] for i in both})
    out = {}
    for eng in engines:
        even = [i for i in both if runs[names[0]][i]["backend"] == eng and lines.get(i, 1) % 2 == 0]
        scores = {k: _med([runs[k][i] for i in even], metric) for k in names}
        out[eng] = min(names, key=lambda k: (scores[k], names.index(k)))
        print(f"{eng}: chosen on {len(even)} even rows: {out[eng]} "
              f"(median |{metric} err| {', '.join(f'{k} {v:.1%}' for k, v in scores.items())})", file=sys.stderr)
    return out


def held_out_table(runs: dict[str, dict], lines: dict[str, int], chosen: dict[str, str],
                   aic: dict[str, dict] | None) -> str:
    """Markdown: per (system, engine, model) the odd rows' median |error| under the choice and every option."""
    names = list(runs)
    both = set.intersection(*(set(r) for r in runs.values()))
    odd = sorted(i for i in both if lines.get(i, 0) % 2 == 1)
    groups: dict[tuple, list[str]] = {}
    for i in odd:
        r = runs[names[0]][i]
        groups.setdefault((r["system"], r["backend"], r["model"].split("/")[-1]), []).append(i)
    groups[("all", "all", "all")] = odd
    opts = " / ".join(names)
    head = (f"| system | engine | model | odd rows | chosen | TTFT | TPOT | TTFT {opts} | TPOT {opts} |"
            + (" AIConfigurator TTFT / TPOT (rows) |" if aic else ""))
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for (system, eng, model), ids in sorted(groups.items(), key=lambda kv: (kv[0][0] == "all", kv[0])):
        # each row under its own engine's choice
        pick = [runs[chosen[runs[names[0]][i]["backend"]]][i] for i in ids]
        cells = [system, eng, model, str(len(ids)), chosen.get(eng, "per engine"), f"{_med(pick, 'ttft_ms'):.1%}",
                 f"{_med(pick, 'tpot_ms'):.1%}",
                 " / ".join(f"{_med([runs[k][i] for i in ids], 'ttft_ms'):.1%}" for k in names),
                 " / ".join(f"{_med([runs[k][i] for i in ids], 'tpot_ms'):.1%}" for k in names)]
        if aic is not None:
            a = [i for i in ids if i in aic]
            if a:
                meas = {r["id"]: r["measured"] for r in pick}
                ttft = np.median([abs(aic[i]["ttft"] / meas[i]["ttft_ms"] - 1) for i in a])
                tpot = np.median([abs(aic[i]["tpot"] / meas[i]["tpot_ms"] - 1) for i in a])
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
    ap.add_argument("runs", nargs="+", metavar="NAME=REPORT", help="an option's name and its report.json")
    ap.add_argument("--sample", required=True, help="the silicon sample CSV (its line numbers split the rows)")
    ap.add_argument("--aic", help="benchmarks/aiconfigurator_peer.py output for the same rows")
    ap.add_argument("--metric", choices=["tpot_ms", "ttft_ms"], default="tpot_ms",
                    help="what the even rows choose by (default TPOT; ttft_ms for an option that acts on TTFT first, "
                         "e.g. --engine-config)")
    args = ap.parse_args(argv)
    runs = {}
    for item in args.runs:
        name, sep, path = item.partition("=")
        if not sep:
            raise SystemExit(f"{item!r}: expected NAME=REPORT")
        runs[name] = predicted(path)
    lines = sample_lines(args.sample)
    chosen = choose(runs, lines, args.metric)
    print(held_out_table(runs, lines, chosen, load_aic(args.aic) if args.aic else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
