"""requests.csv and iterations.csv as tables read from the run's spill files when needed.

A long run's rows live in temporary files (sim.core.metrics.Spilled). These tables hand them out
a block of rows at a time (`chunks()`), so the summary and the CSV files are made without holding
a whole table in memory; `columns()` builds the whole table when a caller asks for it (a DataFrame,
a figure). Both give the same rows, in the same order, with the same types.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from sim.core.metrics import ITERATION_COLUMNS, RECORDED_COLUMNS, REQUEST_COLUMNS, Status, latencies, request_columns

STATUS_NAMES = [s.value for s in Status]
INT_REQUEST_COLUMNS = ("id", "replica", "prompt_tokens", "output_tokens", "cached_tokens", "preemptions",
                       "recomputed_tokens", "attempts")
FLOAT_ITERATION_COLUMNS = ("start_s", "duration_s", "swap_bytes")
CHUNK_ROWS = 50_000


def request_column(name: str, v: np.ndarray) -> np.ndarray:
    """One requests.csv column from its recorded doubles: integers, status names, flags or floats."""
    if name in INT_REQUEST_COLUMNS:
        return v.astype(np.int64)
    if name == "status":
        return np.array(STATUS_NAMES, dtype=object)[v.astype(np.int64)]
    if name in ("met_slo", "kv_waited"):
        return v.astype(bool)
    return v


def iteration_columns(flat: np.ndarray) -> dict[str, np.ndarray]:
    """iterations.csv's columns of a block of recorded rows (counts as integers)."""
    cols = np.ascontiguousarray(flat.T)  # each column contiguous: faster to format than a strided view
    return {c: (cols[k] if c in FLOAT_ITERATION_COLUMNS else cols[k].astype(np.int64))
            for k, c in enumerate(ITERATION_COLUMNS)}


_STATUS = {s: k for k, s in enumerate(Status)}
_TIMES = ("arrival_s", "first_token_s", "finish_s", "output_tokens")


