#!/usr/bin/env python
"""Did TensorRT-LLM's DeepSeek runs on B200 decode with MTP? (a benchmark testing a hypothesis, not a test)

    S=../shared/data/benchmarks/aiconfigurator_silicon_sample.csv
    capsim validate-published $S --mode agg --out vp-agg
    python benchmarks/mtp_hypothesis.py $S vp-agg/report.json --json docs/fidelity/mtp-hypothesis.json

The silicon sample does not say whether a run used speculative decoding. DeepSeek-V3 and DeepSeek-R1 share one
architecture (and MTP heads), and TensorRT-LLM's agg rows on B200 measure the same configuration (card, precision,
lengths, layout, concurrency) under several engine versions. Part 1 reads the data alone: each version's TPOT and
TTFT against 1.2.0rc6.post2's on the configurations both measured. Part 2 replays the rows with MTP (capsim's
speculative decoding, `draft: heads`) at AIConfigurator's documented defaults (nextn 1 accepting 0.85; nextn 2
accepting 0.85 then 0.3; its cli/example.yaml), each draft position costing one decoder layer plus the LM head
(1.5 / layers of the row's own replayed TPOT), and prints, per version and per half of the lines, the median |error|
without and with it. Nothing is fitted: the acceptance rates are AIConfigurator's, not chosen on these rows.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MTP = {"nextn1": [0.85], "nextn2": [0.85, 0.3]}
"""AIConfigurator 0.12.0's example acceptance (cli/example.yaml, cli/example_v1_deprecated.yaml)."""
BASE_VERSION = "1.2.0rc6.post2"
BANDS = ((1, 8), (9, 32), (33, 128), (129, 4096))


def _rows(sample: str):
    from sim.published.rows import read_published
    return [r for r in read_published(sample)
            if r.backend == "trtllm" and r.mode == "agg" and r.system == "b200_sxm" and "DeepSeek" in r.model_path]


def _version(row) -> str:
    return row.backend_version or "unstated (2025-11 runs)"


def paired(rows) -> list[dict]:
    """Part 1: per version, its TPOT and TTFT over BASE_VERSION's on the configurations both measured."""
    key = lambda r: (r.precision, r.isl, r.osl, r.tp, r.attention_dp, r.moe_ep, r.concurrency)  # noqa: E731
    base = {}
    for r in rows:
        if _version(r) == BASE_VERSION:
            base.setdefault(key(r), []).append(r)
    out = []
    for version in sorted({_version(r) for r in rows} - {BASE_VERSION}):
        pairs = [(r, b) for r in rows if _version(r) == version for b in base.get(key(r), [])]
        for lo, hi in BANDS:
            band = [(r, b) for r, b in pairs if lo <= r.concurrency <= hi]
            if band:
                out.append({"version": version, "users": f"{lo}-{hi}", "pairs": len(band),
                            "tpot_ratio": float(np.median([r.tpot_ms / b.tpot_ms for r, b in band])),
                            "ttft_ratio": float(np.median([r.ttft_ms / b.ttft_ms for r, b in band]))})
    return out


def _replay(job):
    from sim.published.predict import build_case, simulate_case
    row, rates, tpot_ms, layers = job
    case = build_case(row)
    if case.scenario is None:
        return None
    scenario = copy.deepcopy(case.scenario)
    scenario["scheduler"]["speculative"] = {
        "draft": {"kind": "heads", "per_position_s": 1.5 * tpot_ms / 1e3 / layers},
        "num_draft_tokens": len(rates), "acceptance": {"kind": "per_position", "a": rates}}
    return simulate_case(None, replace(case, scenario=scenario))


