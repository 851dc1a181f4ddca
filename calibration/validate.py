"""`capsim validate`: the simulator's error against a real replay of the same trace, on this device.

For one scenario (and optionally several arrival rates) it
1. replays the workload for real (calibration/replay.py: the simulator's scheduler driving the
   reference model, timed) -> the *measured* tables;
2. simulates the same scenario with a fitted step-time profile -> the *simulated* tables;
3. compares them per metric (TTFT, TPOT, ITL, E2E at mean / median / p90 / p99; makespan,
   throughput): relative error = (simulated - measured) / measured; and per request (paired by id);
4. attaches intervals to the prediction: workload randomness (the same scenario over other seeds)
   and step-time model uncertainty (the fit's relative residuals, resampled: one draw per iteration
   kind -- decode, prefill, mixed -- per run, so the error is as correlated as it is within a shape
   family), and says which is wider; with --replays, the measurement's own run-to-run spread too;
5. explains the error: the profile's error on the iterations that actually ran, the host time
   around the forward passes, the wake-up lateness at arrivals, the share of a core the forward
   passes got; and checks that the simulator fed the measured iteration times reproduces the
   replay's plans exactly (the plumbing is sound);
6. writes validation.json, the measured and simulated tables, and plots.

Only the replay needs torch (imported when it runs); the arithmetic here is plain numpy.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from sim.api import StepTimeConfig, load_scenario
from sim.api import RangeChecked
from sim.api import ConfigError
from sim.api import FittedProfile, load_fitted, load_model
from sim.api import Result, Simulation, Speculator, resolve_profile_path

LATENCIES = ("ttft_s", "tpot_s", "itl_s", "e2e_s")
STATS = ("mean", "median", "p90", "p99")
SCALARS = ("makespan_s", "output_throughput_tok_s", "request_throughput_rps")
PER_REQUEST = ("ttft_s", "tpot_s", "e2e_s")
# the targets on CPU: |relative error| of the median
TARGETS = {"e2e_s": 0.05, "itl_s": 0.05, "ttft_s": 0.10}
KINDS = ("decode", "prefill", "mixed")


# ---------------------------------------------------------------------------------------------
# Error arithmetic (no torch)


def rel_error(simulated, measured) -> float | None:
    """(simulated - measured) / measured; None when either is missing or measured is 0."""
    if simulated is None or measured is None:
        return None
    s, m = float(simulated), float(measured)
    if not (math.isfinite(s) and math.isfinite(m)) or m == 0:
        return None
    return (s - m) / m


def compare_summaries(simulated: dict, measured: dict) -> dict:
    """Per metric and statistic: simulated, measured and their relative error."""
    out: dict = {}
    for key in LATENCIES:
        out[key] = {st: {"simulated": simulated[key][st], "measured": measured[key][st],
                         "rel_error": rel_error(simulated[key][st], measured[key][st])} for st in STATS}
    for key in SCALARS:
        out[key] = {"simulated": simulated[key], "measured": measured[key],
                    "rel_error": rel_error(simulated[key], measured[key])}
    return out


def per_request_errors(simulated: pd.DataFrame, measured: pd.DataFrame) -> dict:
    """Requests finished in both runs, paired by id: |relative error| per request (median, mean, p90)
    and the signed median."""
    cols = ["id", *PER_REQUEST]
    a = simulated.loc[simulated["status"] == "finished", cols]
    b = measured.loc[measured["status"] == "finished", cols]
    j = a.merge(b, on="id", suffixes=("_sim", "_real"))
    out = {"paired_requests": int(len(j))}
    for key in PER_REQUEST:
        s, m = j[f"{key}_sim"].to_numpy(float), j[f"{key}_real"].to_numpy(float)
        ok = np.isfinite(s) & np.isfinite(m) & (m > 0)
        r = (s[ok] - m[ok]) / m[ok]
        out[key] = ({"median_abs_rel_error": float(np.median(np.abs(r))), "mean_abs_rel_error": float(np.abs(r).mean()),
                     "p90_abs_rel_error": float(np.percentile(np.abs(r), 90)), "median_rel_error": float(np.median(r)),
                     "n": int(ok.sum())} if ok.any() else None)
    return out


def interval(values: list[float | None], lo: float = 5, hi: float = 95) -> list[float] | None:
    v = np.array([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    if len(v) == 0:
        return None
    return [float(np.percentile(v, lo)), float(np.percentile(v, hi))]


def _metric_values(summary: dict) -> dict[str, float | None]:
    """Flat 'ttft_s.median' -> value of the metrics compared."""
    out = {f"{k}.{st}": summary[k][st] for k in LATENCIES for st in STATS}
    out.update({k: summary[k] for k in SCALARS})
    return out


def uncertainty_block(central: dict, measured: dict, workload: list[dict], model: list[dict],
                      replays: list[dict] | None = None) -> dict:
    """Intervals (5th-95th percentile) of every compared metric over the workload replications and the
    model draws, their widths relative to the central prediction, and which one is wider (`dominant`).
    With several replays of the same point, the measured values' range too (`measurement`: the
    replay's own run-to-run noise, relative to the first replay) and the widest of the three."""
    c, m = _metric_values(central), _metric_values(measured)
    wl = [_metric_values(s) for s in workload]
    md = [_metric_values(s) for s in model]
    rp = [_metric_values(s) for s in replays] if replays and len(replays) > 1 else []
    per: dict = {}
    votes = {"workload": 0, "model": 0}
    votes_all = {"workload": 0, "model": 0, "measurement": 0}
    for key, value in c.items():
        meas = m.get(key)
        iw = interval([x[key] for x in wl]) if wl else None
        im = interval([x[key] for x in md]) if md else None
        ir = interval([x[key] for x in rp], 0, 100) if rp else None

        def width(iv, ref):
            return None if iv is None or not ref else (iv[1] - iv[0]) / abs(ref)

        ww, wm, wr = width(iw, value), width(im, value), width(ir, meas)
        dom = widest = None
        headline = key.endswith(".median") or key in SCALARS
        if ww is not None and wm is not None:
            dom = "workload" if ww >= wm else "model"
            if headline:
                votes[dom] += 1
            widths = {"workload": ww, "model": wm}
            if wr is not None:
                widths["measurement"] = wr
            widest = max(widths, key=widths.get)
            if headline:
                votes_all[widest] += 1
        inside = {name: (None if iv is None or meas is None else bool(iv[0] <= meas <= iv[1]))
                  for name, iv in (("workload", iw), ("model", im))}
        per[key] = {"simulated": value, "measured": meas, "workload_interval": iw, "model_interval": im,
                    "workload_rel_width": ww, "model_rel_width": wm, "dominant": dom, "measured_inside": inside}
        if rp:
            per[key].update(measured_replays=[x[key] for x in rp], measurement_interval=ir,
                            measurement_rel_width=wr, widest=widest)
    overall = None if not (votes["workload"] or votes["model"]) else max(votes, key=votes.get)
    out = {"metrics": per, "dominant": overall, "votes_on_medians_and_totals": votes}
    if rp:
        out.update(replays=len(rp), widest=max(votes_all, key=votes_all.get), votes_widest=votes_all)
    return out