class RequestTable:
    """requests.csv: the recorder's rows (recorded as requests left) in id order."""

    def __init__(self, recorder):
        self._rows = recorder.rows
        self._width = len(RECORDED_COLUMNS)  # (as recorded: request_columns adds the derived columns)
        self._kept: tuple[int, np.ndarray] | None = None  # (values recorded, _order()) as totals() found them

    def _blocks(self):
        """The recorded rows (RECORDED_COLUMNS) in record order, a block of CHUNK_ROWS at a time."""
        for values in self._rows.chunks(CHUNK_ROWS * self._width):
            yield values.reshape(-1, self._width)

    def _order(self) -> np.ndarray:
        """Record positions in id order (a stable sort: as the whole table sorted by id); totals() leaves it for
        the CSV that follows (kept while no row is added)."""
        if self._kept is not None and self._kept[0] == len(self._rows):
            return self._kept[1]
        ids = [b[:, 0].copy() for b in self._blocks()]  # copies: a view would keep its whole block
        return np.argsort(np.concatenate(ids) if ids else np.empty(0), kind="stable")

    def chunks(self, rows: int | None = None) -> Iterator[dict[str, np.ndarray]]:
        """The table `rows` (default CHUNK_ROWS) rows at a time (each block's rows read from the
        spill file when needed)."""
        rows = rows or CHUNK_ROWS
        order = self._order()
        for a in range(0, len(order), rows):
            block = request_columns(self._rows.rows_at(order[a:a + rows], self._width))
            yield {c: request_column(c, v) for c, v in block.items()}

    def columns(self) -> dict[str, np.ndarray]:
        """The whole table as columns."""
        flat = self._rows.numpy().reshape(-1, self._width)
        block = request_columns(flat[np.argsort(flat[:, 0], kind="stable")])
        return {c: request_column(c, v) for c, v in block.items()}

    def totals(self) -> dict:
        """What the summary needs from the requests, in one pass over the rows: counts and integer
        sums (any order gives the same), the first arrival and last finish, and the finished
        requests' TTFT, TPOT and E2E in id order (their means are summed in that order)."""
        t = {"n": 0, "good": 0, "output_tokens": 0, "kv_waited": 0, "preemptions": 0, "recomputed_tokens": 0,
             "cached_tokens": 0, "served": 0, "served_cached": 0, "served_prompt": 0,
             "first_arrival_s": None, "last_finish_s": None, **{s.value: 0 for s in Status}}
        ids, done_at, lat = [], [], {"ttft_s": [], "tpot_s": [], "e2e_s": []}
        for b in self._blocks():
            c = {name: b[:, k] for k, name in enumerate(RECORDED_COLUMNS)}  # (views: read once or twice each)
            code = c["status"].astype(np.int64)
            counts = np.bincount(code, minlength=len(_STATUS))
            for s, k in _STATUS.items():
                t[s.value] += int(counts[k])
            done = code == _STATUS[Status.FINISHED]
            correct = np.nan_to_num(c["correct"], nan=0.0).astype(bool)
            t["good"] += int((done & correct & c["met_slo"].astype(bool)).sum())
            t["output_tokens"] += int(c["output_tokens"][done].astype(np.int64).sum())
            for name in ("kv_waited", "preemptions", "recomputed_tokens", "cached_tokens"):
                t[name] += int(c[name].astype(np.int64).sum())
            served = ~np.isnan(c["admitted_s"])
            t["served"] += int(served.sum())
            t["served_cached"] += int(c["cached_tokens"][served].astype(np.int64).sum())
            t["served_prompt"] += int(c["prompt_tokens"][served].astype(np.int64).sum())
            t["first_arrival_s"] = _fold(min, t["first_arrival_s"], c["arrival_s"])
            t["last_finish_s"] = _fold(max, t["last_finish_s"], c["finish_s"])
            t["n"] += len(b)
            ids.append(c["id"].copy())
            done_at.append(done)
            for name, v in latencies({n: v[done] for n, v in c.items() if n in _TIMES}, done[done]).items():
                lat[name].append(v)  # the finished rows', in record order
        order = np.argsort(np.concatenate(ids), kind="stable") if ids else np.empty(0, dtype=np.int64)
        self._kept = (len(self._rows), order)
        done = np.concatenate(done_at) if done_at else np.empty(0, dtype=bool)
        # the finished rows in id order: their places among the finished rows, in the order of the whole table
        among = (np.cumsum(done) - 1)[order[done[order]]]
        for name, kept in lat.items():
            t[name] = np.concatenate(kept)[among] if kept else np.empty(0)
        return t

    @property
    def names(self) -> tuple[str, ...]:
        """The column names, in file order."""
        return REQUEST_COLUMNS


def _fold(pick, so_far: float | None, values: np.ndarray) -> float | None:
    """min or max of `so_far` and the non-NaN `values` (None while there is none)."""
    v = values[~np.isnan(values)]
    if not len(v):
        return so_far
    x = float(v.min() if pick is min else v.max())
    return x if so_far is None else pick(so_far, x)


class IterationTable:
    """iterations.csv: every replica's iterations, replica by replica, stretches expanded in place."""

    def __init__(self, timelines: list):
        self._timelines = timelines

    @property
    def timelines(self) -> list:
        """The replicas' timelines, in the table's order."""
        return self._timelines

    def chunks(self, rows: int | None = None) -> Iterator[dict[str, np.ndarray]]:
        """The table in blocks of `rows` (default CHUNK_ROWS) recorded rows, each with the
        fast-forwarded ones among them."""
        rows = rows or CHUNK_ROWS
        for t in self._timelines:
            for block in t.row_blocks(rows):
                yield iteration_columns(block)

    def columns(self) -> dict[str, np.ndarray]:
        """The whole table as columns."""
        parts = list(self.chunks())
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return iteration_columns(np.empty((0, len(ITERATION_COLUMNS))))
        return {c: np.concatenate([p[c] for p in parts]) for c in ITERATION_COLUMNS}

    @property
    def names(self) -> tuple[str, ...]:
        """The column names, in file order."""
        return ITERATION_COLUMNS
