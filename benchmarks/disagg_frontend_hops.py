#!/usr/bin/env python
"""Does a disaggregated request pass through its engine's front end once or twice? (a benchmark, not a test)

    capsim validate-published ../shared/data/benchmarks/aiconfigurator_silicon_sample.csv --mode disagg --out vp
    python benchmarks/disagg_frontend_hops.py vp/report.json

A disaggregated deployment puts a proxy in front of the two pools. TensorRT-LLM's disaggregated server (its default
`context_first` schedule) and vLLM's prefill / decode proxies send the request to a prefill server, wait for its
whole (one-token, non-streamed) response, then send it to a decode server: two HTTP requests in series, each through
an engine's API server and tokenizer. SGLang's router sends it to both servers at once (asyncio tasks) and the
decode server waits for the KV. So a rule read in the engines' code: the engine's front end (sim.published.engines,
fitted on agg rows) counted twice for TensorRT-LLM and vLLM, once for SGLang. Every row of REPORT (any run: its
`frontend_ms` over its `frontend_hops` is one pass) is scored under `none`, `once` (what validate-published did
before 2026-12-06), that rule (`twice_sequential`) and `twice` (every engine), on the even lines (where a choice
would be made), the odd ones and per engine. Nothing is fitted. TensorRT-LLM's published rows ran Dynamo's images
(one front end, the workers called inside Dynamo's runtime), so validate-published now counts vLLM's twice and the
others' once (EngineDefaults.disagg_frontend_hops).

    python benchmarks/disagg_frontend_hops.py vp/report.json --host-scale 2.75 [--cards gb200,gb300]

scores instead the front end, as the replay counted it, multiplied by K on the rows of CARDS (Grace hosts: a PyTorch
call's CPU time is 2.75x an H100 DGX's on GB200, NVIDIA/TransformerEngine#2053), per engine on its even and odd lines,
with the rows within 20% (docs/disaggregation.md, "The Grace host's front end").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

SEQUENTIAL = ("trtllm", "vllm")
"""Engines whose disaggregated proxy sends the prefill request, waits for its response, then the decode request."""

RULES = {"none": lambda backend: 0, "once": lambda backend: 1,
         "twice_sequential": lambda backend: 2 if backend in SEQUENTIAL else 1, "twice": lambda backend: 2}
"""How many times each rule counts the engine's front end in a disaggregated row's TTFT."""


def one_hop(row: dict) -> float:
    """One pass through the front end in a row's TTFT: its frontend_ms over the passes the replay counted
    (`frontend_hops`, 1 when absent: every row before 2026-12-06, vLLM's since counts 2)."""
    return row.get("frontend_ms", 0.0) / row.get("frontend_hops", 1)


def hops_table(report: str) -> list[dict]:
    """Per rule and part (even lines, odd lines, each engine): rows and median |TTFT error|."""
    rows = [r for r in json.loads(Path(report).read_text())["rows"] if "predicted" in r and r["mode"] == "disagg"]
    if not rows:
        return []
    parts = [("even lines", lambda r: r["line"] % 2 == 0), ("odd lines", lambda r: r["line"] % 2 == 1)]
    parts += [(b, lambda r, b=b: r["backend"] == b) for b in sorted({r["backend"] for r in rows})]
    out = []
    for rule, times in RULES.items():
        for name, keep in parts:
            errs = [abs((r["predicted"]["ttft_ms"] + (times(r["backend"]) - r.get("frontend_hops", 1)) * one_hop(r))
                        / r["measured"]["ttft_ms"] - 1) for r in rows if keep(r)]
            out.append({"rule": rule, "part": name, "n": len(errs), "median": float(np.median(errs))})
    return out


def host_scale_table(report: str, factor: float, cards: tuple[str, ...]) -> list[dict]:
    """Per engine and half (even / odd lines), then all rows: rows, median |TTFT error| and rows within 20%, with the
    front end the replay counted (`frontend_ms`, every hop) as it is (x1) and multiplied by `factor` on the rows of
    `cards`."""
    rows = [r for r in json.loads(Path(report).read_text())["rows"] if "predicted" in r and r["mode"] == "disagg"]
    parts = [(backend, half, [r for r in rows if r["backend"] == backend and r["line"] % 2 == parity])
             for backend in sorted({r["backend"] for r in rows}) for half, parity in (("even", 0), ("odd", 1))]
    out = []
    for backend, half, part in parts + [("all", "both", rows)]:
        if part:
            for scale in (1.0, factor):
                errs = np.array([abs((r["predicted"]["ttft_ms"] + (scale - 1) * r.get("frontend_ms", 0.0)
                                      * (r["system"] in cards)) / r["measured"]["ttft_ms"] - 1) for r in part])
                out.append({"engine": backend, "half": half, "scale": scale, "n": len(errs),
                            "median": float(np.median(errs)), "within_20": int((errs <= 0.2).sum())})
    return out


COLUMNS = {"hops": ("rule", "part", "n", "median"), "host_scale": ("engine", "half", "scale", "n", "median", "within_20")}
"""The columns each table prints, in order."""

HEADINGS = {"rule": "rule", "part": "part", "engine": "engine", "half": "half", "scale": "front end x", "n": "rows",
            "median": "median TTFT error", "within_20": "within 20%"}
FORMATS = {"scale": "{:g}", "median": "{:.1%}"}


def print_table(report: str, table: list[dict], columns: tuple[str, ...]) -> int:
    """`table` as a Markdown table of `columns` (exit status 0), or a line on stderr when it is empty (1)."""
    if not table:
        print(f"{report}: no predicted disaggregated row", file=sys.stderr)
        return 1
    print("| " + " | ".join(HEADINGS[c] for c in columns) + " |")
    print("|" + "|".join("---:" if c in ("n", "median", "within_20", "scale") else "---" for c in columns) + "|")
    for r in table:
        print("| " + " | ".join(FORMATS.get(c, "{}").format(r[c]) for c in columns) + " |")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", help="capsim validate-published --mode disagg --out DIR: DIR/report.json")
    ap.add_argument("--host-scale", type=float, metavar="K",
                    help="score the front end multiplied by K on the rows of --cards instead of the hop rules")
    ap.add_argument("--cards", default="gb200,gb300", help="the rows' systems --host-scale applies to (default: %(default)s)")
    args = ap.parse_args(argv)
    if args.host_scale is None:
        return print_table(args.report, hops_table(args.report), COLUMNS["hops"])
    if args.host_scale <= 0:
        ap.error(f"--host-scale: expected a factor > 0, got {args.host_scale}")
    scaled = host_scale_table(args.report, args.host_scale, tuple(args.cards.split(",")))
    return print_table(args.report, scaled, COLUMNS["host_scale"])

if __name__ == "__main__":
    sys.exit(main())
