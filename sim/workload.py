"""Workloads: explicit request lists, synthetic arrivals and lengths, trace files.

Sampling uses one numpy Generator per source, spawned from the scenario seed; nothing global.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sim.config import (AllAtOnce, ConstantRate, Empirical, Fixed, GammaArrivals, LogNormal, Poisson, RequestList,
                        Synthetic, Trace, Uniform)
from sim.errors import ConfigError
from sim.traces import read_trace


@dataclass(frozen=True)
class Workload:
    """Requests as columns, sorted by arrival (ties keep file order)."""

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    outside_wait_s: np.ndarray
    cancel_at_s: np.ndarray  # NaN = never
    deadline_s: np.ndarray   # NaN = none

    def __len__(self) -> int:
        return len(self.arrival_s)


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
        try:
            col = pd.read_csv(path, usecols=[dist.column])[dist.column].to_numpy()
        except FileNotFoundError:
            raise ConfigError(f"workload.{field}.path: file not found: {path}") from None
        except ValueError:
            raise ConfigError(f"workload.{field}.column: {dist.column!r} is not a column of {path}") from None
        if len(col) == 0 or not np.all(col >= 1):
            raise ConfigError(f"workload.{field}: {path} column {dist.column!r} needs positive integers")
        return rng.choice(col.astype(np.int64), size=n, replace=True)
    raise AssertionError(dist)


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


def build_workload(cfg, seed: int, base_dir: Path) -> Workload:
    arrival_rng, prompt_rng, output_rng = np.random.default_rng(seed).spawn(3)
    if isinstance(cfg, RequestList):
        rs = cfg.requests
        arrays = (np.array([r.arrival_s for r in rs], dtype=float),
                  np.array([r.prompt_tokens for r in rs], dtype=np.int64),
                  np.array([r.output_tokens for r in rs], dtype=np.int64),
                  np.array([r.outside_wait_s for r in rs], dtype=float),
                  np.array([np.nan if r.cancel_at_s is None else r.cancel_at_s for r in rs], dtype=float),
                  np.array([np.nan if r.deadline_s is None else r.deadline_s for r in rs], dtype=float))
    elif isinstance(cfg, Synthetic):
        n = cfg.num_requests
        arr = _arrivals(cfg.arrival, n, arrival_rng, cfg.start_s)
        arrays = (arr, _lengths(cfg.prompt_tokens, n, prompt_rng, base_dir, "prompt_tokens"),
                  _lengths(cfg.output_tokens, n, output_rng, base_dir, "output_tokens"),
                  np.zeros(n), np.full(n, np.nan), np.full(n, np.nan))
    elif isinstance(cfg, Trace):
        path = Path(cfg.path) if Path(cfg.path).is_absolute() else base_dir / cfg.path
        t, p, o = read_trace(path, cfg.format)
        if cfg.window_s is not None:
            keep = (t >= cfg.window_s[0]) & (t < cfg.window_s[1])
            t, p, o = t[keep] - cfg.window_s[0], p[keep], o[keep]
        if cfg.max_requests is not None:
            t, p, o = t[:cfg.max_requests], p[:cfg.max_requests], o[:cfg.max_requests]
        if len(t) == 0:
            raise ConfigError(f"workload: no requests of {path} fall in window_s {cfg.window_s}")
        t = t / cfg.rate_scale
        n = len(t)
        arrays = (t, p, o, np.zeros(n), np.full(n, np.nan), np.full(n, np.nan))
    else:
        raise AssertionError(cfg)
    order = np.argsort(arrays[0], kind="stable")
    return Workload(*(a[order] for a in arrays))
