"""Recorder (plain lists and arrays during the run) and summarize() (numpy at the end).

Definitions follow `vllm bench serve` (docs/metrics.md): TTFT and E2E from the scheduled arrival,
TPOT = (last token - first token) / (outputs - 1) per request, ITL pooled over every gap of every
request, percentiles by linear interpolation.
"""

from __future__ import annotations

import math
import struct
import tempfile
from array import array

import numpy as np

from sim.core.request import FINISHED, Request, Status

REQUEST_COLUMNS = ("id", "replica", "status", "arrival_s", "admitted_s", "first_token_s", "finish_s", "ttft_s", "e2e_s",
                   "tpot_s", "max_itl_s", "prompt_tokens", "output_tokens", "cached_tokens", "prefix_hit_rate", "preemptions",
                   "recomputed_tokens", "kv_waited", "attempts", "met_slo", "correct")
ITERATION_COLUMNS = ("replica", "start_s", "duration_s", "prefill_tokens", "decode_sequences", "pairs", "kv_blocks_in_use",
                     "cached_free_blocks", "host_blocks", "batch_size", "new_tokens", "swap_bytes",
                     "output_tokens")
# what a request's row records as it leaves: REQUEST_COLUMNS but those derived from them in one vectorised pass when
# the rows are read (request_columns: TTFT, E2E, TPOT, the prefix hit rate; the max ITL masked where it is no gap)
RECORDED_COLUMNS = tuple(c for c in REQUEST_COLUMNS if c not in ("ttft_s", "e2e_s", "tpot_s", "prefix_hit_rate"))
STATUS_CODES = {s: i for i, s in enumerate(Status)}
_FINISHED_CODE = STATUS_CODES[Status.FINISHED]
NAN = float("nan")
STRETCH_FIELDS = 9  # explicit rows before, first iteration, iterations, start_s, KV blocks x3, first pairs, decodes
PENDING_ROWS = 1024  # requests that left whose rows wait for one vectorised pass over their decode gaps
PENDING_SPANS = 4096  # decode-set spans whose largest gap waits for that pass (Timeline.decode_gaps)
SPILL_VALUES = 1 << 16  # doubles an output table keeps in memory before moving them to a temporary file
CHUNK_VALUES = 1 << 19  # doubles read back from a spill file at a time when only a few columns are needed
# a row as the bytes of its doubles, appended with one frombytes (array.extend of a tuple converts and grows item by
# item; the packed doubles are the same: both convert each value with float())
_REQUEST_ROW = struct.Struct(f"{len(RECORDED_COLUMNS)}d").pack
_ITERATION_HEAD = struct.Struct(f"{len(ITERATION_COLUMNS) - 1}d").pack  # a row but its last column (output_tokens)
_STRETCH_ROW = struct.Struct(f"{STRETCH_FIELDS}d").pack


