"""Iteration composition: did capsim's scheduler plan the same iterations as the engine?

capsim simulates the scenario with each iteration taking exactly the engine's measured duration
(so arrivals fall into the same iterations), every request planned explicitly, and the plans are
compared with the engine's, iteration by iteration: the same requests with the same token counts
(a set per iteration; the order inside an iteration is reported separately). After the first
difference the two runs are in different states, so both the fraction of all iterations that match
and the length of the identical prefix are reported.
"""

from __future__ import annotations

from sim.api import LinearStepTime, Simulation, StepTimeConfig


class _Durations:
    """A step-time model that returns the k-th engine iteration's duration for the k-th iteration and
    remembers capsim's plan of each ((rid, tokens, computed before) per item, in plan order)."""

    def __init__(self, durations: list[float], fallback):
        self.durations, self.fallback, self.plans = list(durations), fallback, []

    def prefill_part_s(self, plan) -> float:
        return self.fallback.prefill_part_s(plan)

    def step_s(self, plan) -> float:
        if plan.items and plan.items[0][0].rid < 0:   # a probe of a made-up request (admission lower bounds)
            return self.fallback.step_s(plan)
        k = len(self.plans)
        if k >= len(self.durations):
            raise IndexError(f"capsim planned more than the engine's {len(self.durations)} iterations")
        self.plans.append([(req.rid, n, h) for req, n, h in plan.items])
        return self.durations[k]


def capsim_plans(sc, base_dir, durations: list[float]) -> tuple[list, object, str | None]:
    """capsim's plans (and Result, None when it ran past the engine's iterations) with the engine's
    measured iteration durations."""
    model = LinearStepTime(constant_s=1e-3, per_new_token_s=0.0, per_pair_s=0.0)
    bare = sc.model_copy(update={"step_time": StepTimeConfig(model=model)})
    sim = Simulation(bare, base_dir, lazy_decode=False)
    cost = _Durations(durations, sim.step_time)
    sim.step_time = cost
    try:
        res, note = sim.run(), None
    except IndexError as exc:
        res, note = None, str(exc)
    return cost.plans, res, note


def compare(engine_iterations: list[dict], plans: list) -> dict:
    """Per-iteration comparison: fraction identical (same requests and token counts), identical
    prefix, same order, and the first difference."""
    eng = [[(int(x[0]), int(x[1])) for x in it["items"]] for it in engine_iterations]
    cap = [[(int(r), int(n)) for r, n, _h in p] for p in plans]
    n = max(len(eng), len(cap))
    same = [sorted(a) == sorted(b) for a, b in zip(eng, cap)]
    order = [a == b for a, b in zip(eng, cap)]
    first = next((k for k, ok in enumerate(same) if not ok), None)
    if first is None and len(eng) != len(cap):
        first = min(len(eng), len(cap))
    out = {"engine_iterations": len(eng), "capsim_iterations": len(cap),
           "identical": int(sum(same)), "identical_fraction": sum(same) / n if n else None,
           "identical_prefix": first if first is not None else n,
           "same_order_fraction": sum(order) / n if n else None, "first_difference": None}
    if first is not None:
        out["first_difference"] = {"iteration": first,
                                   "engine": eng[first] if first < len(eng) else None,
                                   "capsim": cap[first] if first < len(cap) else None}
    return out


def composition_report(sc, base_dir, engine_iterations: list[dict]) -> dict:
    """capsim's plans on the engine's durations, compared with the engine's iterations."""
    plans, res, note = capsim_plans(sc, base_dir, [it["duration_s"] for it in engine_iterations])
    out = compare(engine_iterations, plans)
    out["scheduler"] = sc.scheduler.kind
    if note:
        out["note"] = note
    return out