# ---------------------------------------------------------------------------------------------
# Step-time costs for the simulator: measured durations, perturbed predictions


def plan_kind(plan) -> str:
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
        return self.fallback.prefill_part_s(plan) if self.fallback is not None else 0.0

    def step_s(self, plan) -> float:
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
        return self.inner.prefill_part_s(plan)

    def step_s(self, plan) -> float:
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


# ---------------------------------------------------------------------------------------------
# Simulation side


@dataclass
class ProfileChoice:
    path: Path
    profile: FittedProfile
    use: str

    @property
    def inner(self):
        cfg = getattr(self.profile, self.use)
        if cfg is None:
            raise ConfigError(f"{self.path}: this profile has no {self.use} model (--use {self.use})")
        return cfg


def _model_of(scenario, base_dir: Path):
    """The scenario's model profile (a name in profiles/models, or a YAML path relative to the scenario)."""
    m = scenario.model
    return load_model(base_dir / m) if m.endswith((".yaml", ".yml")) else load_model(m)


def choose_profile(scenario, base_dir: Path, profile: str | None, use: str | None) -> ProfileChoice:
    """--profile P (or the scenario's own `step_time.model: {kind: profile}`), checked against the model."""
    st = scenario.step_time.model
    if profile is None:
        if getattr(st, "kind", None) != "profile":
            raise ConfigError("validate: give --profile (the scenario's step_time is not a fitted profile)")
        profile, use = st.path, use or st.use
    path = resolve_profile_path(profile, base_dir) if not Path(profile).exists() else Path(profile)
    prof = load_fitted(path)
    model = _model_of(scenario, base_dir)
    if prof.model != model.name:
        raise ConfigError(f"{path}: model: profile is for {prof.model!r} but the scenario runs {model.name!r}")
    choice = ProfileChoice(path, prof, use or "linear")
    choice.inner  # noqa: B018 - raises when the model is absent
    return choice