class Spilled:
    """A growing array of doubles whose older part lives in an unnamed temporary file: the rows of
    requests.csv and iterations.csv take no memory during a run (they are read back once, at the end).
    Append to `buf`, then call `spill_if_full()`."""

    def __init__(self):
        self.buf = array("d")
        self._file = None
        self._spilled = 0

    def spill_if_full(self) -> None:
        """Move the buffered values to the file once there are SPILL_VALUES of them."""
        if len(self.buf) >= SPILL_VALUES:
            if self._file is None:
                self._file = tempfile.TemporaryFile()
            self.buf.tofile(self._file)
            self._spilled += len(self.buf)
            del self.buf[:]

    def __len__(self) -> int:
        return self._spilled + len(self.buf)

    def chunks(self, values: int):
        """Every value so far, in order, as arrays of at most `values` values (the file's part, then
        the buffer's; whole rows when `values` is a multiple of the row width), read from the file
        piece by piece: a table far larger than memory goes through a few MB at a time."""
        if self._file is not None:
            self._file.seek(0)
            for a in range(0, self._spilled, values):
                out = np.empty(min(values, self._spilled - a))
                self._file.readinto(memoryview(out).cast("B"))
                yield out
            self._file.seek(0, 2)
        tail = np.frombuffer(self.buf, dtype=float)
        for a in range(0, len(tail), values):
            yield tail[a:a + values].copy()

    def rows_at(self, positions: np.ndarray, width: int, gap: int = 4096) -> np.ndarray:
        """Rows `positions` (row r = values r x width ..) of `width` values each, in that order: the
        runs of nearby rows they fall in are read from the file one run at a time."""
        want = np.unique(positions)
        out = np.empty((len(want), width))
        cuts = np.flatnonzero(np.diff(want) > gap) + 1
        for a, b in zip(np.concatenate(([0], cuts)).tolist(), np.concatenate((cuts, [len(want)])).tolist()):
            r0, r1 = int(want[a]), int(want[b - 1]) + 1
            out[a:b] = self._read(r0 * width, r1 * width).reshape(-1, width)[want[a:b] - r0]
        return out[np.searchsorted(want, positions)]

    def _read(self, v0: int, v1: int) -> np.ndarray:
        """Values v0..v1 (from the file, the buffer, or both)."""
        out = np.empty(v1 - v0)
        upto = min(v1, self._spilled)
        if v0 < upto:
            self._file.seek(v0 * 8)
            self._file.readinto(memoryview(out[:upto - v0]).cast("B"))
            self._file.seek(0, 2)
        if v1 > self._spilled:
            a = max(v0, self._spilled)
            out[a - v0:] = np.frombuffer(self.buf, dtype=float)[a - self._spilled:v1 - self._spilled]
        return out

    def numpy(self) -> np.ndarray:
        """Every value so far, in order, as one array (a copy)."""
        tail = np.frombuffer(self.buf, dtype=float)
        if self._file is None:
            return tail.copy()
        self._file.seek(0)
        out = np.empty(len(self))
        self._file.readinto(memoryview(out[:self._spilled]).cast("B"))
        out[self._spilled:] = tail
        self._file.seek(0, 2)
        return out