def replay(rows, report: str, workers: int) -> list[dict]:
    """Part 2: every row with a prediction in `report`, as it is and under each MTP setting."""
    from sim.io.profiles import load_model
    from sim.published.predict import model_for
    known = {r["line"]: r for r in json.loads(Path(report).read_text())["rows"] if "predicted" in r}
    rows = [r for r in rows if r.line in known]
    out = [{"line": r.line, "setting": "none", **known[r.line]["predicted"]} for r in rows]
    layers = {r.line: load_model(model_for(r.model_path)).num_layers for r in rows}
    for name, rates in MTP.items():
        print(f"mtp_hypothesis: {len(rows)} rows with {name} ...", file=sys.stderr, flush=True)
        jobs = [(r, rates, known[r.line]["predicted"]["tpot_ms"], layers[r.line]) for r in rows]
        with ProcessPoolExecutor(workers) as pool:
            for r, res in zip(rows, pool.map(_replay, jobs)):
                if res and "tpot_ms" in res:
                    out.append({"line": r.line, "setting": name, "ttft_ms": res["ttft_ms"], "tpot_ms": res["tpot_ms"]})
    return out


def tables(rows, replays: list[dict]) -> list[dict]:
    """Median |error| per version and half of the lines, and the signed TPOT ratio per precision and users."""
    by_line = {r.line: r for r in rows}
    out = []
    for setting in ["none", *MTP]:
        got = [p for p in replays if p["setting"] == setting]
        for version in sorted({_version(by_line[p["line"]]) for p in got}):
            for half, parity in (("even", 0), ("odd", 1)):
                part = [p for p in got if _version(by_line[p["line"]]) == version and p["line"] % 2 == parity]
                if not part:
                    continue
                err = {m: float(np.median([abs(p[m] / getattr(by_line[p["line"]], m) - 1) for p in part]))
                       for m in ("ttft_ms", "tpot_ms")}
                ratio = {}
                for prec in sorted({by_line[p["line"]].precision for p in part}):
                    for lo, hi in BANDS:
                        band = [p["tpot_ms"] / by_line[p["line"]].tpot_ms for p in part
                                if by_line[p["line"]].precision == prec and lo <= by_line[p["line"]].concurrency <= hi]
                        if band:
                            ratio[f"{prec} {lo}-{hi}"] = float(np.median(band))
                out.append({"setting": setting, "version": version, "lines": half, "rows": len(part),
                            "ttft_abs_error": err["ttft_ms"], "tpot_abs_error": err["tpot_ms"],
                            "tpot_predicted_over_measured": ratio})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sample", help="the silicon sample CSV")
    ap.add_argument("report", help="report.json of `capsim validate-published SAMPLE --mode agg` (the replay as is)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, help="write both parts here")
    args = ap.parse_args(argv)
    rows = _rows(args.sample)
    part1 = paired(rows)
    print(f"Part 1: TensorRT-LLM DeepSeek agg rows on B200, each version against {BASE_VERSION} on the same "
          "configuration (median of measured ratios)")
    print("| version | users | pairs | TPOT ratio | TTFT ratio |\n|---|---|---:|---:|---:|")
    for p in part1:
        print(f"| {p['version']} | {p['users']} | {p['pairs']} | {p['tpot_ratio']:.2f} | {p['ttft_ratio']:.2f} |")
    part2 = tables(rows, replay(rows, args.report, args.workers))
    print("\nPart 2: median |error| TTFT / TPOT, and TPOT predicted / measured, per setting, version and half")
    print("| setting | version | lines | rows | TTFT | TPOT | TPOT predicted / measured |\n|---|---|---|---:|---:|---:|---|")
    for t in part2:
        ratios = ", ".join(f"{k} {v:.2f}" for k, v in t["tpot_predicted_over_measured"].items())
        print(f"| {t['setting']} | {t['version']} | {t['lines']} | {t['rows']} | {100 * t['ttft_abs_error']:.1f}% | "
              f"{100 * t['tpot_abs_error']:.1f}% | {ratios} |")
    if args.json:
        args.json.write_text(json.dumps({"sample": args.sample, "report": args.report, "mtp": MTP,
                                         "paired": part1, "replays": part2}, indent=1) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
