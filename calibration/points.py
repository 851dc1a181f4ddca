"""The raw points CSV written beside a fitted profile: run facts as `# key=value` lines, one row per
measured shape, appended and flushed point by point so an interrupted run resumes where it stopped.

Pure Python (no torch): `capsim fit` and the tests read these files without torch installed.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass, field
from pathlib import Path

FORMAT = "capsim-calibration-points v1"

COLUMNS = [
    "key", "kind", "status",
    # the simulator's iteration features (sim.core.schedulers.base.StepPlan), summed over sequences
    "new_tokens", "pairs", "kv_tokens_read", "num_seqs", "decode_seqs", "decode_kv_tokens",
    "prefill_seqs", "prefill_tokens", "prefill_pairs", "prefill_cached_tokens", "logits", "max_context",
    "padded_seqs",                      # rows actually run (CUDA graphs pad decode batches)
    # time: median and spread of the repeats, seconds, scaled to the whole model
    "repeats", "time_s", "time_min_s", "time_max_s", "time_p25_s", "time_p75_s", "times_s",
    "wall_s",                           # median wall time when another clock was fitted (--clock thread)
    "layers_timed", "time_layers_s",    # median time of the timed layer segment before scaling
    # roofline (sim.models.roofline): modelled FLOPs and bytes (weights + KV read), MFU and MBU
    "flops", "bytes_read", "mfu", "mbu",
    # memory (CUDA): KV tensors of the shape, activation peak above weights + KV, graph pool
    "kv_cache_bytes", "act_peak_bytes", "graph_pool_bytes",
    "host_load",                        # 1-minute load average when the point finished (others' work shows here)
    "note",
]
INT_COLUMNS = {"new_tokens", "pairs", "kv_tokens_read", "num_seqs", "decode_seqs", "decode_kv_tokens",
               "prefill_seqs", "prefill_tokens", "prefill_pairs", "prefill_cached_tokens", "logits",
               "max_context", "padded_seqs", "repeats", "layers_timed", "kv_cache_bytes", "act_peak_bytes",
               "graph_pool_bytes"}
FLOAT_COLUMNS = {"time_s", "time_min_s", "time_max_s", "time_p25_s", "time_p75_s", "time_layers_s", "flops",
                 "bytes_read", "mfu", "mbu", "host_load", "wall_s"}


@dataclass
class PointsFile:
    """A calibration points CSV: its '# key: value' header lines and its rows."""
    meta: dict[str, str] = field(default_factory=dict)
    rows: list[dict] = field(default_factory=list)

    @property
    def ok_rows(self) -> list[dict]:
        return [r for r in self.rows if r.get("status") == "ok"]

    @property
    def done_keys(self) -> set[str]:
        """Keys already measured or recorded as out of memory (skipped on resume)."""
        return {r["key"] for r in self.rows if r.get("status") in ("ok", "oom")}


def _convert(row: dict) -> dict:
    out = {}
    for k, v in row.items():
        if v in (None, ""):
            out[k] = None
        elif k in INT_COLUMNS:
            out[k] = int(float(v))
        elif k in FLOAT_COLUMNS:
            out[k] = float(v)
        else:
            out[k] = v
    return out


def read_points(path: str | os.PathLike) -> PointsFile:
    """Meta and rows of a points CSV; a torn last line (a kill mid-write) is ignored."""
    text = Path(path).read_text()
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    meta, body = {}, []
    for line in text.splitlines(keepends=True):
        if line.startswith("#"):
            key, sep, value = line[1:].strip().partition("=")
            if sep:
                meta[key.strip()] = value.strip()
        else:
            body.append(line)
    rows = []
    for i, r in enumerate(csv.DictReader(io.StringIO("".join(body))), start=1):
        try:
            rows.append(_convert(r))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path}: point {i} (key {r.get('key')!r}): {exc}") from None
    return PointsFile(meta, rows)


def read_meta(path: str | os.PathLike) -> dict[str, str]:
    """Only the `# key=value` lines at the head of a points CSV (the rows are not parsed)."""
    meta = {}
    with Path(path).open() as fh:
        for line in fh:
            if not line.startswith("#"):
                break
            key, sep, value = line[1:].strip().partition("=")
            if sep:
                meta[key.strip()] = value.strip()
    return meta


def start_points(path: str | os.PathLike, meta: dict[str, object]) -> None:
    """Create the file with its meta lines and header (overwrites)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        fh.write(f"# format={FORMAT}\n")
        for k, v in meta.items():
            fh.write(f"# {k}={'' if v is None else v}\n")
        csv.writer(fh).writerow(COLUMNS)


def repair_tail(path: str | os.PathLike) -> None:
    """Drop a torn last line so appends start on a fresh line."""
    path = Path(path)
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as fh:
            fh.truncate(data.rfind(b"\n") + 1)


def append_point(path: str | os.PathLike, row: dict) -> None:
    """Append one row and flush it to disk before the next point starts."""
    unknown = set(row) - set(COLUMNS)
    if unknown:
        raise ValueError(f"unknown points columns: {sorted(unknown)}")
    buf = io.StringIO()
    csv.writer(buf).writerow(["" if row.get(c) is None else _fmt(row[c]) for c in COLUMNS])
    with open(path, "a", newline="") as fh:
        fh.write(buf.getvalue())
        fh.flush()
        os.fsync(fh.fileno())


def _fmt(v) -> str:
    if isinstance(v, float):
        return repr(v)
    return str(v)


class PointsLock:
    """`<points>.lock` holding the writer's pid: two runs appending to one points file would mix their rows."""

    def __init__(self, points_path: Path):
        self.path = points_path.with_name(points_path.name + ".lock")

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                try:
                    pid = int(self.path.read_text().strip() or 0)
                except (OSError, ValueError):
                    pid = 0
                if pid and pid != os.getpid() and _alive(pid):
                    raise ValueError(f"{self.path}: another calibration (pid {pid}) is writing these points; "
                                     "wait for it or use another --out") from None
                self.path.unlink(missing_ok=True)   # stale: its writer is gone
                continue
            with os.fdopen(fd, "w") as fh:
                fh.write(str(os.getpid()))
            return self
        raise ValueError(f"{self.path}: cannot take the lock")

    def __exit__(self, *exc):
        self.path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