class Recorder:
    """Collects per-request rows and pooled inter-token gaps of the whole run (all replicas)."""

    def __init__(self, slo, track_request_gaps: bool):
        self.slo = slo
        self._no_slo = slo.ttft_s is None and slo.itl_s is None and slo.e2e_s is None
        self._rows = Spilled()  # one flat row per request, REQUEST_COLUMNS in order (table() reshapes)
        self._left: list[Request] = []  # requests that left, their rows not yet written (see on_leave)
        # pooled ITL: each iteration's gap (its duration, kept by its timeline), weighted by the
        # requests whose previous token came from the iteration before (the timeline's `regular`),
        # plus every other gap on its own (here)
        self.itl_gap = array("d")
        self.timelines: list[Timeline] = []  # every timeline recording into this recorder
        self.track_request_gaps = track_request_gaps
        self._gaps: dict[int, list[float]] = {}
        # Little's law bookkeeping: time integral of the number of requests in the system
        self.in_system = 0
        self.area = 0.0
        self._t_last = 0.0
        self.reject_reasons: list[str] = []

    # ---- population ---------------------------------------------------------------------
    def _advance(self, now_s: float) -> None:
        self.area += self.in_system * (now_s - self._t_last)
        self._t_last = now_s

    def on_enter(self, req: Request, now_s: float) -> None:
        """A request reached the system (Little's-law count)."""
        self.area += self.in_system * (now_s - self._t_last)  # (_advance, inline: once per request)
        self._t_last = now_s
        self.in_system += 1

    def on_leave(self, req: Request, now_s: float) -> None:
        """A request left (finished, rejected, cancelled or failed): its row is recorded."""
        self.area += self.in_system * (now_s - self._t_last)  # (_advance)
        self._t_last = now_s
        if req.reject_reason:
            self.reject_reasons.append(req.reject_reason)
        self.in_system -= 1
        if self.track_request_gaps:  # (its gaps are kept by id: a retry of the same id may come before a flush)
            self._write_rows((req,))
            return
        self._left.append(req)
        if len(self._left) >= PENDING_ROWS:
            self._flush()

    @property
    def first_arrival_s(self) -> float | None:
        """The earliest arrival among the requests recorded so far (every request, once the run is over)."""
        arrival = self.rows.numpy().reshape(-1, len(RECORDED_COLUMNS))[:, RECORDED_COLUMNS.index("arrival_s")]
        return float(arrival.min()) if len(arrival) else None

    @property
    def rows(self) -> Spilled:
        """The request rows so far (RECORDED_COLUMNS, flat), every request that left included."""
        self._flush()
        return self._rows

    def _flush(self) -> None:
        """Write the rows of the requests that left since the last flush, in the order they left, once their
        largest decode gaps are known (Timeline.resolve_gaps)."""
        if self._left:
            for t in self.timelines:
                t.resolve_gaps()
            self._write_rows(self._left)
            self._left.clear()

    def itl_entries(self) -> tuple[np.ndarray, np.ndarray]:
        """The pooled inter-token gaps as (distinct entries, weights): every iteration's duration
        weighted by its regular gaps (where there are any) and every other gap with weight 1."""
        values, weights = [np.frombuffer(self.itl_gap, dtype=float)], [np.ones(len(self.itl_gap), dtype=np.int64)]
        for t in self.timelines:
            w = np.frombuffer(t.regular, dtype=np.dtype(t.regular.typecode))
            some = w > 0
            values.append(np.frombuffer(t.durations, dtype=float)[some])
            weights.append(w[some].astype(np.int64))
        return np.concatenate(values), np.concatenate(weights)

    def add_gaps(self, req: Request, gaps) -> None:
        """Keep `req`'s inter-token gaps when a p99 ITL SLO needs them per request."""
        if self.track_request_gaps:
            self._gaps.setdefault(req.rid, []).extend(gaps)


    # ---- per-request rows -------------------------------------------------------------------
    def met_slo(self, req: Request) -> bool:
        """Whether a finished request met every SLO (TTFT, E2E, its deadline, ITL max or p99)."""
        if req.status is not FINISHED:
            return False
        s = self.slo
        ttft = req.first_token_s - req.arrival_s
        e2e = req.finish_s - req.arrival_s
        if s.ttft_s is not None and ttft > s.ttft_s:
            return False
        if s.e2e_s is not None and e2e > s.e2e_s:
            return False
        if req.deadline_s is not None and e2e > req.deadline_s:
            return False
        if s.itl_s is not None:
            if s.itl_stat == "max":
                itl = req.max_itl_s
            else:
                gaps = self._gaps.get(req.rid, [])
                itl = float(np.percentile(gaps, 99)) if gaps else 0.0
            if itl > s.itl_s:
                return False
        return True

    def _write_rows(self, reqs) -> None:
        """Append the rows of `reqs` (RECORDED_COLUMNS: request_columns derives the others when they are read)."""
        rows, pack, codes, nan = self._rows, _REQUEST_ROW, STATUS_CODES, NAN
        plain = self._no_slo  # (met_slo is whether it finished, unless the request has a deadline)
        frombytes = rows.buf.frombytes
        for req in reqs:
            status = req.status
            done = status is FINISHED
            admitted, first, finish, correct = req.admitted_s, req.first_token_s, req.finish_s, req.correct
            frombytes(pack(
                req.rid,
                -1 if req.replica is None else req.replica,
                _FINISHED_CODE if done else codes[status],
                req.arrival_s,
                nan if admitted is None else admitted,
                nan if first is None else first,
                nan if finish is None else finish,
                req.max_itl_s,
                req.prompt_tokens,
                req.output_tokens,
                req.cached_tokens,
                req.preemptions,
                req.recomputed_tokens,
                req.kv_waited,
                req.attempt,
                done if (plain and req.deadline_s is None) else self.met_slo(req),
                nan if correct is None else correct,
            ))
        if len(rows.buf) >= SPILL_VALUES:
            rows.spill_if_full()
        if self._gaps:
            for req in reqs:
                self._gaps.pop(req.rid, None)

    def table(self) -> dict[str, np.ndarray]:
        """The request rows as columns."""
        return request_columns(self.rows.numpy().reshape(-1, len(RECORDED_COLUMNS)))  # (the property: pending rows first)