def with_profile(scenario, choice: ProfileChoice):
    """The scenario with the profile's model written inline (the range check is added around it)."""
    st = scenario.step_time
    return scenario.model_copy(update={"step_time": StepTimeConfig(
        model=choice.inner, graph_sizes=st.graph_sizes, allow_extrapolation=st.allow_extrapolation)})


def simulation(scenario, base_dir: Path, choice: ProfileChoice, lazy_decode: bool = True, stream=None) -> Simulation:
    sim = Simulation(with_profile(scenario, choice), base_dir, lazy_decode=lazy_decode, stream=stream)
    sim.step_time = RangeChecked(sim.step_time, choice.profile.valid_range, choice.path,
                            scenario.step_time.allow_extrapolation, stream)
    return sim


def step_time_model(scenario, base_dir: Path, choice: ProfileChoice):
    """The bare step-time model the simulation evaluates (no range check), for per-iteration errors."""
    return Simulation(with_profile(scenario, choice), base_dir).step_time


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


# ---------------------------------------------------------------------------------------------
# One validation point


@dataclass
class ValidateConfig:
    scenario: Path
    out: Path
    profile: str | None = None
    use: str | None = None
    device: str = "cpu"
    overrides: list[str] = field(default_factory=list)
    rates: list[float] | None = None
    clock: str = "wall"
    threads: int | None = None
    dtype: str | None = None
    seeds: int = 5                 # workload replications (the scenario's seed and seeds + 1..)
    replays: int = 1               # real replays of each point (> 1: the measurement's run-to-run noise)
    model_draws: int = 20          # step-time model draws
    weights_seed: int = 0
    plots: bool = True
    command: str | None = None
    stream: object = None


def _profile_threads(choice: ProfileChoice) -> int | None:
    from calibration.points import read_points
    if not choice.profile.provenance.points_csv:
        return None
    csv = choice.path.parent / choice.profile.provenance.points_csv
    if not csv.exists():
        return None
    t = read_points(csv).meta.get("threads")
    return int(t) if t else None


def _rate_override(scenario, rate: float) -> str:
    wl = scenario.workload
    if wl.kind == "synthetic":
        if wl.arrival.kind == "all_at_once":
            raise ConfigError("validate --rates: the workload's arrivals are all_at_once (no rate to change)")
        return f"workload.arrival.rate_rps={rate!r}"
    if wl.kind == "trace":
        return f"workload.rate_scale={rate!r}"
    raise ConfigError("validate --rates: needs a synthetic workload (arrival.rate_rps) or a trace (rate_scale)")


