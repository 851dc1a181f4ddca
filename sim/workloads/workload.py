"""Workloads: explicit request lists, synthetic arrivals and lengths, trace files.

Sampling uses one numpy Generator per source, spawned from the scenario seed; nothing global.
Token identity (which requests share which tokens, for the prefix cache) is carried as
*segments*: each prompt is a concatenation of (stream id, first token, length) pieces of token
streams. Streams: (0, i) request i's private prompt, (1, crc32(name)) a named shared prefix,
(2, id) a Mooncake trace block, (3, i) request i's outputs.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.io.config import (MAX_TOKENS, AllAtOnce, ClosedLoop, ConstantRate, Empirical, Fixed, GammaArrivals, LogNormal, Poisson,
                        RequestList, Synthetic, Trace, Uniform)
from sim.io.errors import ConfigError
from sim.workloads.trace_prefixes import prefix_segments, read_prefix_columns
from sim.workloads.traces import read_trace_with_blocks


def prefix_stream(name: str) -> tuple[int, int]:
    """The token stream id of a named shared prefix (a system prompt): equal names share tokens."""
    return (1, zlib.crc32(name.encode()))


@dataclass(frozen=True)
class Workload:
    """Requests as columns, sorted by arrival (ties keep file order)."""

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    outside_wait_s: np.ndarray
    cancel_at_s: np.ndarray  # NaN = never
    deadline_s: np.ndarray   # NaN = none
    segments: list | None = None
    """Per request: tuple of (stream, first, length) covering its prompt; None = all private."""
    leader: np.ndarray | None = None
    """Parallel sampling: index of the branch that prefills the shared prompt (-1: none)."""
    adapter: np.ndarray | None = None
    """LoRA adapter per request (-1: base model)."""
    shared_streams: frozenset = frozenset()
    """Streams that more than one request's tokens come from (only their blocks can ever be hit)."""
    closed_users: int = 0
    """Closed loop (> 0): this many users send the requests in index order as earlier ones leave;
    arrival_s holds the first wave's send times (inf for the others: the run decides them)."""
    think_s: np.ndarray | None = None
    """Closed loop: the user's pause before sending request i (sim.workloads.closed_loop)."""

    def __len__(self) -> int:
        return len(self.arrival_s)

    def shareable_tokens(self, i: int, extra_shared: frozenset = frozenset()) -> int | None:
        """Leading prompt tokens made only of shared streams; None (all of them) when the request's
        outputs are shared too (a later turn continues it)."""
        if not self.shared_streams and not extra_shared:  # nothing is shared: its first segment is not
            return 0
        n = 0
        for stream, _, length in self.segments_of(i):
            if stream not in self.shared_streams and stream not in extra_shared:
                return n
            n += length
        return None if (3, i) in self.shared_streams else n

    def segments_of(self, i: int) -> tuple:
        """Request i's prompt as token segments ((stream, first, length), ...); its own private stream by default."""
        if self.segments is None or self.segments[i] is None:
            return (((0, i), 0, int(self.prompt_tokens[i])),)
        return self.segments[i]


def _lengths(dist, n: int, rng: np.random.Generator, base: Path, field: str) -> np.ndarray:
    if isinstance(dist, Fixed):
        return np.full(n, dist.value, dtype=np.int64)
    if isinstance(dist, Uniform):
        return rng.integers(dist.low, dist.high + 1, size=n, dtype=np.int64)
    if isinstance(dist, LogNormal):
        x = np.rint(np.exp(rng.normal(np.log(dist.median), dist.sigma, size=n)))
        return np.clip(x, dist.min, dist.max).astype(np.int64)
    if isinstance(dist, Empirical):
        path = (base / dist.path) if not Path(dist.path).is_absolute() else Path(dist.path)
        return rng.choice(_empirical_column(path, dist.column, field), size=n, replace=True)
    raise AssertionError(dist)


def _empirical_column(path: Path, column: str, field: str) -> np.ndarray:
    """An empirical length distribution's column: whole token counts 1..MAX_TOKENS, one per data line (blank lines
    skipped); a bad cell is named by its line."""
    import csv
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            header = next(reader, [])
            if column not in header:
                raise ConfigError(f"workload.{field}.column: {column!r} is not a column of {path} (it has: "
                                  f"{', '.join(map(repr, header)) or 'no header'})")
            at, values = header.index(column), []
            for row in reader:
                if not row:
                    continue
                cell = row[at].strip() if at < len(row) else ""
                if not (cell.isascii() and cell.isdigit()) or not 1 <= int(cell) <= MAX_TOKENS:
                    raise ConfigError(f"workload.{field}: {path}: line {reader.line_num}, column {column!r}: expected a "
                                      f"whole number of tokens, 1 to {MAX_TOKENS:,}, got {cell!r}")
                values.append(int(cell))
    except FileNotFoundError:
        raise ConfigError(f"workload.{field}.path: file not found: {path}") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(f"workload.{field}.path: {path}: cannot be read as a CSV file "
                          f"({type(exc).__name__}: {exc})") from None
    if not values:
        raise ConfigError(f"workload.{field}: {path} column {column!r} has no values")
    return np.asarray(values, dtype=np.int64)


