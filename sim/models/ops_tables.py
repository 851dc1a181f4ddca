"""Measured kernel tables (profiles/ops/<card>/) and their interpolation, for the `ops` step-time model.

One folder per card, written by `capsim profile import-ops` from NVIDIA AIConfigurator's silicon
database (profiles/ops/README.md names the source of every file):

- gemm_<dtype>.csv[.gz]: ``m,n,k,latency_us``, Y = X(m x k) W(n x k)^T;
- context_attention.csv[.gz]: ``batch,seq_len,heads,kv_heads,head_dim,latency_us`` (prefill, no cached prefix);
- generation_attention.csv[.gz]: ``batch,kv_len,heads,kv_heads,head_dim,latency_us`` (one new token per sequence);
- nccl.csv: ``op,gpus,bytes,latency_us`` (all_reduce, all_gather of FP16 messages, in one node).
- all_reduce_<engine>.csv: the same columns, an engine's own all-reduce (vllm, sglang, trtllm).

Interpolation rules (stated once, used everywhere):

- every table is first made monotone: a kernel for a larger shape never costs less than a smaller one
  could (the smaller one can always be padded up), i.e. each point becomes the minimum over the points
  at least as large in every axis;
- GEMM: piecewise power law in m (log-log between measured m), bilinear in (n, k) (exact for
  t = a + b n + c k + d n k); n or k beyond the grid continues the last cell's bilinear form (one kernel: its
  fixed cost once, then the cost per column and row measured at the grid's edge; never below the grid's corner,
  and a larger m never costs less). Until 2026-12-06 such a GEMM was split into equal table-sized pieces, each
  paying the kernel's fixed cost: a composed MoE layer's experts (one grouped GEMM of up to 1.8 million columns
  when experts are split eight ways) paid it 28 times (docs/ops.md);
  n or k below the grid costs the grid's smallest (an upper bound);
- attention: log-log bilinear in (batch, length); heads between measured head counts linear in heads;
- collectives: log-log in message bytes; below the smallest message, the smallest message's time; above the
  largest, the largest's time in proportion to the bytes. Every table's largest message is in the bandwidth
  regime already (doubling it takes 1.87-1.95x the time, pipeline sends 0.97x the bytes' ratio), so the line
  through it is the bus bandwidth it measured, a bound within a few percent: a prefill pass of 8,192 tokens of a
  70B model sends 134 MB between pipeline stages, twice the largest send measured.
Beyond the measured m, batch or length a lookup raises `OutOfRange`; the step-time model turns
that into an error (or, with allow_extrapolation, a warning and a cost proportional to the work).
"""

from __future__ import annotations

import bisect
import csv
import gzip
import io
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from sim.io.errors import ConfigError
from sim.io.profiles import profiles_dir

GEMM_COLUMNS = ("m", "n", "k", "latency_us")
CONTEXT_COLUMNS = ("batch", "seq_len", "heads", "kv_heads", "head_dim", "latency_us")
GENERATION_COLUMNS = ("batch", "kv_len", "heads", "kv_heads", "head_dim", "latency_us")
NCCL_COLUMNS = ("op", "gpus", "bytes", "latency_us")
NCCL_OPS = ("all_reduce", "all_gather", "alltoall", "send_recv")  # the last two: nccl_parallel.csv (sim.models.parallel_ops)


class OutOfRange(Exception):
    """A lookup beyond the measured grid; `scale` extrapolates proportionally to the work."""

    def __init__(self, what: str, value: float, limit: float, at_limit_s: float, scale: float):
        self.what, self.value, self.limit = what, value, limit
        self.extrapolated_s = at_limit_s * scale
        super().__init__(f"{what} {value:.6g} is beyond the measured range (largest {limit:.6g})")


def ops_dir() -> Path:
    """profiles/ops of this checkout (or of $CAPSIM_PROFILES)."""
    return profiles_dir() / "ops"


def known_table_sets() -> list[str]:
    """Card folders under profiles/ops that hold kernel tables."""
    d = ops_dir()
    return sorted(p.name for p in d.iterdir() if p.is_dir()) if d.is_dir() else []


# ---------------------------------------------------------------------------------------------
# Reading CSV tables with errors that name the file, line and column


def _open_text(path: Path):
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def find_table(folder: Path, stem: str) -> Path | None:
    """`stem`.csv or `stem`.csv.gz in `folder`, whichever exists."""
    for name in (f"{stem}.csv", f"{stem}.csv.gz"):
        if (folder / name).exists():
            return folder / name
    return None


