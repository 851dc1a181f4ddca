"""Trace readers: Azure LLM inference 2023 CSV, Mooncake JSONL, plain CSV / JSONL.

Each returns (arrival_s, prompt_tokens, output_tokens) as numpy arrays with arrivals relative to
the trace's first request. A malformed row is a ConfigError naming the file and line.
"""

from __future__ import annotations

import csv
import json
import math
import re
from datetime import datetime
from pathlib import Path

import numpy as np

from sim.io.errors import ConfigError


MAX_TOKENS = 100_000_000  # as sim.io.config.MAX_TOKENS: beyond any real request


def _positive_int(value, path: Path, line: int, field: str) -> int:
    try:
        f = float(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError, OverflowError):
        f = None
    if f is None or not math.isfinite(f) or f != int(f) or f < 1 or f > MAX_TOKENS:
        raise ConfigError(f"{path}: line {line}: {field}: expected a whole number of tokens in 1..{MAX_TOKENS:,}, "
                          f"got {value!r}")
    return int(f)


def _number(value, path: Path, line: int, field: str, unit: str = "seconds") -> float:
    try:
        f = float(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError, OverflowError):
        f = None
    if f is None or not math.isfinite(f) or f < 0 or f > 1e12:
        raise ConfigError(f"{path}: line {line}: {field}: expected a finite number of {unit} in 0..1e12, "
                          f"got {value!r}")
    return f


def _open_text(path: Path):
    """Open a trace as UTF-8 text (a leading byte-order mark, as Excel's 'CSV UTF-8' writes, is skipped); a binary or
    unreadable file is a ConfigError naming it."""
    try:
        return open(path, newline="", encoding="utf-8-sig", errors="strict")
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, expected a trace file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _lines(fh, path: Path):
    try:
        yield from fh
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a UTF-8 text file (byte {exc.start} of a read block); expected a trace") from None


_AZURE_STAMP = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}")
_EPOCH = datetime(1970, 1, 1)


def _azure_time(text: str, path: Path, line: int, field: str = "TIMESTAMP") -> float:
    """'2023-11-16 18:15:46.6805900' (7 fractional digits) -> POSIX seconds, no zone (naive)."""
    head, _, frac = str(text).strip().partition(".")
    try:
        # the usual shape parses in C; anything else goes through strptime (the same rules as before)
        t = datetime.fromisoformat(head) if _AZURE_STAMP.fullmatch(head) else datetime.strptime(head, "%Y-%m-%d %H:%M:%S")
        f = float("0." + frac) if frac else 0.0
    except ValueError:
        raise ConfigError(f"{path}: line {line}: {field}: expected 'YYYY-MM-DD HH:MM:SS.fffffff', got {text!r}") from None
    return (t - _EPOCH).total_seconds() + f


def _read_csv(path: Path, columns: tuple[str, str, str], time_parser) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t, p, o = [], [], []
    with _open_text(path) as fh:
        reader = csv.reader(_lines(fh, path))
        try:
            header = next(reader, None) or []
            missing = [c for c in columns if c not in header]
            if missing:
                raise ConfigError(f"{path}: line 1: missing column(s) {missing}; header is {header}")
            doubled = sorted({c for c in header if header.count(c) > 1})
            if doubled:
                raise ConfigError(f"{path}: line 1: column(s) {doubled} given twice")
            rows = list(reader)
        except csv.Error as exc:
            raise ConfigError(f"{path}: line {reader.line_num}: malformed CSV ({exc})") from None
        at = [header.index(c) for c in columns]
        width = len(header)
        for i, cells in enumerate(rows, start=2):
            if not cells:
                continue
            if len(cells) != width:
                raise ConfigError(f"{path}: line {i}: {len(cells)} cells, but the header has {width} columns")
            t.append(time_parser(cells[at[0]], path, i, columns[0]))
            p.append(_positive_int(cells[at[1]], path, i, columns[1]))
            o.append(_positive_int(cells[at[2]], path, i, columns[2]))
    return np.array(t, dtype=float), np.array(p, dtype=np.int64), np.array(o, dtype=np.int64)


