#!/usr/bin/env python
"""Whether SGLang's replayed agg rows keep prefill batches apart from decodes, chosen on the even lines (a benchmark,
not a test).

    S=../shared/data/benchmarks/aiconfigurator_silicon_sample.csv
    capsim validate-published $S --backend sglang --mode agg --prefill-batches mixed --out vp-mixed
    capsim validate-published $S --backend sglang --mode agg --prefill-batches separate --out vp-separate
    python benchmarks/prefill_batches_choice.py vp-mixed/report.json vp-separate/report.json

SGLang's scheduler (0.5.x, without --enable-mixed-chunk, its default) runs a prefill batch whenever it has prefill work
and a decode batch otherwise; capsim's chunked scheduler had mixed them in one iteration (`scheduler.prefill_batches`).
The rule, stated before the runs: per engine, over its agg rows on the even lines, `separate` is chosen when the mean of
its median |TTFT error| and median |TPOT error| is lower than `mixed`'s by more than 0.1 point; the odd lines, held out,
report the choice. Every group is printed, each with its rows and the median |error| (signed median) of TTFT, TPOT and
E2E under both. Nothing is fitted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

TIE = 0.001
METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")


def _rows(report: str) -> dict[str, dict]:
    try:
        rows = json.loads(Path(report).read_text())["rows"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        sys.exit(f"prefill_batches_choice: {report}: cannot read a validate-published report ({exc})")
    return {r["id"]: r for r in rows if "predicted" in r and r["mode"] == "agg"}


def _err(r: dict, metric: str) -> float:
    if metric in r["predicted"]:
        return r["predicted"][metric] / r["measured"][metric] - 1
    d = r["derived"][metric]
    return d["predicted"] / d["measured"] - 1


def _stats(rows: list[dict], metric: str) -> tuple[float, float]:
    e = np.array([_err(r, metric) for r in rows])
    return (float(np.median(np.abs(e))), float(np.median(e))) if len(e) else (float("nan"), float("nan"))


def _score(rows: list[dict]) -> float:
    return (_stats(rows, "ttft_ms")[0] + _stats(rows, "tpot_ms")[0]) / 2


def compare(mixed: str, separate: str) -> dict:
    """Per engine the choice on the even lines and both scores on even and odd lines; per group every metric."""
    a, b = _rows(mixed), _rows(separate)
    ids = sorted(set(a) & set(b), key=lambda i: a[i]["line"])
    out = {"chosen": {}, "scores": {}, "groups": []}
    for engine in sorted({a[i]["backend"] for i in ids}):
        mine = [i for i in ids if a[i]["backend"] == engine]
        even = [i for i in mine if a[i]["line"] % 2 == 0]
        odd = [i for i in mine if a[i]["line"] % 2 == 1]
        score = {side: {"even": _score([src[i] for i in even]), "odd": _score([src[i] for i in odd])}
                 for side, src in (("mixed", a), ("separate", b))}
        out["scores"][engine] = score
        out["chosen"][engine] = ("separate" if score["separate"]["even"] < score["mixed"]["even"] - TIE else "mixed")
    groups = [("all", lambda r: True), ("even lines", lambda r: r["line"] % 2 == 0),
              ("odd lines", lambda r: r["line"] % 2 == 1)]
    groups += [(f"{s} {m.split('/')[-1]} {p or 'bf16'}", lambda r, s=s, m=m, p=p: (r["system"], r["model"],
                                                                                 r["precision"] or "") == (s, m, p))
               for s, m, p in sorted({(a[i]["system"], a[i]["model"], a[i]["precision"] or "") for i in ids})]
    for name, keep in groups:
        sel = [i for i in ids if keep(a[i])]
        out["groups"].append({"group": name, "n": len(sel),
                              **{f"{side}_{m}": _stats([src[i] for i in sel], m)
                                 for side, src in (("mixed", a), ("separate", b)) for m in METRICS}})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mixed", help="report.json of the --prefill-batches mixed replay")
    ap.add_argument("separate", help="report.json of the --prefill-batches separate replay (the same rows)")
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args(argv)
    out = compare(args.mixed, args.separate)
    for engine, sc in out["scores"].items():
        print(f"{engine}: mean of median |TTFT| and |TPOT| on the even lines: mixed {sc['mixed']['even']:.2%}, "
              f"separate {sc['separate']['even']:.2%} -> {out['chosen'][engine]}; odd lines (held out): mixed "
              f"{sc['mixed']['odd']:.2%}, separate {sc['separate']['odd']:.2%}")
    cells = [f"{side} {m[:-3].upper()}" for side in ("mixed", "separate") for m in METRICS]
    print("\n| group | rows | " + " | ".join(cells) + " |\n|---|---:|" + "---:|" * len(cells))
    for g in out["groups"]:
        print(f"| {g['group']} | {g['n']} | " + " | ".join(
            f"{g[f'{side}_{m}'][0]:.1%} ({g[f'{side}_{m}'][1]:+.0%})" for side in ("mixed", "separate")
            for m in METRICS) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
