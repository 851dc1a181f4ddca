"""vLLM's per-iteration records as `capsim fit` rows (calibration/logs.py turns them into observations).

Two formats:
- `vllm`: the replay driver's iterations.jsonl (calibration/engines/vllm_driver.py): per iteration its
  duration and, per scheduled request, [id, tokens, computed before, prompt length] from vLLM's own
  SchedulerOutput -- every feature the linear and efficiency models use, KV context included.
- `vllm-log`: the lines vLLM logs with `--enable-logging-iteration-details` (vLLM 0.32,
  vllm/v1/metrics/loggers.py): "Iteration(N): C context requests, T context tokens, G generation
  requests, U generation tokens, iteration elapsed time: X ms, ...". They carry no KV context, so
  the per-KV-token and per-pair terms are fitted as if every prompt chunk started at position 0 and
  decodes read no context (say so in the profile; prefer the `vllm` format). The elapsed time is
  only meaningful with vLLM's multiprocess engine (in-process it does not time the forward pass).
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from pathlib import Path

LOG_LINE = re.compile(r"Iteration\((\d+)\): (\d+) context requests, (\d+) context tokens, (\d+) generation requests, "
                      r"(\d+) generation tokens, iteration elapsed time: ([0-9.]+) ms")


def sniff(path: Path) -> str | None:
    """'vllm' for a driver iterations.jsonl, 'vllm-log' for a log with iteration-details lines, else None."""
    try:
        head = path.open(errors="replace").read(65536)
    except OSError:
        return None
    first = head.lstrip().split("\n", 1)[0]
    if first.startswith("{") and '"items"' in first and '"duration_s"' in first:
        return "vllm"
    return "vllm-log" if LOG_LINE.search(head) else None


def read_vllm_iterations(path: Path, shape_entries: int | None = None, shared_kv_form: str = "rereads") -> list[tuple]:
    """Rows (prefill tokens, prefill seqs, prefill cached, decode seqs, decode context, seconds, pairs,
    max context, prompts completed, shape miss, KV tokens re-read in prefix-cache hits) of the driver's
    iterations.jsonl (one JSON object per line); see `iteration_rows`. Records without `hit_keys` take them
    from the replay's spec.json beside the log (one replay only: pooled replays must carry their own)."""
    records = []
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            it = json.loads(line)
            items, t = it["items"], float(it["duration_s"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: line {i}: expected a vLLM replay iteration record with items and "
                             f"duration_s ({exc})") from None
        if not isinstance(items, list) or any(not isinstance(x, list) or len(x) < 4 for x in items):
            raise ValueError(f"{path}: line {i}: items must be [id, tokens, computed before, prompt length]")
        records.append({"items": items, "duration_s": t, "new": it.get("new") or (),
                        "iteration": it.get("iteration"), "hit_keys": it.get("hit_keys")})
    spec = path.parent / "spec.json"
    if (not any(r["hit_keys"] is not None for r in records) and spec.exists()
            and sum(r["iteration"] == 0 for r in records) <= 1):   # one replay, beside its spec: which prefixes
        from calibration.engines.tables import with_hit_keys
        with_hit_keys(records, json.loads(spec.read_text()))
    return iteration_rows(records, shape_entries, shared_kv_form)


def iteration_rows(iterations: list[dict], shape_entries: int | None = None, shared_kv_form: str = "rereads") -> list[tuple]:
    """`capsim fit` rows of replay iterations, in the order they ran (several replays may follow each other;
    each starts at iteration 0). Prompts completed need the order (calibration.engines.tables.prefill_completions);
    so does the shape miss: with `shape_entries` (the engine's kernel cache, sim.io.profiles.ShapeCache), 1
    when the iteration's token count was not among the last `shape_entries` distinct counts of its replay. A
    request's prefix-cache hits and their re-reads (or, `shared_kv_form` "hits", every hit token read):
    calibration.engines.tables.shared_kv_tokens."""
    from calibration.engines.tables import iteration_features, prefill_completions, shared_kv_tokens

    kept: OrderedDict[int, None] = OrderedDict()
    rows = []
    for it, done, shared in zip(iterations, prefill_completions(iterations),
                                shared_kv_tokens(iterations, shared_kv_form)):
        items, t = it["items"], float(it["duration_s"])
        if it.get("iteration") == 0:
            kept.clear()   # a new engine: its kernel cache starts empty
        miss = 0
        if shape_entries and items:
            n = sum(int(x[1]) for x in items)
            if n in kept:
                kept.move_to_end(n)
            else:
                miss, kept[n] = 1, None
                if len(kept) > shape_entries:
                    kept.popitem(last=False)
        if not items or t <= 0:
            continue
        f = iteration_features(items)
        rows.append((f["prefill_tokens"], f["prefill_seqs"], f["prefill_cached_tokens"], f["decode_seqs"],
                     f["decode_context_tokens"], t, f["pairs"], f["max_context"], done, miss, shared))
    return rows


def read_vllm_log(path: Path) -> list[tuple]:
    """Rows (as read_vllm_iterations, without KV context, pairs, max context, completions -- a context
    request's chunk may or may not end its prompt -- or shape misses) of vLLM's iteration-details log lines
    (other lines are skipped)."""
    obs = []
    for line in path.read_text(errors="replace").splitlines():
        m = LOG_LINE.search(line)
        if not m:
            continue
        _, ctx_req, ctx_tok, gen_req, _gen_tok, ms = m.groups()
        t = float(ms) / 1e3
        if t <= 0 or (int(ctx_tok) == 0 and int(gen_req) == 0):
            continue
        obs.append((int(ctx_tok), int(ctx_req), 0, int(gen_req), 0, t, None, None, None, 0))
    if not obs:
        raise ValueError(f"{path}: no 'Iteration(N): ... iteration elapsed time: X ms' lines (vLLM's "
                         "--enable-logging-iteration-details)")
    return obs
