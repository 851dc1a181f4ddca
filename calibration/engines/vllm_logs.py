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


def read_vllm_iterations(path: Path) -> list[tuple]:
    """Rows (prefill tokens, prefill seqs, prefill cached, decode seqs, decode context, seconds, pairs,
    max context) of the driver's iterations.jsonl (one JSON object per line)."""
    from calibration.engines.tables import iteration_features

    obs = []
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            it = json.loads(line)
            items, t = it["items"], float(it["duration_s"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: line {i}: expected a vLLM replay iteration record with items and "
                             f"duration_s ({exc})") from None
        if not items or t <= 0:
            continue
        if any(len(x) < 4 for x in items):
            raise ValueError(f"{path}: line {i}: items must be [id, tokens, computed before, prompt length]")
        f = iteration_features(items)
        obs.append((f["prefill_tokens"], f["prefill_seqs"], f["prefill_cached_tokens"], f["decode_seqs"],
                    f["decode_context_tokens"], t, f["pairs"], f["max_context"]))
    return obs


def read_vllm_log(path: Path) -> list[tuple]:
    """Rows (as read_vllm_iterations, without KV context, pairs or max context) of vLLM's
    iteration-details log lines (other lines are skipped)."""
    obs = []
    for line in path.read_text(errors="replace").splitlines():
        m = LOG_LINE.search(line)
        if not m:
            continue
        _, ctx_req, ctx_tok, gen_req, _gen_tok, ms = m.groups()
        t = float(ms) / 1e3
        if t <= 0 or (int(ctx_tok) == 0 and int(gen_req) == 0):
            continue
        obs.append((int(ctx_tok), int(ctx_req), 0, int(gen_req), 0, t, None, None))
    if not obs:
        raise ValueError(f"{path}: no 'Iteration(N): ... iteration elapsed time: X ms' lines (vLLM's "
                         "--enable-logging-iteration-details)")
    return obs
