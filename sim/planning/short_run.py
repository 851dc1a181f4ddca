"""Short runs: a capacity (or a replica count) measured on runs whose requests all arrive before the slowest
ones leave is a transient, not a steady state. `capsim plan` warns about it (plan.json's `warnings`), and
`capsim plan --gpus` notes it on each deployment's row (sim.planning.layouts)."""

from __future__ import annotations


def arrival_window(requests: int | None, rate: float | None) -> float | None:
    """Seconds over which a run's `requests` arrive at `rate` requests per second (None without both)."""
    return requests / rate if rate and requests else None


def is_short_run(requests: int | None, rate: float | None, e2e_p99_s: float | None) -> bool:
    """Whether a run's requests all arrive before the slowest ones (its p99 E2E) leave: the run ends before a
    queue can build, so an attainment measured on it is a transient, not a steady state (optimistic: a rate the
    replicas cannot sustain can still look met). Raise the requests until the answer stops moving."""
    window = arrival_window(requests, rate)
    return window is not None and e2e_p99_s is not None and window < e2e_p99_s


def short_run_warning(point, what: str, bias: str) -> str | None:
    """The warning for a plan's answer (`what`, likely `bias`) measured on `point`'s runs (a
    sim.planning.capacity.Point) when they are short (is_short_run); None when they are not."""
    n = point.runs[0].get("requests")
    e2e = [r["e2e_s_p99"] for r in point.runs if r.get("e2e_s_p99") is not None]
    e2e_max = max(e2e) if e2e else None
    if not is_short_run(n, point.rate, e2e_max):
        return None
    return (f"short run: {what} rests on runs whose {n} requests arrive within {arrival_window(n, point.rate):.3g} s "
            f"at {point.rate:.4g} req/s, less than their p99 E2E ({e2e_max:.3g} s): no queue has time to build, so "
            f"it is a transient, not a steady state ({bias}); raise --requests until it stops moving")