def validate_point(cfg: ValidateConfig, replayer, overrides: list[str], out: Path, label: dict) -> dict:
    log = (lambda s: print(s, file=cfg.stream, flush=True)) if cfg.stream is not None else (lambda s: None)
    scenario, base = load_scenario(cfg.scenario, overrides)
    choice = choose_profile(scenario, base, cfg.profile, cfg.use)
    sc = with_profile(scenario, choice)
    runs = []
    for k in range(cfg.replays):
        log(f"[{label_text(label)}] replaying {scenario.name} for real" + (f" ({k + 1}/{cfg.replays})" if
                                                                           cfg.replays > 1 else "") + " ...")
        runs.append(replayer.run(sc, base))
    run = runs[0]
    log(f"[{label_text(label)}] replay done: {run.result.summary['completed']} requests in "
        f"{run.result.summary['makespan_s']:.2f} s, {len(run.plans)} iterations; simulating ...")
    simulated = simulation(scenario, base, choice).run()
    measured = run.result
    run.write(out / "measured")
    simulated.write(out / "simulated")

    # intervals
    workload = []
    for j in range(1, cfg.seeds):
        s2, _ = load_scenario(cfg.scenario, overrides + [f"seed={scenario.seed + j}"])
        workload.append(simulation(s2, base, choice).run().summary)
    res, res_source = residuals(choice.path, choice.profile, choice.use, replayer.profile)
    rng = np.random.default_rng([scenario.seed, 7])
    model = []
    for _ in range(cfg.model_draws):
        factors = {k: 1.0 / (1.0 + float(rng.choice(res[k]))) for k in KINDS}
        sim = simulation(scenario, base, choice)
        sim.step_time = Perturbed(sim.step_time, factors)
        model.append(sim.run().summary)
    unc = uncertainty_block(simulated.summary, measured.summary, [simulated.summary] + workload,
                            [simulated.summary] + model, [r.result.summary for r in runs])
    unc.update(workload_seeds=cfg.seeds, model_draws=cfg.model_draws, interval="5th-95th percentile",
               model_residuals=res_source,
               model_method="each run scales decode, prefill and mixed iteration times by 1 / (1 + r), one r per "
                            "kind drawn from that kind's residuals")

    steps = step_errors(run.detail, run.plans, step_time_model(scenario, base, choice))
    predicted = steps.pop("predicted_s", [])
    metrics = compare_summaries(simulated.summary, measured.summary)
    point = {**label, "scenario": scenario.name, "requests": measured.summary["requests"],
             "completed": {"measured": measured.summary["completed"], "simulated": simulated.summary["completed"]},
             "iterations": {"measured": measured.summary["iterations"], "simulated": simulated.summary["iterations"]},
             "metrics": metrics, "per_request": per_request_errors(simulated.requests, measured.requests),
             "targets": targets(metrics), "step_time": steps, "replay_consistency": plans_check(run, sc, base),
             "uncertainty": unc, "replay": run.meta,
             "speculative": {"measured": measured.summary.get("speculative"),
                             "simulated": simulated.summary.get("speculative")}
             if measured.summary.get("speculative") else None}
    if cfg.plots:
        plot_point(measured, simulated, run.detail, predicted, out, label_text(label) or scenario.name,
                   [r.result for r in runs[1:]])
    log(f"[{label_text(label)}] " + headline(point))
    return point


def targets(metrics: dict) -> dict:
    out = {}
    for key, limit in TARGETS.items():
        e = metrics[key]["median"]["rel_error"]
        out[f"{key}.median"] = {"abs_rel_error": None if e is None else abs(e), "target": limit,
                                "met": None if e is None else abs(e) <= limit}
    return out


def label_text(label: dict) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in label.items() if v is not None)


def headline(point: dict) -> str:
    m = point["metrics"]
    parts = [f"{k[:-2].upper()} median {_pct(m[k]['median']['rel_error'])}" for k in LATENCIES]
    parts.append(f"makespan {_pct(m['makespan_s']['rel_error'])}")
    return "errors (sim - real) / real: " + ", ".join(parts)


def _share(x) -> str:
    return "-" if x is None else f"{x:.0%}"


def _pct(x) -> str:
    return "-" if x is None else f"{x:+.1%}"


# ---------------------------------------------------------------------------------------------
# Plots (matplotlib, Agg)


def _ecdf(ax, values, label, **kw):
    v = np.sort(np.asarray(values, dtype=float))
    v = v[np.isfinite(v)]
    if len(v):
        ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", label=label, **kw)


