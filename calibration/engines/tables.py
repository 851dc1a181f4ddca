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


def prefill_completions(iterations: list[dict]) -> list[int]:
    """Per iteration, the prefill sequences that complete their prompt (their last prefill chunk, after
    which each samples a token). A request's length is its prompt plus the tokens it has sampled, which
    an item [id, tokens, computed before, prompt] alone cannot tell after a preemption (recompute covers
    prompt and outputs), so it is tracked across iterations; a request named in `new` starts afresh (so
    pooled logs of several replays, which reuse ids, read right)."""
    length: dict = {}
    out = []
    for it in iterations:
        for rid in it.get("new") or ():
            length.pop(rid, None)
        done = 0
        for rid, n, h, prompt in (x[:4] for x in it["items"]):
            total = length.get(rid, prompt)
            if h + n >= total:
                if not (n == 1 and h >= prompt):   # a decode samples too, but is no prompt completion
                    done += 1
                length[rid] = h + n + 1
        out.append(done)
    return out


def shared_kv_tokens(iterations: list[dict], form: str = "rereads") -> list[int]:
    """Per iteration, the KV tokens its items re-read in prefix-cache hits another item of the iteration reads
    too, counting every reader but the first (sim.core.step.StepPlan.shared_kv_tokens). A request's hits are
    the tokens already computed when it is first scheduled in its replay (the simulator's Request.cached_tokens;
    a replay starts at iteration 0, and pooled replays reuse ids), which prefix they are is its key in the
    iteration's `hit_keys` ([id, key] pairs, `with_hit_keys`); an item [id, tokens, computed before, ...] reads
    min(computed before, hits) of them. Without keys nothing is re-read. With `form` "hits", every hit token read
    counts, first reads included (StepPlan.hit_kv_tokens), keys or not."""
    if form not in ("rereads", "hits"):
        raise ValueError(f"shared-KV form must be 'rereads' or 'hits', got {form!r}")
    hits: dict = {}
    keys: dict = {}
    out = []
    for it in iterations:
        if it.get("iteration") == 0:
            hits.clear()
            keys.clear()
        for rid, key in it.get("hit_keys") or ():
            keys.setdefault(rid, key)
        seen: dict = {}
        shared = 0
        for x in it["items"]:
            h = int(x[2])
            hit = hits.setdefault(x[0], h)
            r, key = (h if h < hit else hit), keys.get(x[0])
            if form == "hits":
                shared += r
            elif r and key is not None:
                m = seen.get(key, 0)
                shared += r if r < m else m
                if r > m:
                    seen[key] = r
        out.append(shared)
    return out


def with_hit_keys(iterations: list[dict], spec: dict) -> list[dict]:
    """The iterations of one replay of `spec` (the driver's requests and their prompt token ids), each given
    `hit_keys`: for every request first scheduled there with tokens already computed (its prefix-cache hits),
    [id, a digest of those prompt tokens] -- the same key for requests hitting the same prefix. In place."""
    import hashlib

    prompts = {int(r["id"]): r["prompt_token_ids"] for r in spec["requests"]}
    seen: set = set()
    for it in iterations:
        if it.get("iteration") == 0:
            seen.clear()
        keys = []
        for x in it["items"]:
            rid, h = int(x[0]), int(x[2])
            if rid in seen:
                continue
            seen.add(rid)
            if h > 0 and rid in prompts:
                data = ",".join(map(str, prompts[rid][:h])).encode()
                keys.append([rid, hashlib.sha1(data).hexdigest()[:16]])
        it["hit_keys"] = keys
    return iterations


def iterations_table(iterations: list[dict], num_blocks: int | None = None) -> pd.DataFrame:
    """One row per engine iteration: timing, the fit's features, preemptions, and the items as JSON;
    capsim's iterations.csv columns too (replica 0, decode_sequences, kv_blocks_in_use: the usable
    blocks, all but vLLM's null block, less the free ones after the step)."""
    rows = []
    for it, done, shared in zip(iterations, prefill_completions(iterations), shared_kv_tokens(iterations)):
        row = {"replica": 0, **{k: it.get(k) for k in ("iteration", "start_s", "duration_s", "cpu_s", "wake_s")}}
        row.update(iteration_features(it["items"]))
        row["prefill_completions"] = done
        row["shared_kv_tokens"] = shared
        row["decode_sequences"] = row["decode_seqs"]
        free = it.get("kv_free_blocks")
        row["kv_blocks_in_use"] = num_blocks - 1 - free if num_blocks is not None and free is not None else None
        row["preempted"] = len(it.get("preempted", []))
        row["items"] = json.dumps([x[:3] for x in it["items"]], separators=(",", ":"))
        rows.append(row)
    cols = ["replica", "iteration", "start_s", "duration_s", "cpu_s", "wake_s", "prefill_tokens", "prefill_seqs",
            "prefill_cached_tokens", "prefill_completions", "shared_kv_tokens", "decode_seqs", "decode_context_tokens", "pairs", "max_context",
            "new_tokens", "batch_size", "decode_sequences", "kv_blocks_in_use", "preempted", "items"]
    return pd.DataFrame(rows, columns=cols)


def _met_slo(row: dict, gaps: np.ndarray, slo, deadline: float) -> bool:
    """Finished and within every bound given (slo.ttft_s, slo.itl_s on the max or p99 gap, slo.e2e_s, the
    request's own deadline), as capsim's Recorder judges."""
    if row["status"] != "finished":
        return False
    if slo is not None and slo.ttft_s is not None and row["ttft_s"] > slo.ttft_s:
        return False
    if slo is not None and slo.itl_s is not None and len(gaps):
        worst = float(np.percentile(gaps, 99)) if slo.itl_stat == "p99" else float(gaps.max())
        if worst > slo.itl_s:
            return False
    limits = [x for x in (getattr(slo, "e2e_s", None), deadline) if x is not None and np.isfinite(x)]
    return not limits or row["e2e_s"] <= min(limits)


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


def measured_result(run, wl, slo=None) -> Result:
    """capsim's Result (summary, requests, iterations) of an engine replay of workload `wl`; `slo` (the
    scenario's) decides which requests are good."""
    by_id = {int(r["id"]): r for r in run.requests}
    admitted: dict[int, float] = {}
    for it in run.iterations:
        for rid in it.get("new", []):
            admitted.setdefault(int(rid), float(it["start_s"]))
    rows = [_request_row(i, wl, by_id.get(i), admitted) for i in range(len(wl))]
    for i, row in enumerate(rows):
        t = by_id[i]["token_times"] if i in by_id else []
        row["met_slo"] = _met_slo(row, np.diff(t), slo, float(wl.deadline_s[i]))
    req = pd.DataFrame(rows)
    its = iterations_table(run.iterations, run.meta.get("num_gpu_blocks"))
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
        "good": int(req["met_slo"].sum()),
        "kv_capacity_blocks": run.meta.get("num_gpu_blocks"), "kv_capacity_bytes": run.meta.get("kv_cache_memory_bytes"),
        "memory_fit": run.meta.get("num_gpu_blocks") is not None,   # the engine started with this KV budget
        "engine_meta": {k: v for k, v in run.meta.items() if k != "traceback"},
    }
    return Result(summary, req, its)
