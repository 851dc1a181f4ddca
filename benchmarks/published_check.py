"""Write profiles/ops/published_check.yaml: the ops model's error on published serving runs, per card, engine and
mode, from `capsim validate-published` reports. `capsim run` and its report quote it for a scenario on that
card's tables (sim/io/published_check.py), since an ops model has no fit error of its own.

    S=../shared/data/benchmarks/aiconfigurator_silicon_sample.csv
    capsim validate-published $S --mode agg --out results/published
    capsim validate-published $S --mode disagg --out results/published-disagg
    python benchmarks/published_check.py results/published/report.json results/published-disagg/report.json \
        --out profiles/ops/published_check.yaml

Every report must be a run with the default settings (the replay docs/fidelity.md describes); a row predicted by
two reports is refused. The groups are sim.published.predict.error_summary's, keyed by the card's table set
(sim.published.predict.SYSTEMS).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import subprocess
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sim.io.schema import dump_yaml  # noqa: E402
from sim.published.predict import SYSTEMS, error_summary  # noqa: E402

DEFAULTS = {"requests_per_user": "1 + ceil(16384 / osl), 3 to 6", "start": "cold", "rounds": 10, "mixed": "one_pass",
            "moe_kernels": "engine", "moe_routing": "engine", "mla_kernels": "engine", "all_reduce": "engine", "engine_config": "engine",
            "host_overhead_s": None, "shared_experts_overlap": "engine", "frontend_ms": "engine", "pool_batch": "engine",
            "async_scheduling": "engine", "first_token": "engine", "phases": "engine", "seed": 0,
            "host_per_sequence_s": "engine", "prefill_batches": "engine"}
"""The settings a report must have been run with (validate-published's defaults)."""

DISAGG_DEFAULTS = {"disagg_rounds": "dynamo", "prefill_response": "engine", "frontend_users": "engine",
                   "client": {"agg": "fixed", "disagg": "sa_bench"}}
"""The settings a report with disaggregated rows must have been run with besides DEFAULTS (an agg-only report from
before 2026-12-06 does not state them, nor one from before 2026-12-07 its client; they do not touch its rows)."""


def read_reports(paths: list[Path]) -> tuple[list[dict], list[str]]:
    """The predicted rows of every report (each row once) and the files they replayed."""
    rows, seen, files = [], {}, []
    for path in paths:
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            sys.exit(f"published_check: {path}: cannot read a validate-published report ({exc})")
        if not isinstance(report, dict) or not isinstance(report.get("rows"), list):
            sys.exit(f"published_check: {path}: no 'rows' list; expected a validate-published report.json")
        want = dict(DEFAULTS)
        if any(isinstance(r, dict) and r.get("mode") == "disagg" and "predicted" in r for r in report["rows"]):
            want.update(DISAGG_DEFAULTS)
        off = {k: report.get(k) for k, v in want.items() if report.get(k) != v}
        if off:
            sys.exit(f"{path}: not a run with the default settings: {off}; expected {want}")
        files.append(Path(report["file"]).name)
        for row in report["rows"]:
            if not isinstance(row, dict) or "predicted" not in row:
                continue
            if not {"line", "mode", "system", "backend", "measured"} <= set(row):
                sys.exit(f"{path}: a predicted row without line, mode, system, backend or measured: {row}")
            key = (row["line"], row["mode"])
            if key in seen:
                sys.exit(f"{path}: line {row['line']} ({row['mode']}) is predicted by {seen[key]} too")
            seen[key] = path
            rows.append(row)
    return rows, sorted(set(files))


def check_groups(rows: list[dict]) -> dict[str, list[dict]]:
    """Table set -> [{engine, mode, runs, ttft_/tpot_/e2e_ median and p90 |error|}], cards in SYSTEMS only (e2e_
    where the reports give it)."""
    by = {}
    for s in error_summary(rows):
        card = SYSTEMS.get(s["system"])
        if card is None:
            continue
        g = by.setdefault((card, s["backend"], s["mode"]), {"engine": s["backend"], "mode": s["mode"]})
        metric = s["metric"].removesuffix("_ms")
        if metric not in ("ttft", "tpot", "e2e"):
            continue
        g["runs"] = s["n"]
        g[f"{metric}_median_abs_error"] = round(s["median_abs_error"], 4)
        g[f"{metric}_p90_abs_error"] = round(s["p90_abs_error"], 4)
    out: dict[str, list[dict]] = {}
    order = {"vllm": 0, "sglang": 1, "trtllm": 2}
    for (card, engine, mode), g in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][2], order.get(kv[0][1], 9))):
        out.setdefault(card, []).append({k: g[k] for k in ("engine", "mode", "runs", "ttft_median_abs_error",
                                                           "ttft_p90_abs_error", "tpot_median_abs_error",
                                                           "tpot_p90_abs_error", "e2e_median_abs_error",
                                                           "e2e_p90_abs_error") if k in g})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+", type=Path, help="validate-published report.json files")
    ap.add_argument("--out", type=Path, default=REPO / "profiles" / "ops" / "published_check.yaml")
    ap.add_argument("--commit", help="capsim commit the reports were run at (default: this checkout's HEAD)")
    ap.add_argument("--date", help="date of the run (default: today, UTC)")
    args = ap.parse_args(argv)
    rows, files = read_reports(args.reports)
    commit = args.commit
    if commit is None:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
        if head.returncode != 0:
            sys.exit("published_check: not in a git checkout; give --commit (the capsim commit of the reports)")
        commit = head.stdout.strip()
    doc = {"source": (f"capsim validate-published {', '.join(files)} with its default settings (cold start, "
                      "N = 10 on agg rows; disaggregated ones as their recorded client, InferenceX's SA-Bench: 10 "
                      "requests per user of drawn lengths, round-robin over the workers; each engine's defaults and "
                      "front end; docs/fidelity.md, docs/disaggregation.md); real TTFT / TPOT of "
                      "published vLLM, SGLang and TensorRT-LLM runs (../shared/data/SOURCES.md)"),
           "commit": commit, "date": args.date or _dt.datetime.now(_dt.timezone.utc).date().isoformat(),
           "cards": check_groups(rows)}
    head = "# Written by benchmarks/published_check.py from validate-published reports; do not edit by hand.\n"
    args.out.write_text(head + dump_yaml(doc, sort_keys=False, width=120))
    print(f"wrote {args.out}: {sum(len(v) for v in doc['cards'].values())} groups on {len(doc['cards'])} cards "
          f"from {len(rows):,} predicted runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