def request_columns(recorded: np.ndarray) -> dict[str, np.ndarray]:
    """REQUEST_COLUMNS (name -> column) of recorded rows (RECORDED_COLUMNS, as Recorder._write_rows writes them):
    the derived columns computed as a row would have them in Python, the same floats (one IEEE operation each, on
    the same doubles; NaN where the request has no such value)."""
    cols = np.ascontiguousarray(recorded.T)
    out = {c: cols[k] for k, c in enumerate(RECORDED_COLUMNS)}
    done = out["status"] == _FINISHED_CODE
    out.update(latencies(out, done))
    out["ttft_s"] = out["first_token_s"] - out["arrival_s"]  # (NaN without a first token)
    out["max_itl_s"] = np.where(done & (out["output_tokens"] > 1), out["max_itl_s"], NAN)
    out["prefix_hit_rate"] = out["cached_tokens"] / out["prompt_tokens"]
    return {c: out[c] for c in REQUEST_COLUMNS}


def latencies(columns: dict[str, np.ndarray], done: np.ndarray) -> dict[str, np.ndarray]:
    """TTFT, E2E and TPOT of recorded columns (RECORDED_COLUMNS: name -> values), NaN where `done` (finished)
    is not set; TPOT NaN with fewer than two output tokens."""
    arrival, first, finish, outputs = (columns[c] for c in ("arrival_s", "first_token_s", "finish_s", "output_tokens"))
    tpot = np.full(len(done), NAN)
    np.divide(finish - first, outputs - 1, out=tpot, where=done & (outputs > 1))
    return {"ttft_s": np.where(done, first - arrival, NAN), "e2e_s": np.where(done, finish - arrival, NAN),
            "tpot_s": tpot}


def _pieces(at: np.ndarray, k: np.ndarray, n: int, rows: int):
    """Cut n explicit rows and the stretches among them (stretch j, of k[j] rows, goes before
    explicit row at[j]; at is non-decreasing) into pieces of about `rows` rows in all, so a block's
    expansion stays small. Yields (first explicit row, end, first stretch, end stretch); a stretch is
    never split, and one longer than `rows` makes a piece of its own size."""
    a = s0 = total = 0
    for j, (r, kj) in enumerate(zip(at.tolist(), k.tolist())):
        if total + (r - a) + kj > rows and (r > a or j > s0):  # stretch j starts the next piece
            yield a, r, s0, j
            a, s0, total = r, j, 0
        total += kj
    yield a, n, s0, len(at)


