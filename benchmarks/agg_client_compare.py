#!/usr/bin/env python
"""Two replays of the silicon sample's agg rows side by side, per benchmark collection and engine (a benchmark, not a
test).

    SAMPLE=../shared/data/benchmarks/aiconfigurator_silicon_sample.csv
    capsim validate-published $SAMPLE --mode agg --backend vllm --out agg-fixed
    capsim validate-published $SAMPLE --mode agg --backend vllm --client sa_bench --out agg-sab
    python benchmarks/agg_client_compare.py agg-fixed/report.json agg-sab/report.json --sample $SAMPLE

BEFORE is one replay, AFTER the same rows under one changed rule (above: the agg rows replayed as InferenceX's client,
SA-Bench, against the fixed client; docs/fidelity.md "The agg rows' provenance, read again"). A row's collection is
read from its silicon_data_source (benchmarks/published_peer.py `collection`): the InferenceX runs (`db-dump`, and
the `2026-03-25.csv` and `2026-04-06.csv` exports of the same database) and NVIDIA's `gap-analysis` runs. By default
only the rows issue 15 scores (TP, PP or EP above 1); `--all` takes the single-GPU rows too. Every group is printed,
each with its rows, the median |error| and signed median of TTFT and TPOT, and the rows within 20% TTFT, under both.
Nothing is chosen and nothing is fitted.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

INFERENCEX = ("db-dump", "2026-03-25.csv", "2026-04-06.csv")
"""The collections that are InferenceX runs (SemiAnalysisAI/InferenceX): its database and two exports of it."""


def _collection_fn():
    spec = importlib.util.spec_from_file_location("published_peer", Path(__file__).with_name("published_peer.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.collection


def sample_rows(sample: str) -> dict[str, dict]:
    """id -> {collection, multi}: the row's benchmark collection and whether it runs on several GPUs."""
    collection = _collection_fn()
    out = {}
    with open(sample, newline="") as fh:
        for r in csv.DictReader(fh):
            par = [float(r[k] or 1) for k in ("tp_size", "pp_size", "moe_ep_size")]
            out[r["id"]] = {"collection": collection(r["silicon_data_source"]), "multi": max(par) > 1}
    return out


def _stats(errs: list[float]) -> tuple[float, float, int]:
    e = np.array(errs, dtype=float)
    if not len(e):
        return float("nan"), float("nan"), 0
    return float(np.median(np.abs(e))), float(np.median(e)), int((np.abs(e) <= 0.2).sum())


def compare(before: str, after: str, sample: str, every_row: bool = False) -> list[dict]:
    """Per group (collection x engine, the InferenceX collections and the others, even / odd lines, all rows): the
    rows both replays predicted, and under each replay (median |error|, signed median, rows within 20%) of TTFT, and
    the median |error| of TPOT."""
    info = sample_rows(sample)
    runs = [{r["id"]: r for r in json.loads(Path(p).read_text())["rows"]
             if "predicted" in r and r["mode"] == "agg" and r["id"] in info and (every_row or info[r["id"]]["multi"])}
            for p in (before, after)]
    ids = sorted(set(runs[0]) & set(runs[1]), key=lambda i: runs[0][i]["line"])
    coll = {i: info[i]["collection"] for i in ids}
    engine = {i: runs[0][i]["backend"] for i in ids}
    groups = [(f"{c} {e}", lambda i, c=c, e=e: (coll[i], engine[i]) == (c, e))
              for c, e in sorted({(coll[i], engine[i]) for i in ids})]
    groups += [("InferenceX", lambda i: coll[i] in INFERENCEX),
               ("other collections", lambda i: coll[i] not in INFERENCEX)]
    groups += [("even lines", lambda i: runs[0][i]["line"] % 2 == 0), ("odd lines", lambda i: runs[0][i]["line"] % 2),
               ("all", lambda i: True)]
    table = []
    for name, keep in groups:
        sel = [i for i in ids if keep(i)]
        row = {"group": name, "n": len(sel)}
        for side, run in (("before", runs[0]), ("after", runs[1])):
            row[f"{side}_ttft"] = _stats([run[i]["error"]["ttft_ms"] for i in sel])
            row[f"{side}_tpot"] = _stats([run[i]["error"]["tpot_ms"] for i in sel])[0]
        table.append(row)
    return table


def markdown(table: list[dict]) -> str:
    cell = lambda s: f"{s[0]:.1%} ({s[1]:+.0%}), {s[2]}"  # noqa: E731
    lines = ["| group | rows | TTFT before (signed), within 20% | TTFT after | TPOT before | TPOT after |",
             "|---|---:|---|---|---:|---:|"]
    lines += [f"| {g['group']} | {g['n']} | {cell(g['before_ttft'])} | {cell(g['after_ttft'])} | "
              f"{g['before_tpot']:.1%} | {g['after_tpot']:.1%} |" for g in table]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", help="report.json of `capsim validate-published --mode agg`")
    ap.add_argument("after", help="report.json of the same rows under one changed rule")
    ap.add_argument("--sample", required=True, help="the silicon sample CSV both reports replayed")
    ap.add_argument("--all", action="store_true", help="single-GPU rows too (default: TP, PP or EP above 1)")
    args = ap.parse_args(argv)
    print(markdown(compare(args.before, args.after, args.sample, args.all)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
