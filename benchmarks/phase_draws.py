"""Random steady-state phases: one draw's prediction against the mean over several draws.

    python benchmarks/phase_draws.py REPORT.json [REPORT.json ...]

Each REPORT is a `capsim validate-published ... --phases random --seed N --out DIR` run's DIR/report.json (several
per seed when the rows were split, e.g. by --system). Reports are grouped by their `seed`; the rows every seed
predicted are compared: the median |error| of TTFT and TPOT (all rows, even and odd lines) for each draw alone and
for the mean of the first k draws' predictions (k = 2 ..). docs/fidelity.md, "The steady state's phases".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def _rows_by_seed(paths: list[Path]) -> dict[int, dict[str, dict]]:
    by_seed: dict[int, dict[str, dict]] = {}
    for path in paths:
        report = json.loads(path.read_text())
        if report.get("phases") not in ("random", "engine"):
            sys.exit(f"{path}: a run with --phases {report.get('phases')!r}; expected random draws")
        rows = by_seed.setdefault(int(report["seed"]), {})
        rows.update({r["id"]: r for r in report["rows"] if "predicted" in r})
    return by_seed


def _line(name: str, lines: np.ndarray, err_ttft: np.ndarray, err_tpot: np.ndarray) -> str:
    even = lines % 2 == 0
    med = lambda e: f"{np.median(e) * 100:.1f}%"  # noqa: E731
    return (f"| {name} | {len(lines)} | {med(err_ttft)} | {med(err_ttft[even])} | {med(err_ttft[~even])} | "
            f"{med(err_tpot)} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+", type=Path)
    args = ap.parse_args(argv)
    by_seed = _rows_by_seed(args.reports)
    seeds = sorted(by_seed)
    if len(seeds) < 2:
        sys.exit(f"reports of {len(seeds)} seed(s) ({seeds}); give at least two draws")
    ids = sorted(set.intersection(*(set(by_seed[s]) for s in seeds)))
    first = by_seed[seeds[0]]
    lines = np.array([first[i]["line"] for i in ids])
    measured = {m: np.array([first[i]["measured"][m] for i in ids]) for m in ("ttft_ms", "tpot_ms")}
    pred = {m: np.array([[by_seed[s][i]["predicted"][m] for i in ids] for s in seeds]) for m in measured}

    def err(m, p):
        return np.abs(p / measured[m] - 1)

    print("| prediction | rows | TTFT | even lines | odd lines | TPOT |")
    print("|---|---:|---:|---:|---:|---:|")
    for k, s in enumerate(seeds):
        print(_line(f"seed {s}", lines, err("ttft_ms", pred["ttft_ms"][k]), err("tpot_ms", pred["tpot_ms"][k])))
    for k in range(2, len(seeds) + 1):
        mean = {m: pred[m][:k].mean(axis=0) for m in pred}
        name = f"mean of seeds {', '.join(map(str, seeds[:k]))}"
        print(_line(name, lines, err("ttft_ms", mean["ttft_ms"]), err("tpot_ms", mean["tpot_ms"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
