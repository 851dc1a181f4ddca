"""The simulator fed what a replay measured: step-time models that return measured durations or scale
predictions, the profile's residuals, per-iteration errors, and the plan-by-plan consistency check."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from calibration.validate_errors import _metric_values
from sim.api import FittedProfile, Simulation, Speculator

KINDS = ("decode", "prefill", "mixed")


# ---------------------------------------------------------------------------------------------
# Step-time costs for the simulator: measured durations, perturbed predictions


def plan_kind(plan) -> str:
    """An iteration's kind: decode, prefill or mixed."""
    if plan.prefill_seqs and plan.decode_seqs:
        return "mixed"
    return "prefill" if plan.prefill_seqs else "decode"


class MeasuredSteps:
    """A step-time model that returns the k-th measured iteration's duration for the k-th iteration,
    and remembers what each iteration computed ((rid, new, cached) per item)."""

    def __init__(self, durations: list[float], fallback=None):
        self.durations = list(durations)
        self.fallback = fallback      # for the simulation's own probes (admission-control lower bounds)
        self.k = 0
        self.plans: list[list[tuple[int, int, int]]] = []

    def prefill_part_s(self, plan) -> float:
        """The prefill part of a probe plan, from the fallback model."""
        return self.fallback.prefill_part_s(plan) if self.fallback is not None else 0.0

    def step_s(self, plan) -> float:
        """The next measured duration (probe plans of made-up requests ask the fallback model)."""
        if plan.items and plan.items[0][0].rid < 0:   # a probe plan of a made-up request, not an iteration
            return self.fallback.step_s(plan) if self.fallback is not None else 0.0
        if self.k >= len(self.durations):
            raise IndexError(f"the simulation ran more than the {len(self.durations)} measured iterations")
        self.plans.append([(req.rid, n, h) for req, n, h in plan.items])
        t = self.durations[self.k]
        self.k += 1
        return t


class Perturbed:
    """Scales every step time by a factor chosen by the iteration's kind (decode / prefill / mixed)."""

    def __init__(self, inner, factors: dict[str, float]):
        self.inner, self.factors = inner, factors

    def prefill_part_s(self, plan) -> float:
        """The inner model's prefill part, unscaled."""
        return self.inner.prefill_part_s(plan)

    def step_s(self, plan) -> float:
        """The inner model's time scaled by the factor of the iteration's kind."""
        return self.inner.step_s(plan) * self.factors[plan_kind(plan)]


def residuals(profile_path: Path, prof: FittedProfile, use: str, model) -> tuple[dict[str, np.ndarray], str]:
    """Relative residuals (predicted / measured - 1) of the profile's `use` model on its calibration
    points, by iteration kind; without a points file, a normal spread with the fit's MAPE."""
    from calibration.fit import Observation, Roofline, predictor
    from calibration.points import read_points
    from sim.api import ModelSpec

    csv = profile_path.parent / prof.provenance.points_csv if prof.provenance.points_csv else None
    if csv is not None and csv.exists():
        pts = read_points(csv)
        obs = [Observation.from_row(r) for r in pts.ok_rows]
        cfg = getattr(prof, use)
        peak = cfg.peak_tflops * 1e12 if use == "efficiency" and cfg.peak_tflops else None
        pred = predictor(cfg, Roofline(ModelSpec(model), prof.dtype, peak, None))
        by: dict[str, list[float]] = {k: [] for k in KINDS}
        for o in obs:
            by[o.kind].append(pred(o) / o.time_s - 1.0)
        pooled = [r for v in by.values() for r in v]
        return ({k: np.array(v if v else pooled) for k, v in by.items()},
                f"relative residuals of the {use} model on the {len(pooled)} calibration points of {csv.name}")
    if prof.fit is None:
        raise ValueError(f"{profile_path}: no points file and no fit summary: cannot size the model uncertainty")
    sd = prof.fit.mape * math.sqrt(math.pi / 2)   # a normal with mean |r| = MAPE
    rng = np.random.default_rng(12345)
    r = np.clip(rng.normal(0.0, sd, 2000), -0.9, 10)
    return {k: r for k in KINDS}, (f"normal residuals with the profile's held-out MAPE {prof.fit.mape:.1%} "
                                    "(no points file)")