def plot_point(measured: Result, simulated: Result, detail: pd.DataFrame, predicted: list[float], out: Path,
               title: str, other_replays: list[Result] = ()) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    fin_m = measured.requests[measured.requests["status"] == "finished"]
    fin_s = simulated.requests[simulated.requests["status"] == "finished"]
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    for ax, key in zip(axes, ("ttft_s", "tpot_s", "e2e_s")):
        for k, other in enumerate(other_replays):
            fin_o = other.requests[other.requests["status"] == "finished"]
            _ecdf(ax, fin_o[key], "other replays" if k == 0 else None, color="gray", linewidth=0.8, alpha=0.7)
        _ecdf(ax, fin_m[key], "measured (replay)", color="black")
        _ecdf(ax, fin_s[key], "simulated", color="tab:blue", linestyle="--")
        ax.set_xlabel(f"{key[:-2].upper()} (s)")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    ax = axes[3]
    _ecdf(ax, detail["duration_s"], "measured iteration", color="black")
    if predicted:
        _ecdf(ax, predicted, "profile on the same plans", color="tab:orange", linestyle="--")
    ax.set_xlabel("iteration time (s)")
    ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    ax.legend(fontsize=8)
    fig.suptitle(f"CDFs, simulated vs measured: {title}")
    fig.tight_layout()
    files.append(out / "cdf.png")
    fig.savefig(files[-1], dpi=110)
    plt.close(fig)

    j = fin_m.merge(fin_s, on="id", suffixes=("_real", "_sim"))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, key in zip(axes, PER_REQUEST):
        x, y = j[f"{key}_real"].to_numpy(float), j[f"{key}_sim"].to_numpy(float)
        ok = np.isfinite(x) & np.isfinite(y)
        ax.scatter(x[ok], y[ok], s=14, alpha=0.75)
        if ok.any():
            lo, hi = min(x[ok].min(), y[ok].min()), max(x[ok].max(), y[ok].max())
            ax.plot([lo, hi], [lo, hi], color="gray", linewidth=1)
        ax.set_xlabel(f"measured {key[:-2].upper()} (s)")
        ax.set_ylabel(f"simulated {key[:-2].upper()} (s)")
        ax.grid(alpha=0.3)
    fig.suptitle(f"Per request (paired by id): {title}")
    fig.tight_layout()
    files.append(out / "scatter.png")
    fig.savefig(files[-1], dpi=110)
    plt.close(fig)
    return files