class Timeline:
    """One replica's iterations: their rows, end times, and the token times of their emitters."""

    def __init__(self, recorder: Recorder, replica: int = 0):
        self.rec = recorder
        self.replica = replica
        self.rows = Spilled()        # one flat row per iteration, ITERATION_COLUMNS in order
        self.durations = array("d")  # iteration durations again, sliced for decode-set members' gaps
        self.regular = array("i")    # per iteration: requests whose gap was the whole iteration
        recorder.timelines.append(self)
        self._ends = array("d")
        self._prev_end_s: float | None = None
        self.busy_s = 0.0
        self._stretches = Spilled()  # fast-forwarded iterations, STRETCH_FIELDS each (see _expand())
        self._steady = 0             # fast-forwarded iterations so far (every other one has a row)
        # (bound once: called every iteration; the arrays stay the same objects, a spill empties a buffer in place)
        self._add_row, self._add_duration, self._add_end = self.rows.buf.frombytes, self.durations.append, self._ends.append
        self._track = recorder.track_request_gaps
        self._spans: list = []  # decode-set spans whose largest gap is not yet known (decode_gaps): req, first, last, ..

    # ---- iterations and tokens --------------------------------------------------------------
    def on_iteration(self, start_s: float, end_s: float, plan, blocks: tuple[int, int, int]) -> None:
        """Record an iteration's timing and shape; called before its outcome is committed."""
        duration = end_s - start_s
        # its row but the output tokens, which on_tokens appends once the outcome is known (nothing else writes a
        # row in between: the engine commits at once, and fast-forwarded stretches are recorded before)
        self._add_row(_ITERATION_HEAD(self.replica, start_s, duration, plan.prefill_tokens, plan.decode_seqs, plan.pairs,
                                      blocks[0], blocks[1], blocks[2], plan.num_seqs, plan.new_tokens, plan.swap_bytes))
        self._add_duration(duration)
        self._add_end(end_s)
        self.busy_s += duration

    @property
    def iterations(self) -> int:
        return len(self._ends)

    def table(self) -> dict[str, np.ndarray]:
        """The iteration rows as columns (fast-forwarded stretches expanded in place)."""
        flat = self.rows.numpy().reshape(-1, len(ITERATION_COLUMNS))
        if len(self._stretches):
            flat = self._expand(flat, self._stretches.numpy().reshape(-1, STRETCH_FIELDS))
        return {c: flat[:, k] for k, c in enumerate(ITERATION_COLUMNS)}

    def row_blocks(self, rows: int):
        """The iteration rows in order as 2-D blocks (ITERATION_COLUMNS wide): `rows` explicit rows
        read from the spill file at a time, with the fast-forwarded stretches that fall among them
        put back in place. Together they are exactly table()'s rows, without holding them all."""
        width = len(ITERATION_COLUMNS)
        st = self._stretches.numpy().reshape(-1, STRETCH_FIELDS)
        at = st[:, 0]  # explicit rows recorded before each stretch (non-decreasing)
        lo = r0 = 0
        explicit = len(self.rows) // width
        for values in self.rows.chunks(rows * width):
            flat = values.reshape(-1, width)
            r1 = r0 + len(flat)
            # a stretch recorded after explicit row r - 1 goes before row r: into the block holding r,
            # or into the last block when it came after every explicit row
            hi = len(at) if r1 == explicit else int(np.searchsorted(at, r1, side="left"))
            if hi == lo:
                yield flat
            else:
                yield from self._expanded(flat, st[lo:hi], at[lo:hi] - r0, r0, rows)
            lo, r0 = hi, r1
        if explicit == 0 and len(st):  # only fast-forwarded iterations (no explicit row at all)
            yield from self._expanded(np.empty((0, width)), st, np.zeros(len(st)), 0, rows)

    def decode_only(self) -> tuple[int, np.ndarray, int]:
        """Iterations; the durations of those that computed no prompt token, in row order; their output
        tokens. What the iteration rows say, without expanding the stretches: a row's duration_s is the
        durations log's entry for its iteration, and a fast-forwarded row is a decode-only one."""
        width = len(ITERATION_COLUMNS)
        st = self._stretches.numpy().reshape(-1, STRETCH_FIELDS)
        at, k = st[:, 0].astype(np.int64), st[:, 2].astype(np.int64)
        before = np.concatenate(([0], np.cumsum(k)))
        decode = np.ones(len(self._ends), dtype=bool)
        tokens, r0 = int((k * st[:, 8].astype(np.int64)).sum()), 0
        for values in self.rows.chunks(CHUNK_VALUES - CHUNK_VALUES % width):
            flat = values.reshape(-1, width)
            rows = np.arange(r0, r0 + len(flat))
            prefill = flat[:, 3] > 0  # explicit row r is iteration r + the stretch rows recorded before it
            decode[rows[prefill] + before[np.searchsorted(at, rows[prefill], side="right")]] = False
            tokens += int(flat[~prefill, 12].astype(np.int64).sum())
            r0 += len(flat)
        return len(decode), np.frombuffer(self.durations, dtype=float)[decode], tokens

    def _expanded(self, flat: np.ndarray, st: np.ndarray, at: np.ndarray, first_row: int, rows: int):
        """_expand of explicit rows `flat` (first_row..) with the stretches `st` among them (stretch j
        before row at[j] of flat), in pieces of about `rows` rows."""
        for a, b, s0, s1 in _pieces(at.astype(np.int64), st[:, 2].astype(np.int64), len(flat), rows):
            yield self._expand(flat[a:b], st[s0:s1], first_row + a)

    def _expand(self, flat: np.ndarray, st: np.ndarray, first_row: int = 0) -> np.ndarray:
        """Explicit rows first_row.. (`flat`) with the fast-forwarded stretches `st` (those recorded
        among them) put back in place (vectorised)."""
        row, first, k = st[:, 0].astype(np.int64) - first_row, st[:, 1].astype(np.int64), st[:, 2].astype(np.int64)
        before = np.cumsum(k) - k                                # stretch rows before the stretch
        total = len(flat) + int(k.sum())
        out = np.empty((total, len(ITERATION_COLUMNS)))
        # explicit row r moves down by the rows of the stretches recorded before it
        shift = np.concatenate(([0], np.cumsum(k)))[np.searchsorted(row, np.arange(len(flat)), side="right")]
        out[np.arange(len(flat)) + shift] = flat
        j = np.arange(int(k.sum()), dtype=np.int64) - np.repeat(before, k)  # index within its stretch
        it = np.repeat(first, k) + j                             # iteration index
        count = np.repeat(st[:, 8], k)
        block = np.zeros((len(j), len(ITERATION_COLUMNS)))  # prefill tokens and swap bytes are 0
        block[:, 0] = self.replica
        block[:, 4] = block[:, 9] = block[:, 10] = block[:, 12] = count  # decodes only: one token each
        block[:, 6:9] = np.repeat(st[:, 4:7], k, axis=0)         # KV blocks in use, cached, host
        ends, durations = np.frombuffer(self._ends, dtype=float), np.frombuffer(self.durations, dtype=float)
        # each iteration of a stretch starts when the one before ends; the first where it was told
        block[:, 1] = np.where(j == 0, np.repeat(st[:, 3], k), ends[it - 1])
        block[:, 2] = durations[it]
        block[:, 5] = np.repeat(st[:, 7].astype(np.int64), k) + count.astype(np.int64) * j
        out[np.repeat(row + before, k) + j] = block
        return out

    def end_s(self, index: int) -> float:
        """When iteration `index` ended."""
        return self._ends[index]

    def decode_gaps(self, req: Request, first: int, last: int) -> None:
        """`req` emitted one token in each iteration first..last, each after the iteration before:
        its gaps are those iterations' durations. The largest of them joins `req.max_itl_s` at the next
        resolve_gaps (before its row is written; at once when its gaps are kept one by one)."""
        if self._track:
            gaps = self.durations[first:last + 1]  # a copy: never a view into the growing log
            top = max(gaps)
            if top > req.max_itl_s:
                req.max_itl_s = top
            self.rec.add_gaps(req, gaps.tolist())
            return
        spans = self._spans
        spans += (req, first, last)
        if len(spans) >= 3 * PENDING_SPANS:
            self.resolve_gaps()

    def resolve_gaps(self) -> None:
        """The largest gap of every pending span (decode_gaps) into its request's max_itl_s: one
        np.maximum.reduceat over the iterations they cover, the same floats as a max per span."""
        spans = self._spans
        if not spans:
            return
        first = np.array(spans[1::3], dtype=np.int64)
        last = np.array(spans[2::3], dtype=np.int64)
        lo, hi = int(first.min()), int(last.max()) + 1
        window = np.empty(hi - lo + 1)  # the durations they cover, and one more entry for the last span's end
        window[:-1] = np.frombuffer(self.durations, dtype=float)[lo:hi]  # (copied: the log keeps growing)
        window[-1] = -math.inf
        at = np.empty(2 * len(first), dtype=np.int64)
        at[0::2] = first - lo
        at[1::2] = last + 1 - lo  # span k reduces at[2k] .. at[2k + 1] - 1; the entries between spans are dropped
        for req, top in zip(spans[0::3], np.maximum.reduceat(window, at)[0::2].tolist()):
            if top > req.max_itl_s:
                req.max_itl_s = top
        self._spans = []

    def on_steady_iterations(self, first_start_s: float, durations: list[float], ends: list[float], plan,
                             blocks: tuple[int, int, int], count: int, busy_s: float) -> None:
        """`on_iteration` + `on_tokens` of consecutive fast-forwarded iterations in which only the
        `count` decode-set members emitted (all regular gaps): the first starts at `first_start_s`, each
        lasts durations[i] (its end - its start) and ends at ends[i]; `plan` is already the plan of the
        iteration after the last one (each iteration read `count` more KV tokens than the one before).
        `busy_s` is the replica's busy time after them: this timeline's busy_s with each duration added in
        turn, as on_iteration adds them (the caller sums while it steps)."""
        k = len(durations)
        self.busy_s = busy_s
        self.durations.fromlist(durations)  # (fromlist: half the time of extend's item-by-item growth)
        self._ends.fromlist(ends)
        self.regular.fromlist([count] * k)
        self._prev_end_s = ends[-1]
        first = len(self._ends) - k
        explicit, self._steady = first - self._steady, self._steady + k  # (rows recorded before the stretch)
        # a steady plan: decodes only (no prefill, no swap), decode_seqs = num_seqs = new_tokens = count
        buf = self._stretches.buf
        buf.frombytes(_STRETCH_ROW(explicit, first, k, first_start_s, blocks[0], blocks[1], blocks[2],
                                   plan.pairs - count * k, count))
        if len(buf) >= SPILL_VALUES:
            self._stretches.spill_if_full()

    def on_tokens(self, index: int, start_s: float, end_s: float, outcome) -> None:
        """Token times of an iteration's emitters; decode-set members count as regular gaps."""
        regular = outcome.decode_tokens
        gap_regular = end_s - start_s if self._prev_end_s == start_s else None
        previous = index - 1
        for req in outcome.emitted:
            if req.first_token_s is None:
                req.first_token_s = end_s
            else:
                if req.last_iteration == previous and gap_regular is not None:
                    gap = gap_regular
                    regular += 1
                else:
                    gap = end_s - req.last_token_s
                    self.rec.itl_gap.append(gap)
                if gap > req.max_itl_s:
                    req.max_itl_s = gap
                if self._track:
                    self.rec.add_gaps(req, (gap,))
            req.last_token_s = end_s
            req.last_iteration = index
        self.regular.append(regular)  # its gap is the iteration's duration (end_s - start_s)
        self._prev_end_s = end_s
        rows = self.rows
        rows.buf.append(outcome.output_tokens)  # (the row's last column: on_iteration wrote the others)
        if len(rows.buf) >= SPILL_VALUES:
            rows.spill_if_full()