def read_table(path: Path, columns: tuple[str, ...], text_columns: tuple[str, ...] = ()) -> dict[str, list]:
    """Read a CSV whose header is exactly `columns`; numbers must be finite and latencies positive.
    Every problem raises ConfigError naming the file, the line and the column."""
    try:
        fh = _open_text(path)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from None
    out: dict[str, list] = {c: [] for c in columns}
    with fh:
        try:
            rows = csv.reader(fh)
            header = next(rows, None)
            if header is None or tuple(h.strip() for h in header) != columns:
                raise ConfigError(f"{path}: line 1: header must be {','.join(columns)}, got "
                                  f"{','.join(header) if header else 'nothing'}")
            for line, row in enumerate(rows, start=2):
                if len(row) != len(columns):
                    raise ConfigError(f"{path}: line {line}: expected {len(columns)} columns "
                                      f"({','.join(columns)}), got {len(row)}")
                for col, text in zip(columns, row):
                    out[col].append(text if col in text_columns else _number(path, line, col, text))
        except (OSError, EOFError, UnicodeDecodeError, csv.Error) as exc:
            raise ConfigError(f"{path}: unreadable table ({exc})") from None
    if not out[columns[0]]:
        raise ConfigError(f"{path}: no rows")
    return out


def _number(path: Path, line: int, col: str, text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ConfigError(f"{path}: line {line}, column {col}: expected a number, got {text!r}") from None
    if not math.isfinite(v) or (col == "latency_us" and v <= 0) or v < 0:
        want = "a positive latency" if col == "latency_us" else "a finite non-negative number"
        raise ConfigError(f"{path}: line {line}, column {col}: expected {want}, got {text!r}")
    return v


# ---------------------------------------------------------------------------------------------
# Grids


def _suffix_min(a: np.ndarray) -> np.ndarray:
    """Minimum over all points at least as large in every axis (missing points are +inf)."""
    for ax in range(a.ndim):
        a = np.flip(np.minimum.accumulate(np.flip(a, ax), axis=ax), ax)
    return a


def _grid(path: Path, axes: list[list[float]], keys: list[tuple], values: list[float],
          fill_first_axis: bool = False) -> np.ndarray:
    """Dense array over the axes' cartesian grid, duplicates averaged, monotone. Holes take the
    smallest larger measured point; with `fill_first_axis` (attention: large batches of long
    sequences were not measured; GEMM: some cards lack the largest shapes) a hole first takes the
    next smaller point of the first axis scaled by the ratio (work is linear in batch and in m)."""
    index = [{v: i for i, v in enumerate(ax)} for ax in axes]
    total = np.zeros([len(ax) for ax in axes])
    count = np.zeros_like(total)
    for key, v in zip(keys, values):
        pos = tuple(ix[k] for ix, k in zip(index, key))
        total[pos] += v
        count[pos] += 1
    grid = np.where(count > 0, total / np.maximum(count, 1), np.inf)
    if fill_first_axis:
        for i in range(1, grid.shape[0]):
            hole = ~np.isfinite(grid[i])
            grid[i][hole] = grid[i - 1][hole] * (axes[0][i] / axes[0][i - 1])
    grid = _suffix_min(grid)
    if not np.isfinite(grid).all():
        hole = tuple(ax[i] for ax, i in zip(axes, np.argwhere(~np.isfinite(grid))[0]))
        raise ConfigError(f"{path}: no measurement at {hole} nor at any larger shape; the grid must be complete "
                          "at its upper corner")
    return grid


def _bracket(xs: list[float], x: float) -> tuple[int, float]:
    """Index i and weight w with x = xs[i] + w (xs[i+1] - xs[i]) in log space; x inside [xs[0], xs[-1]]."""
    if len(xs) == 1:
        return 0, 0.0
    i = min(max(bisect.bisect_right(xs, x) - 1, 0), len(xs) - 2)
    lo, hi = xs[i], xs[i + 1]
    return i, (math.log(x) - math.log(lo)) / (math.log(hi) - math.log(lo))


def _loglog(y0: float, y1: float, w: float) -> float:
    if y0 == y1:
        return y0
    y = math.exp(math.log(y0) + w * (math.log(y1) - math.log(y0)))
    return min(max(y, min(y0, y1)), max(y0, y1))  # rounding never leaves the bracket


def _bilinear(xs, ys, grid, x, y) -> float:
    """Log-log bilinear interpolation inside the grid (x and y already inside the ranges)."""
    i, wx = _bracket(xs, x)
    j, wy = _bracket(ys, y)
    i1, j1 = min(i + 1, len(xs) - 1), min(j + 1, len(ys) - 1)
    a = _loglog(grid[i, j], grid[i1, j], wx)
    b = _loglog(grid[i, j1], grid[i1, j1], wx)
    return _loglog(a, b, wy)


# ---------------------------------------------------------------------------------------------
# GEMM


class GemmTable:
    """GEMM latency (s) for (m, n, k); see the module docstring for the rules."""

    def __init__(self, path: Path):
        t = read_table(path, GEMM_COLUMNS)
        self.path = path
        self.ms = sorted(set(t["m"]))
        self.ns = sorted(set(t["n"]))
        self.ks = sorted(set(t["k"]))
        keys = list(zip(t["m"], t["n"], t["k"]))
        # the largest GEMMs were not measured on every card: a hole takes the next smaller m scaled by m
        self.grid = _grid(path, [self.ms, self.ns, self.ks], keys, [v * 1e-6 for v in t["latency_us"]],
                          fill_first_axis=True)

    def curve(self, n: float, k: float) -> list[float]:
        """Latency over the m grid for one (n, k): bilinear in n and k, the last cell's bilinear form continued
        beyond the grid (never below the grid's corner there)."""
        n, k = max(n, self.ns[0]), max(k, self.ks[0])
        i, wn = self._linear_bracket(self.ns, n)
        j, wk = self._linear_bracket(self.ks, k)
        i1, j1 = min(i + 1, len(self.ns) - 1), min(j + 1, len(self.ks) - 1)
        g = self.grid
        plane = ((1 - wn) * (1 - wk) * g[:, i, j] + wn * (1 - wk) * g[:, i1, j]
                 + (1 - wn) * wk * g[:, i, j1] + wn * wk * g[:, i1, j1])
        if wn > 1 or wk > 1:  # each m's own slope: keep the grid's order (a larger m never costs less)
            plane = np.maximum.accumulate(np.maximum(plane, g[:, i1, j1]))
        return [float(v) for v in plane]

    @staticmethod
    def _linear_bracket(xs: list[float], x: float) -> tuple[int, float]:
        if len(xs) == 1:
            return 0, 0.0
        i = min(max(bisect.bisect_right(xs, x) - 1, 0), len(xs) - 2)
        return i, (x - xs[i]) / (xs[i + 1] - xs[i])

    def at(self, m: float, n: float, k: float) -> float:
        """One GEMM's latency in seconds (raises OutOfRange beyond the largest measured m)."""
        return MCurve(self.ms, self.curve(n, k), f"{self.path.name}: GEMM m").at(m)


class MCurve:
    """A latency curve over measured m (tokens): power law between points, proportional beyond."""

    def __init__(self, ms: list[float], ts: list[float], what: str):
        self.ms, self.ts, self.what = ms, ts, what

    def at(self, m: float) -> float:
        """Latency at m tokens: the first point's below it, OutOfRange beyond the last."""
        ms, ts = self.ms, self.ts
        if m <= ms[0]:
            return ts[0]
        if m > ms[-1]:
            raise OutOfRange(self.what, m, ms[-1], ts[-1], m / ms[-1])
        i, w = _bracket(ms, m)
        return _loglog(ts[i], ts[i + 1], w)


# ---------------------------------------------------------------------------------------------
# Attention


@dataclass
class AttentionSlice:
    """Latency (s) over (batch, length) for one (heads, kv_heads, head_dim) per GPU."""

    batches: list[float]
    lengths: list[float]
    grid: np.ndarray
    what: str
    work_power: float
    """Work grows as length^work_power (2: prefill pairs, 1: decode KV reads), for extrapolation."""

    def at(self, batch: float, length: float) -> float:
        """Interpolated latency; OutOfRange beyond the largest measured batch or length."""
        b, n = max(batch, self.batches[0]), max(length, self.lengths[0])
        scale = 1.0
        if b > self.batches[-1]:
            scale *= b / self.batches[-1]
        if n > self.lengths[-1]:
            scale *= (n / self.lengths[-1]) ** self.work_power
        t = _bilinear(self.batches, self.lengths, self.grid, min(b, self.batches[-1]), min(n, self.lengths[-1]))
        if scale > 1.0:
            what = "batch" if b > self.batches[-1] else "length"
            value, limit = (b, self.batches[-1]) if what == "batch" else (n, self.lengths[-1])
            raise OutOfRange(f"{self.what} {what}", value, limit, t, scale)
        return t


class AttentionTable:
    """Context (prefill) or generation (decode) attention latencies by shape."""

    def __init__(self, path: Path, generation: bool):
        cols = GENERATION_COLUMNS if generation else CONTEXT_COLUMNS
        self.path, self.generation = path, generation
        self.length_col = cols[1]
        t = read_table(path, cols)
        self.rows: dict[tuple, tuple[list, list, list]] = {}
        for b, n, h, kv, d, us in zip(*(t[c] for c in cols)):
            r = self.rows.setdefault((int(h), int(kv), int(d)), ([], [], []))
            r[0].append(b)
            r[1].append(n)
            r[2].append(us * 1e-6)
        self._slices: dict[tuple, AttentionSlice] = {}

    def _exact(self, key: tuple) -> AttentionSlice:
        if key not in self._slices:
            bs, ns, ts = self.rows[key]
            batches, lengths = sorted(set(bs)), sorted(set(ns))
            grid = _grid(self.path, [batches, lengths], list(zip(bs, ns)), ts, fill_first_axis=True)
            kind = "generation attention" if self.generation else "context attention"
            self._slices[key] = AttentionSlice(batches, lengths, grid, f"{self.path.name}: {kind}",
                                               1.0 if self.generation else 2.0)
        return self._slices[key]

    def shape(self, heads: int, kv_heads: int, head_dim: int) -> "ScaledSlice":
        """The slice for these per-GPU heads: measured exactly, between two measured head counts
        (linear in heads), or scaled from the largest measured KV-head count (linear in KV heads)."""
        if (heads, kv_heads, head_dim) in self.rows:
            return ScaledSlice([(1.0, self._exact((heads, kv_heads, head_dim)))])
        same = sorted(h for (h, kv, d) in self.rows if kv == kv_heads and d == head_dim)
        if same:
            lo = [h for h in same if h <= heads]
            hi = [h for h in same if h >= heads]
            if lo and hi:
                h0, h1 = lo[-1], hi[0]
                w = (heads - h0) / (h1 - h0)
                return ScaledSlice([(1 - w, self._exact((h0, kv_heads, head_dim))),
                                    (w, self._exact((h1, kv_heads, head_dim)))])
            h = hi[0] if hi else lo[-1]
            return ScaledSlice([(heads / h, self._exact((h, kv_heads, head_dim)))])
        kvs = sorted(kv for (h, kv, d) in self.rows if d == head_dim and kv < kv_heads and kv_heads % kv == 0
                     and (heads * kv // kv_heads, kv, d) in self.rows)
        if not kvs:
            have = sorted({d for (_, _, d) in self.rows})
            raise ConfigError(f"{self.path}: no {self.length_col.split('_')[0]} attention measurement for "
                              f"{heads} heads / {kv_heads} KV heads / head_dim {head_dim} per GPU, nor one to "
                              f"scale from (head_dim measured: {have})")
        kv = kvs[-1]
        return ScaledSlice([(kv_heads / kv, self._exact((heads * kv // kv_heads, kv, head_dim)))])


@dataclass
class ScaledSlice:
    """A weighted sum of measured slices (interpolation or scaling in heads)."""

    parts: list[tuple[float, AttentionSlice]]

    @property
    def largest_batch(self) -> float:
        """The largest batch every part measures."""
        return min(s.batches[-1] for _, s in self.parts)

    def at(self, batch: float, length: float) -> float:
        """Latency in seconds; OutOfRange carries the proportionally extrapolated value."""
        total, extrapolated, err = 0.0, 0.0, None
        for w, s in self.parts:
            try:
                v = s.at(batch, length)
                total += w * v
                extrapolated += w * v
            except OutOfRange as exc:
                err = exc
                extrapolated += w * exc.extrapolated_s
        if err is not None:
            err.extrapolated_s = extrapolated
            raise err
        return total


# ---------------------------------------------------------------------------------------------
# Collectives


class NcclTable:
    """Collective latency (s) by op, GPU count and message bytes."""

    def __init__(self, path: Path):
        t = read_table(path, NCCL_COLUMNS, text_columns=("op",))
        self.path = path
        series: dict[tuple[str, int], dict[float, float]] = {}
        for line, (op, g, b, us) in enumerate(zip(t["op"], t["gpus"], t["bytes"], t["latency_us"]), start=2):
            if op not in NCCL_OPS:
                raise ConfigError(f"{path}: line {line}, column op: expected one of {', '.join(NCCL_OPS)}, got {op!r}")
            series.setdefault((op, int(g)), {})[b] = us * 1e-6
        self.series = {}
        for key, pts in series.items():
            xs = sorted(pts)
            ys = list(np.flip(np.minimum.accumulate(np.flip(np.array([pts[x] for x in xs])))))
            self.series[key] = (xs, ys)

    def gpus(self, op: str) -> list[int]:
        """GPU counts measured for `op`."""
        return sorted(g for (o, g) in self.series if o == op)

    def at(self, op: str, gpus: int, nbytes: float) -> float:
        """One collective's latency in seconds."""
        if (op, gpus) not in self.series:
            raise ConfigError(f"{self.path}: no {op} measurement on {gpus} GPUs (measured: {self.gpus(op)})")
        xs, ys = self.series[(op, gpus)]
        if nbytes <= xs[0]:
            return ys[0]
        if nbytes > xs[-1]:  # bandwidth-bound: the largest message's time in proportion (module docstring)
            return ys[-1] * (nbytes / xs[-1])
        i, w = _bracket(xs, nbytes)
        return _loglog(ys[i], ys[i + 1], w)


# ---------------------------------------------------------------------------------------------
# A card's table set


@dataclass
class TableSet:
    """Every table of one card folder (loaded lazily per file, cached per process)."""

    name: str
    folder: Path

    def _need(self, stem: str) -> Path:
        p = find_table(self.folder, stem)
        if p is None:
            have = sorted(q.name for q in self.folder.iterdir() if q.name.endswith((".csv", ".csv.gz")))
            what = f"this table set has: {', '.join(have)}" if have else \
                "no kernel tables (*.csv, *.csv.gz) at all: not a table set (see docs/ops.md)"
            raise ConfigError(f"{self.folder}: no {stem}.csv[.gz] ({what})")
        return p

    def gemm(self, dtype: str) -> GemmTable:
        """The GEMM table of `dtype` (bf16 or fp8)."""
        return _cached(GemmTable, self._need(f"gemm_{dtype}"))

    def context(self) -> AttentionTable:
        """Context (prefill) attention."""
        return _cached(AttentionTable, self._need("context_attention"), False)

    def generation(self) -> AttentionTable:
        """Generation (decode) attention."""
        return _cached(AttentionTable, self._need("generation_attention"), True)

    def mla(self, phase: str, engine: str, kv: str) -> AttentionTable | None:
        """An engine's measured MLA attention kernel (`phase` context or generation, KV cache `kv` bf16 or fp8:
        mla_<phase>_<engine>_<kv>.csv[.gz], heads per GPU, kv_heads 1, head_dim 576), or None where not measured."""
        p = find_table(self.folder, f"mla_{phase}_{engine}_{kv}")
        return None if p is None else _cached(AttentionTable, p, phase == "generation")

    def nccl(self) -> NcclTable:
        """Collectives."""
        return _cached(NcclTable, self._need("nccl"))

    def all_reduce(self, whose: str) -> NcclTable:
        """The all-reduce table: NCCL's (`nccl`) or an engine's own (`all_reduce_<engine>.csv`)."""
        if whose == "nccl":
            return self.nccl()
        return _cached(NcclTable, self._need(f"all_reduce_{whose}"))

    def source(self) -> str:
        """The table set's provenance (its source.txt), one line."""
        p = self.folder / "source.txt"
        return " ".join(p.read_text().split()) if p.exists() else f"profiles/ops/{self.name}"


@lru_cache(maxsize=64)
def _cached(cls, path: Path, *args):
    return cls(path, *args)


def load_table_set(name_or_path: str) -> TableSet:
    """A card folder by name (profiles/ops/<name>) or by path."""
    p = Path(name_or_path)
    folder = p if (p.is_dir() and ("/" in name_or_path or p.is_absolute())) else ops_dir() / name_or_path
    if not folder.is_dir():
        raise ConfigError(f"unknown kernel table set {name_or_path!r}; known: {', '.join(known_table_sets()) or 'none'} "
                          f"(folders under {ops_dir()})")
    return TableSet(folder.name, folder)
