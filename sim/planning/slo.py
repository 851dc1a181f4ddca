"""SLOs and attainment: which requests meet every latency bound, and what share of them do.

A request *attains* the SLOs when it finished, its answer is correct (always, unless the scenario
sets accuracy.p_correct < 1) and it is within every bound given: TTFT <= ttft, TPOT <= tpot
(one-token outputs have no TPOT and pass), E2E <= e2e, its largest inter-token gap <= itl.
Rejected, cancelled and failed requests do not attain. Attainment = attaining / all requests.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from sim.io.errors import ConfigError


@dataclass(frozen=True)
class SLO:
    """Latency bounds in seconds (None: no bound); a request attains when it is within all of them."""
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    itl_s: float | None = None

    def given(self) -> dict[str, float]:
        """The bounds that are set, by name."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def describe(self) -> str:
        """The bounds as text, e.g. "TTFT <= 2 s, TPOT <= 0.1 s"."""
        names = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E", "itl_s": "max ITL"}
        return ", ".join(f"{names[k]} <= {v:g} s" for k, v in self.given().items())


_SLO_NAMES = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s", "e2el": "e2e_s", "itl": "itl_s"}


def _seconds(text: str, where: str) -> float:
    t = text.strip().lower()
    scale = 1.0
    if t.endswith("ms"):
        t, scale = t[:-2], 1e-3
    elif t.endswith("s"):
        t = t[:-1]
    try:
        v = float(t) * scale
    except ValueError:
        raise ConfigError(f"{where}: expected seconds such as 2, 0.1 or 200ms, got {text!r}") from None
    if not v > 0 or math.isinf(v):
        raise ConfigError(f"{where}: expected a positive time, got {text!r}")
    return v


def parse_slo(text: str) -> SLO:
    """'ttft=2,tpot=0.1,e2e=30' (seconds; '200ms' also works; itl= bounds each request's max gap)."""
    vals: dict[str, float] = {}
    for part in [p for p in text.split(",") if p.strip()]:
        if "=" not in part:
            raise ConfigError(f"--slo {text!r}: expected name=seconds pairs such as ttft=2,tpot=0.1,e2e=30")
        name, _, raw = part.partition("=")
        key = _SLO_NAMES.get(name.strip().lower().removesuffix("_s"))
        if key is None:
            raise ConfigError(f"--slo {text!r}: unknown SLO {name.strip()!r} (known: ttft, tpot, e2e, itl)")
        if key in vals:
            raise ConfigError(f"--slo {text!r}: {name.strip()} given twice")
        vals[key] = _seconds(raw, f"--slo {name.strip()}")
    if not vals:
        raise ConfigError(f"--slo {text!r}: give at least one of ttft, tpot, e2e, itl")
    return SLO(**vals)


def slo_from_scenario(scenario) -> SLO:
    """The scenario's own slo section as an SLO."""
    s = scenario.slo
    return SLO(ttft_s=s.ttft_s, e2e_s=s.e2e_s, itl_s=s.itl_s if s.itl_stat == "max" else None)


def attainment(requests, slo: SLO, target: float) -> dict:
    """Attainment of every SLO together and of each alone, over all requests of a run, and the
    completion time at the target quantile (unfinished requests count as never completing)."""
    n = len(requests)
    done = (requests["status"] == "finished").to_numpy()
    correct = requests["correct"].fillna(0).to_numpy() == 1
    ok = done & correct
    good = ok.copy()
    out: dict[str, Any] = {"requests": n}
    checks = {"ttft_s": ("ttft_s", False), "tpot_s": ("tpot_s", True), "e2e_s": ("e2e_s", False),
              "itl_s": ("max_itl_s", True)}
    for key, bound in slo.given().items():
        col, nan_passes = checks[key]
        v = requests[col].to_numpy(dtype=float)
        within = (v <= bound) | (np.isnan(v) & nan_passes)
        out[f"attainment_{key.removesuffix('_s')}"] = float((ok & within).sum() / n) if n else None
        good &= within
    out["good"] = int(good.sum())
    out["attainment"] = out["good"] / n if n else None
    e2e = np.where(done, requests["e2e_s"].to_numpy(dtype=float), np.inf)
    k = max(1, math.ceil(target * n - 1e-9))
    out["e2e_at_target_s"] = float(np.sort(e2e)[k - 1]) if n else None
    return out
