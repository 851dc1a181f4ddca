#!/usr/bin/env python
"""SGLang's agg DeepSeek rows from InferenceX replayed under InferenceX's own client and launch flags (a benchmark,
not a test; docs/fidelity.md "The agg rows' provenance, read again").

    python benchmarks/sglang_launch_flags.py ../shared/data/benchmarks/aiconfigurator_silicon_sample.csv \
        --precision fp8 --system b200_sxm > flags.jsonl
    python benchmarks/sglang_launch_flags.py --summary flags.jsonl

The rows: SGLang, agg, DeepSeek-R1 / V3, one card and precision, from InferenceX's collections (db-dump and its two
CSV exports), one row per distinct measurement. Each is replayed four ways:

- `fixed`: the replay's default (the fixed client, SGLang's cohort regime, its launch defaults);
- `sa_bench`: InferenceX's client (sim.published.client: every user at once, 10 requests each, lengths uniform on
  [0.8 L, L]), the engine's launch defaults;
- `sa_bench+recv`: and the receive interval InferenceX's launch scripts set (`--scheduler-recv-interval`, 30 at 16
  users or more, else 10: SemiAnalysisAI/InferenceX benchmarks/single_node/dsr1_fp8_b200.sh and dsr1_fp4_b200.sh);
- `sa_bench+flags`: and the scripts' other limits (FP8 TP8: --max-running-requests 128, --chunked-prefill-size and
  --max-prefill-tokens 32768, --mem-fraction-static 0.82; FP8 TP4: 32, 8192, 0.95, interval 10; FP4: 256, 16384,
  0.85), the MoE table extrapolated past its 16,384 tokens in proportion to the work.

One JSON line per row and way: [line, way, predicted TTFT ms, predicted TPOT ms, skip reason]. `--summary` prints,
per way, the median |TTFT error|, the rows within 20% and the median |TPOT error|, over the rows every way replayed.
Nothing is fitted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np

WAYS = ("fixed", "sa_bench", "sa_bench+recv", "sa_bench+flags")
INFERENCEX = ("db-dump", "source_file=2026-03-25.csv", "source_file=2026-04-06.csv")
MEMORY_FRACTION = 0.88
"""SGLang's mem_fraction_static in the replay (sim.published.engines ENGINES["sglang"])."""


def launch_flags(precision: str, tp: int, users: int) -> dict:
    """InferenceX's SGLang DeepSeek launch limits: max running requests, chunk and prefill tokens, memory fraction,
    receive interval."""
    recv = 30 if users >= 16 else 10
    if precision == "fp8":
        return dict(running=128, chunk=32768, fraction=0.82, recv=recv) if tp >= 8 else \
            dict(running=32, chunk=8192, fraction=0.95, recv=10)
    return dict(running=256, chunk=16384, fraction=0.85, recv=recv)


def _with_flags(row, scenario: dict, card_bytes: float, every: bool) -> dict:
    sc = dict(scenario)
    f = launch_flags(row.precision, sc["parallel"]["tp"], row.concurrency)
    sched = dict(sc["scheduler"], recv_interval=f["recv"])
    if every:
        sched.update(max_num_seqs=f["running"], max_num_batched_tokens=f["chunk"], chunk_tokens=f["chunk"])
        gpus = sc["parallel"]["tp"] * sc["parallel"].get("pp", 1)
        more = (f["fraction"] - MEMORY_FRACTION) * card_bytes * gpus  # the scripts' memory fraction, not the replay's
        sc["kv"] = dict(sc["kv"], budget=int(sc["kv"]["budget"] + more))
        sc["step_time"] = dict(sc["step_time"], allow_extrapolation=True)
    sc["scheduler"] = sched
    return sc


def replay(task) -> list:
    from sim.io.profiles import load_hardware
    from sim.published.predict import build_case, simulate_case
    row, way = task
    case = build_case(row, client="auto" if way == "fixed" else "sa_bench")
    if case.scenario is None:
        return [row.line, way, None, None, case.skipped]
    if "+" in way:
        card = load_hardware(case.scenario["hardware"]).reported_memory_bytes
        case = dataclasses.replace(case, scenario=_with_flags(row, case.scenario, card, way.endswith("flags")))
    out = simulate_case(None, case)
    return [row.line, way, out.get("ttft_ms"), out.get("tpot_ms"), out.get("skipped")]


def rows_of(sample: str, precision: str, system: str) -> list:
    import csv

    from sim.published.rows import read_published
    with open(sample, newline="") as fh:
        source = {r["id"]: r["silicon_data_source"] for r in csv.DictReader(fh)}
    seen, out = set(), []
    for r in read_published(sample):
        if (r.backend, r.mode, r.system, r.precision) != ("sglang", "agg", system, precision) \
                or "DeepSeek" not in r.model_path or not source[r.id].startswith(INFERENCEX):
            continue
        key = (r.isl, r.osl, r.concurrency, r.tp, r.ttft_ms, r.tpot_ms)
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def summary(path: str, sample: str) -> list[dict]:
    import csv
    with open(sample, newline="") as fh:
        meas = {i + 2: (float(r["silicon_ttft_ms"]), float(r["silicon_tpot_ms"]))
                for i, r in enumerate(csv.DictReader(fh))}
    lines = [json.loads(x) for x in open(path) if x.startswith("[")]
    finished: dict[int, set] = {}
    for ln, w, _, _, skip in lines:
        if skip is None:
            finished.setdefault(ln, set()).add(w)
    done = {ln for ln, ways in finished.items() if ways >= set(WAYS)}  # rows every way replayed
    out = []
    for way in WAYS:
        got = [(ln, t, p) for ln, w, t, p, skip in lines if w == way and ln in done]
        e = np.array([t / meas[ln][0] - 1 for ln, t, _ in got])
        tp = np.array([p / meas[ln][1] - 1 for ln, _, p in got])
        out.append({"way": way, "rows": len(got), "ttft": float(np.median(np.abs(e))), "signed": float(np.median(e)),
                    "within_20": int((np.abs(e) <= 0.2).sum()), "tpot": float(np.median(np.abs(tp)))})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sample", help="the silicon sample CSV")
    ap.add_argument("--precision", default="fp8", choices=("fp8", "fp4"))
    ap.add_argument("--system", default="b200_sxm")
    ap.add_argument("--summary", metavar="JSONL", help="summarise an earlier run's output instead of running")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    if args.summary:
        for s in summary(args.summary, args.sample):
            print(f"| {s['way']} | {s['rows']} | {s['ttft']:.1%} ({s['signed']:+.0%}) | {s['within_20']} | "
                  f"{s['tpot']:.1%} |")
        return 0
    rows = rows_of(args.sample, args.precision, args.system)
    print(f"# {len(rows)} rows", file=sys.stderr, flush=True)
    with ProcessPoolExecutor(args.workers) as ex:
        for n, res in enumerate(ex.map(replay, [(r, w) for r in rows for w in WAYS]), 1):
            print(json.dumps(res), flush=True)
            print(f"# {n}/{len(rows) * len(WAYS)}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
