"""Shared prefixes in plain traces: optional `prefix_id` and `prefix_tokens` columns (csv) or keys (jsonl).

A row naming prefix_id P with prefix_tokens k starts its prompt with the first k tokens of the token
stream of P; rows naming the same P share those tokens (a system prompt, a few-shot header), so the
prefix cache can hit them. The rest of the prompt is private. An empty prefix_id (csv) or a missing or
null one (jsonl) means no shared prefix. prefix_tokens is an integer from 1 to the row's prompt_tokens.
P's stream is the named prefix P's (`kv.warm_prefixes` with name P warms it). Both columns, or
neither: a trace without them reads as before.
"""

from __future__ import annotations

import csv
import json
import zlib
from pathlib import Path

import numpy as np

from sim.io.errors import ConfigError

PREFIX_COLUMNS = ("prefix_id", "prefix_tokens")


def _parse(pid, tokens, path: Path, line: int) -> tuple[str, int] | None:
    if pid is None or (isinstance(pid, str) and pid.strip() == ""):
        if tokens not in (None, ""):
            raise ConfigError(f"{path}: line {line}: prefix_tokens given without a prefix_id")
        return None
    if isinstance(pid, bool) or not isinstance(pid, (str, int)):
        raise ConfigError(f"{path}: line {line}: prefix_id: expected a string or an integer, got {pid!r}")
    try:
        k = float(tokens)
    except (TypeError, ValueError):
        raise ConfigError(f"{path}: line {line}: prefix_tokens: expected a positive integer, got {tokens!r}") from None
    if k != int(k) or k < 1:
        raise ConfigError(f"{path}: line {line}: prefix_tokens: expected a positive integer, got {tokens!r}")
    return str(pid).strip(), int(k)


def _csv_rows(path: Path) -> list[tuple[int, dict]] | None:
    with open(path, newline="", encoding="utf-8", errors="replace") as fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        present = [c for c in PREFIX_COLUMNS if c in header]
        if not present:
            return None
        if len(present) == 1:
            raise ConfigError(f"{path}: line 1: column {present[0]!r} needs its partner "
                              f"{[c for c in PREFIX_COLUMNS if c not in present][0]!r}")
        return [(reader.line_num, row) for row in reader if any((v or "").strip() for v in row.values())]


def _jsonl_rows(path: Path) -> list[tuple[int, dict]] | None:
    rows, seen = [], False
    with open(path, encoding="utf-8", errors="replace") as fh:
        for i, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError:
                row = {}                      # the trace reader reports bad lines
            row = row if isinstance(row, dict) else {}
            seen = seen or any(c in row for c in PREFIX_COLUMNS)
            rows.append((i, row))
    return rows if seen else None


def read_prefix_columns(path: str | Path, fmt: str) -> tuple[list, list[int]] | None:
    """Per row, (prefix id, tokens) or None, and each row's line number; None when the trace (csv or
    jsonl) has no prefix columns."""
    path = Path(path)
    if fmt not in ("csv", "jsonl"):
        return None
    rows = _csv_rows(path) if fmt == "csv" else _jsonl_rows(path)
    if rows is None:
        return None
    return ([_parse(r.get("prefix_id"), r.get("prefix_tokens"), path, line) for line, r in rows],
            [line for line, _ in rows])


def prefix_stream_of(pid: str) -> tuple[int, int]:
    """The token stream of prefix `pid` (the same as a named prefix's, sim.workloads.workload.prefix_stream)."""
    return (1, zlib.crc32(pid.encode()))


def prefix_segments(columns: tuple[list, list[int]], prompt_tokens: np.ndarray, idx: np.ndarray,
                    path: Path) -> list[tuple]:
    """Segments of the kept rows `idx` (their prompt lengths in `prompt_tokens`): the shared prefix,
    then the row's private tokens."""
    prefixes, lines = columns
    segs = []
    for j, k in enumerate(idx.tolist()):
        p = int(prompt_tokens[j])
        own = ((0, j), 0, p)
        if prefixes[k] is None:
            segs.append((own,))
            continue
        pid, n = prefixes[k]
        if n > p:
            raise ConfigError(f"{path}: line {lines[k]}: prefix_tokens ({n}) exceeds prompt_tokens ({p})")
        seg = ((prefix_stream_of(pid), 0, n),)
        segs.append(seg + (((0, j), 0, p - n),) if p > n else seg)
    return segs