def stats(values: np.ndarray) -> dict[str, float | None]:
    """mean, median, p90, p99, max with numpy's linear interpolation; None when empty."""
    v = values[~np.isnan(values)] if len(values) else values
    if len(v) == 0:
        return {"mean": None, "median": None, "p90": None, "p99": None, "max": None}
    p = np.percentile(v, [50, 90, 99])
    return {"mean": float(v.mean()), "median": float(p[0]), "p90": float(p[1]), "p99": float(p[2]), "max": float(v.max())}


def _distinct_weights(values: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values, ascending, and the summed weight of each: what np.unique(values,
    return_inverse=True) and a bincount of the weights over the inverse give, without the inverse
    (a third of the memory on a run's millions of gaps)."""
    if np.isnan(values).any():  # np.unique's NaN handling (all NaNs one entry)
        v, inverse = np.unique(values, return_inverse=True)
        return v, np.bincount(inverse.ravel(), weights=weights).astype(np.int64)
    perm = values.argsort(kind="quicksort")  # the sort np.unique makes
    aux = values[perm]
    first = np.empty(len(aux), dtype=bool)
    first[:1] = True
    np.not_equal(aux[1:], aux[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    return aux[starts], np.add.reduceat(weights[perm].astype(np.int64, copy=False), starts)


def weighted_stats(values: np.ndarray, weights: np.ndarray) -> dict[str, float | None]:
    """Exactly `stats(np.repeat(values, weights))` without building the repeated array."""
    if len(values) == 0 or weights.sum() == 0:
        return stats(np.array([]))
    v, w = _distinct_weights(values, weights)  # canonical: independent of entry order
    cum = np.cumsum(w)
    n = int(cum[-1])

    def at(k: int) -> float:  # k-th element (0-based) of the expanded sorted array
        return float(v[np.searchsorted(cum, k + 1)])

    def pct(q: float) -> float:
        pos = (q / 100.0) * (n - 1)
        lo = int(np.floor(pos))
        hi = min(lo + 1, n - 1)
        a, b, t = at(lo), at(hi), pos - lo
        return b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t  # numpy's lerp, bit for bit

    # math.fsum: exactly rounded, so the mean does not depend on how many BLAS threads a dot product gets
    return {"mean": math.fsum((v * w).tolist()) / n, "median": pct(50), "p90": pct(90), "p99": pct(99), "max": float(v[-1])}