def _arrivals(dist, n: int, rng: np.random.Generator, start_s: float) -> np.ndarray:
    if isinstance(dist, AllAtOnce):
        return np.full(n, start_s)
    if isinstance(dist, ConstantRate):
        return start_s + np.arange(n) / dist.rate_rps
    if isinstance(dist, Poisson):
        gaps = rng.exponential(1.0 / dist.rate_rps, size=n)
    elif isinstance(dist, GammaArrivals):
        # shape k = burstiness, scale = 1 / (rate k): mean gap 1 / rate, as vllm bench serve
        gaps = rng.gamma(dist.burstiness, 1.0 / (dist.rate_rps * dist.burstiness), size=n)
    else:
        raise AssertionError(dist)
    return start_s + np.cumsum(gaps) - gaps[0]  # the first request arrives at start_s


def _explicit(cfg: RequestList) -> Workload:
    rows = []  # (original index, branch, request)
    for j, r in enumerate(cfg.requests):
        if r.context_of is not None and r.context_of >= j:
            raise ConfigError(f"workload.requests.{j}.context_of: {r.context_of} must name an earlier request")
        for b in range(r.n):
            rows.append((j, b, r))
    order = sorted(range(len(rows)), key=lambda k: (rows[k][2].arrival_s, k))
    new_index = {(rows[k][0], rows[k][1]): pos for pos, k in enumerate(order)}
    segments, leader = [], []
    for pos, k in enumerate(order):
        j, b, r = rows[k]
        own = (0, new_index[(j, 0)])  # branches share the first branch's prompt stream
        if r.prefix is not None:
            seg = ((prefix_stream(r.prefix.name), 0, r.prefix.tokens),)
            if r.prompt_tokens > r.prefix.tokens:
                seg += ((own, 0, r.prompt_tokens - r.prefix.tokens),)
        elif r.context_of is not None:
            base = cfg.requests[r.context_of]
            bi = new_index[(r.context_of, 0)]
            ctx = base.prompt_tokens + base.output_tokens
            if r.prompt_tokens < ctx:
                raise ConfigError(f"workload.requests.{j}.prompt_tokens: {r.prompt_tokens} is shorter than the context "
                                  f"of request {r.context_of} it continues ({base.prompt_tokens} + {base.output_tokens})")
            seg = segments[bi] + (((3, bi), 0, base.output_tokens),)
            if r.prompt_tokens > ctx:
                seg += ((own, 0, r.prompt_tokens - ctx),)
        else:
            seg = ((own, 0, r.prompt_tokens),)
        segments.append(seg)
        leader.append(new_index[(j, 0)] if b > 0 else -1)
    rs = [rows[k][2] for k in order]
    continued = [(3, new_index[(rows[k][2].context_of, 0)]) for k in order if rows[k][2].context_of is not None]
    return Workload(np.array([r.arrival_s for r in rs], dtype=float),
                    np.array([r.prompt_tokens for r in rs], dtype=np.int64),
                    np.array([r.output_tokens for r in rs], dtype=np.int64),
                    np.array([r.outside_wait_s for r in rs], dtype=float),
                    np.array([np.nan if r.cancel_at_s is None else r.cancel_at_s for r in rs], dtype=float),
                    np.array([np.nan if r.deadline_s is None else r.deadline_s for r in rs], dtype=float),
                    segments, np.array(leader, dtype=np.int64),
                    np.array([-1 if r.adapter is None else r.adapter for r in rs], dtype=np.int64),
                    _shared(segments, continued))


def _shared(segments: list | None, extra=()) -> frozenset:
    """Streams referenced by at least two requests (or named in `extra`)."""
    if segments is None:
        return frozenset(extra)
    seen: dict = {}
    for seg in segments:
        for stream in {piece[0] for piece in seg}:
            seen[stream] = seen.get(stream, 0) + 1
    return frozenset([s for s, c in seen.items() if c > 1] + list(extra))


