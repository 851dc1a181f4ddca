"""How far a plan's answer moves with the step-time model's error (`capsim plan --step-time-error PCT`).

The plan's capacity (and, with a target rate, its replica count) is found again with every iteration's modelled
time PCT% shorter and PCT% longer (`step_time.scale` 1 - e and 1 + e), on the same Dask runner, bisection
tolerance, SLOs and seeds. The error to give is the one the run's second line quotes: a fitted profile's held-out
error, or an ops model's median |error| on published serving runs of the card (docs/ops.md). A scale moves decode
and prefill alike; the band says what the plan would answer if the model were off by that much, not which way it
is off.
"""

from __future__ import annotations

from typing import Callable, Iterable

from sim.io.errors import ConfigError


def check_error(error: float | None, base_scale: float) -> None:
    """Refuse an error outside (0, 1), and one given for a scenario that already scales its step times."""
    if error is None:
        return
    if not 0 < error < 1:
        raise ConfigError(f"--step-time-error: expected a fraction in (0, 1) (7% is 0.07), got {error:g}")
    if base_scale != 1.0:
        raise ConfigError(f"--step-time-error: the scenario already sets step_time.scale: {base_scale:g}; give one "
                          "or the other")


def step_time_sensitivity(make_planner: Callable[[list[str]], object], error: float, tol: float,
                          start_rps: float | None, target_rps: float | None, max_replicas: int,
                          log: Callable[[str], None]) -> dict:
    """The plan's capacity (and replicas for `target_rps`) with steps `error` shorter and longer.

    `make_planner(extra_overrides)` builds a Planner on the plan's base scenario plus those overrides."""
    cases = []
    for label, scale in (("faster", 1.0 - error), ("slower", 1.0 + error)):
        log(f"sensitivity: every step x {scale:g} ({label})")
        case = {"steps": label, "scale": scale, "capacity_rps": None, "per_replica_rps": None,
                "bracket_rps": [None, None], "note": "", "simulated_replicas": None, "max_replicas": max_replicas}
        try:  # a case the simulator refuses (e.g. a shape beyond a profile's range at a higher rate) keeps the plan
            pl = make_planner([f"step_time.scale={scale!r}"])
            cap, bracket, _, note = pl.capacity(tol, start_rps)
            case.update(capacity_rps=cap, per_replica_rps=None if cap is None else cap / pl.base_replicas,
                        bracket_rps=list(bracket), note=note)
            if target_rps is not None and cap:
                case["simulated_replicas"] = pl.replicas_for(target_rps, cap / pl.base_replicas,
                                                             max_replicas)["simulated_replicas"]
        except ConfigError as exc:
            case["note"] = f"not found: {exc}"
            log(f"sensitivity: every step x {scale:g}: {exc}")
        cases.append(case)
    return {"step_time_error": error, "tolerance": tol, "cases": cases}


def sensitivity_lines(sens: dict, base_per_replica: float | None, base_replicas: int | str | None,
                      target_rps: float | None) -> Iterable[str]:
    """The band as text: capacity per replica (and replicas for the target) with steps faster and slower."""
    pct = f"{sens['step_time_error'] * 100:g}%"

    def rate(x):
        return "none" if x is None else f"{x:.4g}"

    faster, slower = sens["cases"]
    yield (f"if every step were {pct} faster / as modelled / {pct} slower: capacity {rate(faster['per_replica_rps'])}"
           f" / {rate(base_per_replica)} / {rate(slower['per_replica_rps'])} req/s per replica")
    if target_rps is not None:
        def n(x, case=None):
            if x is not None:
                return str(x)
            return "-" if case is None or case["capacity_rps"] is None else f"more than {case['max_replicas']}"
        yield (f"  replicas for {target_rps:g} req/s: {n(faster['simulated_replicas'], faster)} / "
               f"{n(base_replicas)} / {n(slower['simulated_replicas'], slower)}")
    if sens["step_time_error"] <= sens["tolerance"]:
        yield (f"  (each capacity is bisected to a relative width of {sens['tolerance']:g}, no narrower than the band: "
               "give a smaller --tol)")
    for case in sens["cases"]:
        if case["note"]:
            yield f"  {case['steps']} steps: {case['note']}"
