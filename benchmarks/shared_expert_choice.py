#!/usr/bin/env python
"""SGLang's shared expert, in series or fused into the routed kernel, set against each other on the published rows
(a benchmark, not a test; docs/fidelity.md, "SGLang's fused shared expert").

    S=../shared/data/benchmarks/aiconfigurator_silicon_sample.csv
    for v in off fused; do
      capsim validate-published $S --backend sglang --mode agg --shared-experts-overlap $v --out vp-agg-$v
      capsim validate-published $S --backend sglang --mode disagg --shared-experts-overlap $v --out vp-disagg-$v
    done
    python benchmarks/shared_expert_choice.py off=vp-agg-off,vp-disagg-off fused=vp-agg-fused,vp-disagg-fused

Each argument is NAME=FOLDER[,FOLDER...], the report.json folders of one replay; the first is the current rule. The
rule, stated before the runs: over the rows both replays predict, on the even lines (agg and disaggregated
together), the value with the lower median |TPOT error| is chosen, a tie keeping the first; the odd lines, held out,
report it. Every group is printed under every value (median |error|, signed median). Nothing is fitted.

The same rule serves any step-time choice set out this way: `--models A,B` keeps the rows of models whose name
contains one of the strings (the rows the choice can change), e.g. MLA's decode attention (docs/parallel.md):

    python benchmarks/shared_expert_choice.py --models DeepSeek,Kimi latency=AGG,DISAGG tokens=AGG2,DISAGG2
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def _rows(folders: str) -> dict[str, dict]:
    out = {}
    for folder in folders.split(","):
        path = Path(folder) / "report.json"
        if not path.is_file():
            raise SystemExit(f"{path}: not found (run capsim validate-published ... --out {folder})")
        out.update({r["id"]: r for r in json.loads(path.read_text())["rows"] if "predicted" in r})
    return out


def _cell(rows: list[dict], metric: str) -> tuple[float, str]:
    err = np.array([r["predicted"][metric] / r["measured"][metric] - 1 for r in rows])
    return float(np.median(np.abs(err))), f"{np.median(np.abs(err)) * 100:5.1f}% ({np.median(err) * 100:+6.1f}%)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", metavar="NAME=FOLDER[,FOLDER...]")
    ap.add_argument("--models", default="", help="only rows whose model contains one of these comma-separated strings")
    args = ap.parse_args()
    wanted = [m for m in args.models.split(",") if m]
    runs = {}
    for arg in args.runs:
        name, sep, folders = arg.partition("=")
        if not sep or not name or not folders:
            raise SystemExit(f"expected NAME=FOLDER[,FOLDER...], got {arg!r}")
        runs[name] = _rows(folders)
    if len(runs) < 2:
        raise SystemExit("give at least two runs to set against each other")
    ids = sorted(set.intersection(*(set(r) for r in runs.values())))
    if wanted:
        ids = [i for i in ids if any(m in next(iter(runs.values()))[i]["model"] for m in wanted)]
    if not ids:
        raise SystemExit("the runs predict no row in common")
    first = next(iter(runs.values()))

    def group(keep) -> list[str]:
        return [i for i in ids if keep(first[i])]

    groups = [("even lines", group(lambda r: r["line"] % 2 == 0)), ("odd lines", group(lambda r: r["line"] % 2 == 1))]
    for mode in ("agg", "disagg"):
        for parity, rest in (("even", 0), ("odd", 1)):
            groups.append((f"{mode} {parity}", group(lambda r, m=mode, p=rest: r["mode"] == m and r["line"] % 2 == p)))
    keys = sorted({(first[i]["mode"], first[i]["system"], first[i]["model"].split("/")[-1], first[i]["precision"])
                   for i in ids}, key=str)
    for key in keys:
        groups.append((" ".join(str(k) for k in key), group(
            lambda r, k=key: (r["mode"], r["system"], r["model"].split("/")[-1], r["precision"]) == k)))
    names = list(runs)
    print(f"{len(ids)} rows predicted by every run; median |error| (signed median)")
    for metric in ("tpot_ms", "ttft_ms"):
        print(f"\n{metric}")
        print(f"{'group':44s} {'rows':>5s}  " + "  ".join(f"{n:>17s}" for n in names))
        for label, sel in groups:
            if sel:
                print(f"{label:44s} {len(sel):5d}  " + "  ".join(
                    f"{_cell([runs[n][i] for i in sel], metric)[1]:>17s}" for n in names))
    even = groups[0][1]
    scores = {n: _cell([runs[n][i] for i in even], "tpot_ms")[0] for n in names}
    best = min(names, key=lambda n: (scores[n], names.index(n)))
    print(f"\nchosen on the even lines' median |TPOT error|: {best} "
          f"({', '.join(f'{n} {scores[n] * 100:.1f}%' for n in names)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