def _mooncake_segments(hash_ids, prompt_tokens: int, block_tokens: int, where: str) -> tuple:
    if not hash_ids:
        raise ConfigError(f"{where}: hash_ids missing or empty")
    n = len(hash_ids)
    if not (n - 1) * block_tokens < prompt_tokens <= n * block_tokens:
        raise ConfigError(f"{where}: {n} hash_ids of {block_tokens} tokens do not cover input_length {prompt_tokens}")
    last = prompt_tokens - (n - 1) * block_tokens
    return tuple(((2, int(h)), 0, block_tokens if k < n - 1 else last) for k, h in enumerate(hash_ids))


def build_workload(cfg, seed: int, base_dir: Path) -> Workload:
    """The workload a scenario describes (list, synthetic or trace), drawn deterministically from `seed`."""
    arrival_rng, prompt_rng, output_rng, _accuracy, prefix_rng, _accept, adapter_rng = \
        np.random.default_rng(seed).spawn(7)
    if isinstance(cfg, RequestList):
        return _explicit(cfg)
    if isinstance(cfg, Synthetic):
        n = cfg.num_requests
        arr = _arrivals(cfg.arrival, n, arrival_rng, cfg.start_s)
        prompt = _lengths(cfg.prompt_tokens, n, prompt_rng, base_dir, "prompt_tokens")
        segments = None
        if cfg.shared_prefix is not None:
            sp = cfg.shared_prefix
            groups = prefix_rng.integers(0, sp.groups, size=n)
            segments = [((prefix_stream(f"group-{g}"), 0, sp.tokens), ((0, i), 0, int(prompt[i])))
                        for i, g in enumerate(groups.tolist())]
            prompt = prompt + sp.tokens
        arrays = (arr, prompt, _lengths(cfg.output_tokens, n, output_rng, base_dir, "output_tokens"),
                  np.zeros(n), np.full(n, np.nan), np.full(n, np.nan))
        adapter = None
        if cfg.adapters is not None:
            k = cfg.adapters.count
            w = np.ones(k) if cfg.adapters.distribution == "uniform" else 1.0 / np.arange(1, k + 1) ** cfg.adapters.zipf_s
            adapter = adapter_rng.choice(k, size=n, p=w / w.sum()).astype(np.int64)
        return Workload(*arrays, segments=segments, adapter=adapter, shared_streams=_shared(segments))  # sorted
    if isinstance(cfg, ClosedLoop):
        from sim.workloads.closed_loop import think_times
        n = cfg.num_requests
        think = think_times(n, cfg.users, cfg.think_time_s, cfg.think_distribution, arrival_rng)
        first = cfg.start_s + np.arange(n) * (cfg.ramp_up_s / cfg.users)  # only the first wave's are used
        if cfg.ramp_phases == "random" and cfg.ramp_up_s > 0:  # drawn after the think times: those stay the same
            k = min(n, cfg.users)
            first[:k] = cfg.start_s + np.sort(arrival_rng.uniform(0.0, cfg.ramp_up_s, k))
        return Workload(np.where(np.arange(n) < cfg.users, first, np.inf),
                        _lengths(cfg.prompt_tokens, n, prompt_rng, base_dir, "prompt_tokens"),
                        _lengths(cfg.output_tokens, n, output_rng, base_dir, "output_tokens"),
                        np.zeros(n), np.full(n, np.nan), np.full(n, np.nan), closed_users=cfg.users, think_s=think)
    if isinstance(cfg, Trace):
        path = Path(cfg.path) if Path(cfg.path).is_absolute() else base_dir / cfg.path
        t, p, o, hashes = read_trace_with_blocks(path, cfg.format)
        keep = np.ones(len(t), dtype=bool)
        if cfg.window_s is not None:
            keep = (t >= cfg.window_s[0]) & (t < cfg.window_s[1])
        idx = np.flatnonzero(keep)
        if cfg.max_requests is not None:
            idx = idx[:cfg.max_requests]
        if len(idx) == 0:
            raise ConfigError(f"workload: no requests of {path} fall in window_s {cfg.window_s}")
        start = cfg.window_s[0] if cfg.window_s is not None else 0.0
        t, p, o = (t[idx] - start) / cfg.rate_scale, p[idx], o[idx]
        segments = None
        if hashes is not None and any(h is not None for h in hashes):
            segments = [_mooncake_segments(hashes[k], int(p[i]), cfg.trace_block_tokens, f"{path}: line {k + 1}")
                        for i, k in enumerate(idx.tolist())]
        prefixes = read_prefix_columns(path, cfg.format)   # csv / jsonl: optional prefix_id, prefix_tokens
        if prefixes is not None:
            segments = prefix_segments(prefixes, p, idx, path)
        n = len(t)
        return Workload(t, p, o, np.zeros(n), np.full(n, np.nan), np.full(n, np.nan), segments,
                        shared_streams=_shared(segments))
    raise AssertionError(cfg)