def step_errors(detail: pd.DataFrame, plans: list, cost) -> dict:
    """The profile's error on the iterations that ran: predicted (from the plan) against measured
    (whole iteration, and forward pass alone), overall and by kind; host time share; wake-up lateness."""
    pred = np.array([cost.step_s(p) for p in plans], dtype=float)
    dur = detail["duration_s"].to_numpy(float)
    fwd = detail["forward_s"].to_numpy(float)
    out: dict = {"iterations": int(len(dur))}
    if not len(dur):
        return out

    def errs(mask) -> dict:
        r = pred[mask] / dur[mask] - 1.0
        rf = pred[mask] / fwd[mask] - 1.0
        return {"iterations": int(mask.sum()), "mape": float(np.abs(r).mean()), "mean_rel_error": float(r.mean()),
                "time_bias": float(pred[mask].sum() / dur[mask].sum() - 1.0),
                "mape_vs_forward_only": float(np.abs(rf).mean()),
                "measured_s_median": float(np.median(dur[mask])), "predicted_s_median": float(np.median(pred[mask]))}

    out["all"] = errs(np.ones(len(dur), dtype=bool))
    kinds = detail["kind"].to_numpy()
    out["by_kind"] = {k: errs(kinds == k) for k in KINDS if (kinds == k).any()}
    out["host_share"] = float(detail["host_s"].sum() / dur.sum())
    if "forward_cpu_s" in detail:
        # CPU device, one torch thread: thread CPU time / wall time of the forward passes = the share of a
        # core the replay got (1.0 on a quiet machine; less when other processes held the core)
        out["forward_cpu_share"] = float(detail["forward_cpu_s"].sum() / detail["forward_wall_s"].sum())
    out["host_s_median"] = float(detail["host_s"].median())
    out["wake_s_total"] = float(detail["wake_s"].sum())
    out["wake_s_max"] = float(detail["wake_s"].max())
    out["predicted_s"] = pred.tolist()
    return out


def _replayed_speculation(log: dict):
    """A Speculator class whose drafts and accepted counts are the replay's, request by request."""
    class ReplayedSpeculation(Speculator):
        def __init__(self, cfg, rng, *args, **kw):
            super().__init__(cfg, rng, *args, **kw)
            self.index_pending = False
            self._calls: dict[int, int] = {}
            self._rounds: dict[int, int] = {}

        def drafts_for(self, req) -> int:
            i = self._calls.get(req.rid, 0)
            self._calls[req.rid] = i + 1
            seq = log["drafts"].get(req.rid, [])
            return seq[i] if i < len(seq) else 0

        def draft_s(self, drafts, include_index=True) -> float:
            return 0.0

        def sample(self, reqs, drafts):
            out = []
            for r in reqs:
                i = self._rounds.get(r.rid, 0)
                self._rounds[r.rid] = i + 1
                seq = log["accepted"].get(r.rid, [])
                out.append(seq[i] if i < len(seq) else 0)
            out = np.array(out, dtype=np.int64)
            self.rounds += len(reqs)
            self.drafts += int(sum(drafts))
            self.accepted += int(out.sum())
            return out

    return ReplayedSpeculation


def plans_check(run, scenario, base_dir: Path) -> dict:
    """Simulate the same scenario with each iteration's measured duration (and, under speculation, the
    replay's drafts and accepted counts): the plans must be the replay's, iteration by iteration, and
    the latency metrics the measured ones."""
    durations = run.result.iterations["duration_s"].tolist()
    factory = _replayed_speculation(run.spec_log) if run.spec_log is not None else Speculator
    sim = Simulation(scenario, base_dir, lazy_decode=False, speculator_factory=factory)
    cost = MeasuredSteps(durations, fallback=sim.step_time)
    sim.step_time = cost
    try:
        res = sim.run()
    except IndexError as exc:
        return {"identical": False, "reason": str(exc)}
    replay_plans = [[(it[0].rid, it[1], it[2]) for it in p.items] for p in run.plans]
    first = next((i for i, (a, b) in enumerate(zip(replay_plans, cost.plans)) if a != b), None)
    if first is None and len(replay_plans) != len(cost.plans):
        first = min(len(replay_plans), len(cost.plans))
    pairs = zip(_metric_values(res.summary).values(), _metric_values(run.result.summary).values())
    diffs = [abs(a - b) for a, b in pairs if a is not None and b is not None]
    return {"identical": first is None, "iterations": len(replay_plans), "first_difference": first,
            "max_abs_metric_difference": max(diffs) if diffs else None}
