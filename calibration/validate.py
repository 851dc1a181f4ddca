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
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from sim.api import StepTimeConfig, load_scenario
from sim.api import RangeChecked
from sim.api import ConfigError
from sim.api import FittedProfile, load_fitted, load_model
from sim.api import Simulation, resolve_profile_path

from calibration.step_checks import KINDS, Perturbed, plans_check, residuals, step_errors
from calibration.validate_errors import TARGETS, compare_summaries, per_request_errors, uncertainty_block
from calibration.validate_report import headline, label_text, plot_error_vs_load, plot_point, print_report

# ---------------------------------------------------------------------------------------------
# Simulation side


@dataclass
class ProfileChoice:
    """The fitted profile a validation uses, which of its models, and the model it wraps."""
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
    """The Simulation of the scenario with the chosen profile inline and its valid range checked."""
    sim = Simulation(with_profile(scenario, choice), base_dir, lazy_decode=lazy_decode, stream=stream)
    sim.step_time = RangeChecked(sim.step_time, choice.profile.valid_range, choice.path,
                            scenario.step_time.allow_extrapolation, stream)
    return sim


def step_time_model(scenario, base_dir: Path, choice: ProfileChoice):
    """The bare step-time model the simulation evaluates (no range check), for per-iteration errors."""
    return Simulation(with_profile(scenario, choice), base_dir).step_time


# ---------------------------------------------------------------------------------------------
# One validation point


@dataclass
class ValidateConfig:
    """Everything `capsim validate` was asked: scenario, profile, device, clock, loads, seeds, replays, out."""
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


def _profile_meta(choice: ProfileChoice) -> tuple[dict, Path | None]:
    """The meta lines of the profile's calibration points CSV, and that CSV ({}, None when there is none
    beside the profile)."""
    from calibration.points import read_meta
    if not choice.profile.provenance.points_csv:
        return {}, None
    csv = choice.path.parent / choice.profile.provenance.points_csv
    if not csv.is_file():
        return {}, None
    try:
        return read_meta(csv), csv
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{csv}: cannot read the profile's points file ({exc})") from None


def _replay_attention(meta: dict, csv: Path | None) -> str:
    """The attention kernels the profile was calibrated with (points from before the key: torch's choice)."""
    from calibration.model import ATTENTION
    value = meta.get("attention") or "torch"
    if value not in ATTENTION:
        raise ConfigError(f"{csv}: attention: {value!r} is not a calibration setting; expected one of "
                          f"{', '.join(ATTENTION)}")
    return value


def attention_warning(device: str, attention: str, profile_path, known: bool = True) -> str | None:
    """A warning when a CUDA replay will run torch's own attention choice: on an H200 that was cuDNN's
    kernels, which build a plan for every new attention shape, and a replay meets new ones at every step
    (docs/validation.md, "On an H200"); a profile calibrated with --attention no-cudnn avoids it. `known`:
    the profile's points CSV is there to say how it was calibrated."""
    if device != "cuda" or attention != "torch":
        return None
    how = ("calibrated with torch's attention choice" if known else
           "no points CSV beside it says which attention kernels it was calibrated with: replaying with torch's choice")
    return (f"warning: {profile_path}: {how}, which on CUDA may build a plan per new attention shape (cuDNN) and "
            "slow the replay at every step; for a validation, calibrate with `capsim calibrate --attention no-cudnn` "
            "and keep its points CSV beside the profile (docs/validation.md, \"On an H200\")")


def _meta_threads(meta: dict, csv: Path | None) -> int | None:
    """The torch threads of the profile's calibration run (None when not recorded)."""
    t = meta.get("threads")
    if not t:
        return None
    try:
        return int(t)
    except ValueError:
        raise ConfigError(f"{csv}: threads: {t!r} is not a whole number; give --threads") from None


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
    """One load point: replay (repeatedly), simulate, compare, attach intervals, write its files."""
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
    """Whether each metric's median error meets its target (E2E and ITL 5%, TTFT 10%)."""
    out = {}
    for key, limit in TARGETS.items():
        e = metrics[key]["median"]["rel_error"]
        out[f"{key}.median"] = {"abs_rel_error": None if e is None else abs(e), "target": limit,
                                "met": None if e is None else abs(e) <= limit}
    return out


# ---------------------------------------------------------------------------------------------
# The command


def run_validation(cfg: ValidateConfig) -> dict:
    """`capsim validate` end to end: every load point, the error-against-load figure, validation.json."""
    scenario, base = load_scenario(cfg.scenario, cfg.overrides)
    choice = choose_profile(scenario, base, cfg.profile, cfg.use)
    from calibration.replay import ReplayConfig, Replayer   # torch
    cfg.use = choice.use
    cfg.profile = str(choice.path)
    meta, csv = _profile_meta(choice)
    threads = cfg.threads if cfg.threads is not None else _meta_threads(meta, csv)
    dtype = cfg.dtype or choice.profile.dtype
    model = _model_of(scenario, base)
    # the replay's attention kernels are the calibration's
    rcfg = ReplayConfig(device=cfg.device, dtype=dtype, threads=threads, clock=cfg.clock, seed=cfg.weights_seed,
                        attention=_replay_attention(meta, csv), stream=cfg.stream)
    warning = attention_warning(cfg.device, rcfg.attention, choice.path, known=csv is not None)
    if warning:
        print(warning, file=sys.stderr, flush=True)
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
        "device": cfg.device, "dtype": dtype, "clock": cfg.clock, "attention": rcfg.attention,
        "threads": points[0]["replay"]["threads"],
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


def validate_config(args: argparse.Namespace, argv: list[str] | None = None) -> ValidateConfig:
    """The checked ValidateConfig of `capsim validate`'s arguments (also --engine vllm's)."""
    if args.seeds < 1 or args.model_draws < 0 or args.replays < 1:
        raise ConfigError("--seeds and --replays must be >= 1, --model-draws >= 0")
    if argv is None:
        argv = sys.argv[2:] if len(sys.argv) > 1 and sys.argv[1] == "validate" else _argv_of(args)
    command = "capsim validate " + " ".join(shlex.quote(a) for a in argv)
    return ValidateConfig(scenario=Path(args.scenario), out=Path(args.out), profile=args.profile, use=args.use,
                          device=args.device, overrides=args.overrides,
                          rates=_floats(args.rates) if args.rates else None, clock=args.clock, threads=args.threads,
                          dtype=args.dtype, seeds=args.seeds, model_draws=args.model_draws, replays=args.replays,
                          plots=args.plots,
                          command=command, stream=None if args.quiet else sys.stderr)


def validate_main(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    """`capsim validate`'s entry point: check arguments, run, print the report; exit status.
    (--engine vllm goes to calibration.engines.validate_vllm.vllm_main instead: capsim/commands.)"""
    cfg = validate_config(args, argv)
    from calibration.advice import loaded_machine_warning
    from sim.api import check_out_dir
    check_out_dir(args.out, force=True)  # a file, a path under one, /proc: refused before minutes of replay
    warning = loaded_machine_warning(args.device, args.clock)
    if warning:  # the measured side of the comparison is only as good as the machine is quiet
        print(warning, file=sys.stderr)
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
