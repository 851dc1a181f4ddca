#!/usr/bin/env python
"""The KV cache's format of the published replays chosen per engine on the even lines (a benchmark, not a test).

    S=../shared/data/benchmarks/aiconfigurator_silicon_sample.csv
    for v in bf16 quantized checkpoint; do
      capsim validate-published $S --mode agg --kv-cache $v --out vp-agg-$v
      capsim validate-published $S --mode disagg --kv-cache $v --out vp-disagg-$v
    done
    python benchmarks/kv_cache_choice.py bf16=vp-agg-bf16,vp-disagg-bf16 quantized=vp-agg-quantized,vp-disagg-quantized \\
        checkpoint=vp-agg-checkpoint,vp-disagg-checkpoint --json docs/fidelity/kv-cache-choice.json

Each argument is NAME=FOLDER[,FOLDER...], the report.json folders of one `--kv-cache NAME` replay (agg and
disaggregated rows). The rule, stated before the runs: per engine, over its FP8 and FP4 rows on the even lines (the
rows some value changes; agg and disaggregated together), the value with the lowest mean of the median |TTFT error|
and the median |TPOT error| is chosen; within 0.1 point of `bf16`'s score, `bf16` stays. The odd lines, held out,
report the choice. Every group is printed under every value. Nothing is fitted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.published.rows import multi_gpu_lines  # noqa: E402

TIE = 0.001
"""A value must beat bf16's score by more than this (0.1 point) to replace it."""


def _load(folders: str) -> dict[tuple[str, str], dict]:
    out = {}
    for folder in folders.split(","):
        for r in json.loads((Path(folder) / "report.json").read_text())["rows"]:
            if "predicted" in r:
                out[(r["mode"], r["id"])] = r
    return out


def _err(r: dict, metric: str) -> float:
    return r["predicted"][metric] / r["measured"][metric] - 1


def _med(rows: list[dict], metric: str) -> float:
    return float(np.median(np.abs([_err(r, metric) for r in rows]))) if rows else float("nan")


def _score(rows: list[dict]) -> float:
    return (_med(rows, "ttft_ms") + _med(rows, "tpot_ms")) / 2


def choose(variants: dict[str, dict], multi_gpu: set[int]) -> dict:
    """Per engine the chosen value and every value's score on the even lines; per group every value's medians; the
    totals under the chosen values."""
    names = list(variants)
    keys = sorted(set.intersection(*(set(v) for v in variants.values())),
                  key=lambda k: (k[0], variants[names[0]][k]["line"]))
    base = variants[names[0]]
    quantized = [k for k in keys if base[k]["precision"] in ("fp8", "fp4")]
    chosen, scores, held_out = {}, {}, {}
    for engine in sorted({base[k]["backend"] for k in keys}):
        even = [k for k in quantized if base[k]["backend"] == engine and base[k]["line"] % 2 == 0]
        odd = [k for k in quantized if base[k]["backend"] == engine and base[k]["line"] % 2 == 1]
        scores[engine] = {n: _score([variants[n][k] for k in even]) for n in names}
        held_out[engine] = {n: _score([variants[n][k] for k in odd]) for n in names}
        best = min(names, key=lambda n: scores[engine][n])
        chosen[engine] = best if scores[engine][best] < scores[engine]["bf16"] - TIE else "bf16"
    groups = [("even lines, FP8 / FP4", lambda r: r["line"] % 2 == 0 and r["precision"] in ("fp8", "fp4")),
              ("odd lines, FP8 / FP4", lambda r: r["line"] % 2 == 1 and r["precision"] in ("fp8", "fp4"))]
    groups += [(f"{m} {e} {p}", lambda r, m=m, e=e, p=p: (r["mode"], r["backend"], r["precision"]) == (m, e, p))
               for m, e, p in sorted({(base[k]["mode"], base[k]["backend"], base[k]["precision"]) for k in quantized})]
    table = []
    for name, keep in groups:
        sel = [k for k in keys if keep(base[k])]
        table.append({"group": name, "n": len(sel),
                      **{n: [_med([variants[n][k] for k in sel], m) for m in ("ttft_ms", "tpot_ms")] for n in names}})
    pick = {k: variants[chosen[base[k]["backend"]]][k] for k in keys}
    parts = {"agg": lambda r: r["mode"] == "agg", "agg, TP > 1 / PP / EP / attention DP (issue 15)":
             lambda r: r["mode"] == "agg" and r["line"] in multi_gpu,
             "disagg": lambda r: r["mode"] == "disagg",
             "vLLM agg, H100 + B200 (issue 14)": lambda r: r["mode"] == "agg" and r["backend"] == "vllm"
             and r["system"] in ("h100_sxm", "b200_sxm"),
             "odd lines, all": lambda r: r["line"] % 2 == 1}
    totals = {}
    for part, keep in parts.items():
        sel = [k for k in keys if keep(base[k])]
        totals[part] = {n: [len(sel), _med([src[k] for k in sel], "ttft_ms"), _med([src[k] for k in sel], "tpot_ms")]
                        for n, src in (*((n, variants[n]) for n in names), ("chosen", pick))}
    return {"chosen": chosen, "scores": scores, "held_out": held_out, "groups": table, "totals": totals}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variants", nargs="+", help="NAME=FOLDER[,FOLDER...]: one --kv-cache value's report folders "
                                                "(the first must be bf16)")
    ap.add_argument("--sample", default="../shared/data/benchmarks/aiconfigurator_silicon_sample.csv",
                    help="the silicon sample the reports replayed (for its layouts)")
    ap.add_argument("--json", help="write the result here too")
    args = ap.parse_args(argv)
    variants = {}
    for text in args.variants:
        name, _, folders = text.partition("=")
        if not folders:
            ap.error(f"expected NAME=FOLDER[,FOLDER...], got {text!r}")
        variants[name] = _load(folders)
    if next(iter(variants)) != "bf16":
        ap.error("the first variant must be bf16 (the value a tie keeps)")
    out = choose(variants, multi_gpu_lines(args.sample))
    names = list(variants)
    print("scores on the even FP8 / FP4 lines (mean of median |TTFT| and median |TPOT|):")
    for engine, sc in out["scores"].items():
        print(f"  {engine}: " + ", ".join(f"{n} {v:.2%}" for n, v in sc.items()) + f" -> {out['chosen'][engine]}; "
              "odd lines, held out: " + ", ".join(f"{n} {v:.2%}" for n, v in out["held_out"][engine].items()))
    print("\n| group | rows | " + " | ".join(f"{n} TTFT / TPOT" for n in names) + " |")
    print("|---|---:|" + "---:|" * len(names))
    for g in out["groups"]:
        print(f"| {g['group']} | {g['n']} | " + " | ".join(f"{g[n][0]:.1%} / {g[n][1]:.1%}" for n in names) + " |")
    print("\ntotals (rows, median |TTFT|, median |TPOT|):")
    for part, row in out["totals"].items():
        print(f"  {part}: " + "; ".join(f"{n} {v[1]:.1%} / {v[2]:.1%}" for n, v in row.items()) + f" ({row['bf16'][0]} rows)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