class _DuplicateKey(ValueError):
    """A JSON object with a key twice (json keeps the last silently)."""


def _no_duplicate_keys(pairs: list) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set = set()
        raise _DuplicateKey(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return out


def _read_jsonl(path: Path, keys: tuple[str, str, str], time_scale: float):
    t, p, o, hashes = [], [], [], []
    with _open_text(path) as fh:
        for i, text in enumerate(_lines(fh, path), start=1):
            if not text.strip():
                continue
            try:
                row = json.loads(text, object_pairs_hook=_no_duplicate_keys)
            except _DuplicateKey as exc:
                raise ConfigError(f"{path}: line {i}: key {exc.args[0]!r} given twice") from None
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}: line {i}, column {exc.pos + 1}: invalid JSON ({exc.msg}): "
                                  f"{text.strip()[:80]!r}") from None
            except RecursionError:
                raise ConfigError(f"{path}: line {i}: invalid JSON (nested too deeply)") from None
            if not isinstance(row, dict):
                raise ConfigError(f"{path}: line {i}: expected a JSON object")
            for k in keys:
                if k not in row:
                    raise ConfigError(f"{path}: line {i}: missing key {k!r}")
            t.append(_number(row[keys[0]], path, i, keys[0], "ms" if time_scale == 1e-3 else "seconds") * time_scale)
            p.append(_positive_int(row[keys[1]], path, i, keys[1]))
            o.append(_positive_int(row[keys[2]], path, i, keys[2]))
            hashes.append(_hash_ids(row.get("hash_ids"), path, i))
    return np.array(t, dtype=float), np.array(p, dtype=np.int64), np.array(o, dtype=np.int64), hashes


def _hash_ids(value, path: Path, line: int) -> list | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in value):
        raise ConfigError(f"{path}: line {line}: hash_ids: expected a list of integers, got {str(value)[:60]}")
    return value


def _line_of_row(path: Path, k: int, header: bool) -> int:
    """The line number of data row k (0-based) as the readers count rows: blank lines are not rows."""
    with _open_text(path) as fh:
        n = -1
        for i, text in enumerate(_lines(fh, path), start=1):
            if (header and i == 1) or not text.strip():
                continue
            n += 1
            if n == k:
                return i
    raise AssertionError(f"{path}: no data row {k}")


def read_trace(path: str | Path, fmt: str):
    """Returns arrival_s (relative to the first row), prompt_tokens, output_tokens."""
    t, p, o, _ = read_trace_with_blocks(path, fmt)
    return t, p, o


def read_trace_with_blocks(path: str | Path, fmt: str):
    """Like read_trace, plus the per-request block hash ids of a Mooncake trace (None otherwise)."""
    path = Path(path)
    hashes = None
    if not path.exists():
        raise ConfigError(f"{path}: trace file not found")
    if path.suffix == ".parquet":
        raise ConfigError(f"{path}: Parquet traces are not read; give a CSV or JSONL file (format: {fmt})")
    if fmt == "azure":
        t, p, o = _read_csv(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"), _azure_time)
    elif fmt == "csv":
        t, p, o = _read_csv(path, ("arrival_s", "prompt_tokens", "output_tokens"), _number)
    elif fmt == "mooncake":
        t, p, o, hashes = _read_jsonl(path, ("timestamp", "input_length", "output_length"), 1e-3)
    elif fmt == "jsonl":
        t, p, o, _ = _read_jsonl(path, ("arrival_s", "prompt_tokens", "output_tokens"), 1.0)
    else:
        raise ConfigError(f"{path}: unknown trace format {fmt!r}; known: azure, mooncake, csv, jsonl")
    if len(t) == 0:
        raise ConfigError(f"{path}: trace has no rows")
    if np.any(np.diff(t) < 0):
        line = _line_of_row(path, int(np.argmax(np.diff(t) < 0)) + 1, header=fmt in ("azure", "csv"))
        raise ConfigError(f"{path}: line {line}: arrival time goes backwards; traces must be sorted by time")
    return t - t[0], p, o, hashes
