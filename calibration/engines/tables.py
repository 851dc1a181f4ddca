"""An engine replay's records as capsim's tables: requests.csv, iterations.csv and summary.json with
the definitions of docs/metrics.md (latencies from the scheduled arrival; a token's time is the end
of the iteration that produced it; ITL pools every gap of every request)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from sim.api import Result

LATENCY_KEYS = ("ttft_s", "tpot_s", "itl_s", "e2e_s")


def stats(values) -> dict:
    """mean, median, p90, p99, max with numpy's linear interpolation; None when empty (as capsim's)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if not len(v):
        return {"mean": None, "median": None, "p90": None, "p99": None, "max": None}
    p = np.percentile(v, [50, 90, 99])
    return {"mean": float(v.mean()), "median": float(p[0]), "p90": float(p[1]), "p99": float(p[2]),
            "max": float(v.max())}


def iteration_features(items: list) -> dict:
    """Per-iteration features (the columns `capsim fit` reads) from the driver's items
    [id, tokens, computed before, prompt length]: a decode computes one token past its prompt."""
    f = dict(prefill_tokens=0, prefill_seqs=0, prefill_cached_tokens=0, decode_seqs=0, decode_context_tokens=0,
             pairs=0, max_context=0, new_tokens=0, batch_size=len(items))
    for _rid, n, h, prompt in items:
        if n == 1 and h >= prompt:
            f["decode_seqs"] += 1
            f["decode_context_tokens"] += h
        else:
            f["prefill_seqs"] += 1
            f["prefill_tokens"] += n
            f["prefill_cached_tokens"] += h
        f["pairs"] += n * h + n * (n + 1) // 2
        f["max_context"] = max(f["max_context"], h + n)
        f["new_tokens"] += n
    return f


def iterations_table(iterations: list[dict]) -> pd.DataFrame:
    """One row per engine iteration: timing, the fit's features, preemptions, and the items as JSON."""
    rows = []
    for it in iterations:
        row = {k: it.get(k) for k in ("iteration", "start_s", "duration_s", "cpu_s", "wake_s")}
        row.update(iteration_features(it["items"]))
        row["preempted"] = len(it.get("preempted", []))
        row["items"] = json.dumps([x[:3] for x in it["items"]], separators=(",", ":"))
        rows.append(row)
    cols = ["iteration", "start_s", "duration_s", "cpu_s", "wake_s", "prefill_tokens", "prefill_seqs",
            "prefill_cached_tokens", "decode_seqs", "decode_context_tokens", "pairs", "max_context", "new_tokens",
            "batch_size", "preempted", "items"]
    return pd.DataFrame(rows, columns=cols)


def _request_row(i: int, wl, rec: dict | None, admitted: dict) -> dict:
    arrival = float(wl.arrival_s[i])
    row = {"id": i, "status": "unfinished", "arrival_s": arrival, "admitted_s": admitted.get(i, np.nan),
           "first_token_s": np.nan, "finish_s": np.nan, "ttft_s": np.nan, "e2e_s": np.nan, "tpot_s": np.nan,
           "max_itl_s": np.nan, "prompt_tokens": int(wl.prompt_tokens[i]), "output_tokens": 0, "cached_tokens": 0,
           "preemptions": 0}
    if rec is None:
        return row
    t = rec["token_times"]
    row.update(status="finished", first_token_s=t[0], finish_s=t[-1], ttft_s=t[0] - arrival, e2e_s=t[-1] - arrival,
               output_tokens=len(t), cached_tokens=int(rec.get("cached_tokens") or 0),
               preemptions=int(rec.get("preemptions") or 0))
    if len(t) > 1:
        row["tpot_s"] = (t[-1] - t[0]) / (len(t) - 1)
        row["max_itl_s"] = float(np.max(np.diff(t)))
    return row


def measured_result(run, wl) -> Result:
    """capsim's Result (summary, requests, iterations) of an engine replay of workload `wl`."""
    by_id = {int(r["id"]): r for r in run.requests}
    admitted: dict[int, float] = {}
    for it in run.iterations:
        for rid in it.get("new", []):
            admitted.setdefault(int(rid), float(it["start_s"]))
    req = pd.DataFrame([_request_row(i, wl, by_id.get(i), admitted) for i in range(len(wl))])
    its = iterations_table(run.iterations)
    fin = req["status"] == "finished"
    gaps = [g for r in run.requests for g in np.diff(r["token_times"]).tolist()]
    window = float(req.loc[fin, "finish_s"].max() - req["arrival_s"].min()) if fin.any() else 0.0
    summary = {
        "scenario": run.meta.get("scenario"), "engine": "vllm", "complete": run.complete,
        "requests": int(len(req)), "completed": int(fin.sum()), "unfinished": int((~fin).sum()),
        "makespan_s": window,
        "output_throughput_tok_s": float(req.loc[fin, "output_tokens"].sum() / window) if window > 0 else None,
        "request_throughput_rps": float(fin.sum() / window) if window > 0 else None,
        "ttft_s": stats(req.loc[fin, "ttft_s"]), "tpot_s": stats(req.loc[fin, "tpot_s"]), "itl_s": stats(gaps),
        "e2e_s": stats(req.loc[fin, "e2e_s"]), "preemptions": int(sum(len(it.get("preempted", []))
                                                                       for it in run.iterations)),
        "prefix_hit_tokens": int(req["cached_tokens"].sum()), "iterations": int(len(its)),
        "engine_meta": {k: v for k, v in run.meta.items() if k != "traceback"},
    }
    return Result(summary, req, its)