def plot_error_vs_load(points: list[dict], path: Path, xkey: str) -> None:
    """Relative error of each latency's median against load, with the prediction's intervals moved onto
    the same scale: thick bars the model interval, thin bars the workload interval (clipped to the axes)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401

    xs = np.array([p[xkey] for p in points], dtype=float)
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    span = 0.0
    n = len(LATENCIES)
    for j, (key, color) in enumerate(zip(LATENCIES, ("tab:red", "tab:green", "tab:purple", "tab:blue"))):
        shift = xs * (1 + 0.035 * (j - (n - 1) / 2))   # side by side on the log axis
        ys = np.array([np.nan if p["metrics"][key]["median"]["rel_error"] is None else
                       100 * p["metrics"][key]["median"]["rel_error"] for p in points])
        span = max(span, np.nanmax(np.abs(ys)) if np.isfinite(ys).any() else 0.0)
        for name, width, alpha in (("workload", 0.8, 0.45), ("model", 2.5, 0.9)):
            for x, p, y in zip(shift, points, ys):
                iv = p["uncertainty"]["metrics"][f"{key}.median"]
                band, meas = iv[f"{name}_interval"], iv["measured"]
                if band is None or not meas or not np.isfinite(y):
                    continue
                ax.plot([x, x], [100 * (band[0] / meas - 1), 100 * (band[1] / meas - 1)], color=color,
                        linewidth=width, alpha=alpha)
        ax.plot(shift, ys, marker="o", color=color, label=f"{key[:-2].upper()} median")
    lim = max(30.0, 1.6 * span)
    ax.set_ylim(-lim, lim)
    ax.axhline(0, color="gray", linewidth=1)
    ax.set_xscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{x:g}" for x in xs])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("arrival rate (req/s)" if xkey == "rate_rps" else "trace rate scale")
    ax.set_ylabel("(simulated - measured) / measured (%)")
    ax.set_title("Error against load; bars: model (thick) and workload (thin) intervals", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# The command


def run_validation(cfg: ValidateConfig) -> dict:
    scenario, base = load_scenario(cfg.scenario, cfg.overrides)
    choice = choose_profile(scenario, base, cfg.profile, cfg.use)
    from calibration.replay import ReplayConfig, Replayer   # torch
    cfg.use = choice.use
    cfg.profile = str(choice.path)
    threads = cfg.threads if cfg.threads is not None else _profile_threads(choice)
    dtype = cfg.dtype or choice.profile.dtype
    model = _model_of(scenario, base)
    rcfg = ReplayConfig(device=cfg.device, dtype=dtype, threads=threads, clock=cfg.clock, seed=cfg.weights_seed,
                        stream=cfg.stream)
    replayer = Replayer(model, rcfg)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    points = []
    xkey = None
    if cfg.rates:
        xkey = "rate_rps" if scenario.workload.kind == "synthetic" else "rate_scale"
        for r in cfg.rates:
            sub = out / f"rate-{r:g}"
            points.append(validate_point(cfg, replayer, cfg.overrides + [_rate_override(scenario, r)], sub, {xkey: r}))
    else:
        rate = getattr(getattr(scenario.workload, "arrival", None), "rate_rps", None)
        points.append(validate_point(cfg, replayer, list(cfg.overrides), out, {"rate_rps": rate}))
    report = {
        "scenario": scenario.name, "scenario_path": str(cfg.scenario), "overrides": cfg.overrides,
        "profile": str(choice.path), "use": choice.use, "profile_fit": choice.profile.fit.model_dump()
        if choice.profile.fit else None,
        "device": cfg.device, "dtype": dtype, "clock": cfg.clock, "threads": points[0]["replay"]["threads"],
        "device_name": points[0]["replay"]["device_name"], "torch": points[0]["replay"]["torch"],
        "date": _dt.date.today().isoformat(), "command": cfg.command,
        "definitions": {"rel_error": "(simulated - measured) / measured",
                        "targets": "|rel_error| of the median; e2e and itl <= 5%, ttft <= 10% (the CPU targets)",
                        "per_request": "requests finished in both runs, paired by id"},
        "points": points,
    }
    (out / "validation.json").write_text(json.dumps(report, indent=2, default=_json_default) + "\n")
    if cfg.plots and len(points) > 1:
        plot_error_vs_load(points, out / "error_vs_load.png", xkey)
    return report


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, (np.bool_,)):
        return bool(o)
    if isinstance(o, SimpleNamespace):
        return vars(o)
    return str(o)


def print_report(report: dict, file=None) -> None:
    file = file or sys.stdout
    print(f"{report['scenario']}: {report['device_name']}, {report['dtype']}, clock {report['clock']}, "
          f"profile {Path(report['profile']).name} ({report['use']})", file=file)
    head = f"{'point':<14}{'TTFT med':>10}{'TPOT med':>10}{'ITL med':>10}{'E2E med':>10}{'E2E p90':>10}" \
           f"{'makespan':>10}{'tput':>9}  {'dominant':<9}{'widest':<12}{'core':>6}{'plans':>6}"
    print(head, file=file)
    for p in report["points"]:
        m = p["metrics"]
        label = label_text({k: p.get(k) for k in ("rate_rps", "rate_scale")}) or "-"
        row = (f"{label:<14}" + "".join(f"{_pct(m[k]['median']['rel_error']):>10}" for k in LATENCIES)
               + f"{_pct(m['e2e_s']['p90']['rel_error']):>10}{_pct(m['makespan_s']['rel_error']):>10}"
               + f"{_pct(m['output_throughput_tok_s']['rel_error']):>9}  {str(p['uncertainty']['dominant']):<9}"
               + f"{str(p['uncertainty'].get('widest', '-')):<12}"
               + f"{_share(p['step_time'].get('forward_cpu_share') if report['device'] == 'cpu' else None):>6}"
               + f"{'same' if p['replay_consistency'].get('identical') else 'DIFF':>6}")
        print(row, file=file)


def add_validate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help="scenario YAML (its workload is replayed for real and simulated)")
    p.add_argument("--profile", help="fitted profile (default: the scenario's step_time profile)")
    p.add_argument("--use", choices=("linear", "efficiency"), help="which of the profile's models (default linear)")
    p.add_argument("--device", choices=("cpu", "cuda", "mps"), default="cpu")
    p.add_argument("--out", required=True, help="validation.json, measured/ and simulated/ tables and plots go here")
    p.add_argument("--rates", help="comma-separated arrival rates (req/s; a trace's rate_scale) to repeat it at")
    p.add_argument("--clock", choices=("wall", "thread"), default="wall",
                   help="thread: a virtual clock advanced by the CPU time of the one torch thread (shared CPUs; "
                        "needs --device cpu and 1 thread)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: the profile's calibration run's)")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), help="reference model dtype (default: the profile's)")
    p.add_argument("--seeds", type=int, default=5, help="workload replications for the workload interval (default 5)")
    p.add_argument("--replays", type=int, default=1,
                   help="replay each point this many times; the spread of the measured values is reported as the "
                        "measurement's own noise (the tables written are the first replay's)")
    p.add_argument("--model-draws", type=int, default=20,
                   help="step-time model draws for the model interval (default 20)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="dotted.key=value",
                   help="override a scenario field (repeatable)")
    p.add_argument("--no-plots", dest="plots", action="store_false")
    p.add_argument("--json", action="store_true", help="print validation.json")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--engine", choices=("reference", "vllm"), default="reference",
                   help="what measures: the reference model driven by capsim's scheduler (default), or a real vLLM "
                        "engine in its own interpreter (calibration/engines/validate_vllm.py)")
    p.add_argument("--engine-python", help="--engine vllm: python of the engine's venv (default "
                                           "/work/venvs/vllm/bin/python)")


def _floats(text: str) -> list[float]:
    try:
        v = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--rates: expected comma-separated numbers such as 0.2,0.5,1, got {text!r}") from None
    if not v or min(v) <= 0:
        raise ConfigError(f"--rates: expected positive numbers, got {text!r}")
    return v


def _argv_of(args: argparse.Namespace) -> list[str]:
    """The options as given (for the report), when the process was not started as `capsim validate`."""
    out = [args.scenario]
    for name in ("profile", "use", "device", "out", "rates", "clock", "threads", "dtype", "seeds", "replays",
                 "model_draws"):
        v = getattr(args, name, None)
        if v is not None:
            out += [f"--{name.replace('_', '-')}", str(v)]
    for o in args.overrides:
        out += ["--set", o]
    return out


def validate_main(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    if args.seeds < 1 or args.model_draws < 0 or args.replays < 1:
        raise ConfigError("--seeds and --replays must be >= 1, --model-draws >= 0")
    if argv is None:
        argv = sys.argv[2:] if len(sys.argv) > 1 and sys.argv[1] == "validate" else _argv_of(args)
    command = "capsim validate " + " ".join(shlex.quote(a) for a in argv)
    cfg = ValidateConfig(scenario=Path(args.scenario), out=Path(args.out), profile=args.profile, use=args.use,
                         device=args.device, overrides=args.overrides,
                         rates=_floats(args.rates) if args.rates else None, clock=args.clock, threads=args.threads,
                         dtype=args.dtype, seeds=args.seeds, model_draws=args.model_draws, replays=args.replays,
                         plots=args.plots,
                         command=command, stream=None if args.quiet else sys.stderr)
    if getattr(args, "engine", "reference") == "vllm":
        from calibration.engines.validate_vllm import vllm_main
        return vllm_main(args, cfg)
    try:
        report = run_validation(cfg)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2, default=_json_default))
    else:
        print_report(report)
        print(f"wrote {Path(args.out) / 'validation.json'}")
    return 0
