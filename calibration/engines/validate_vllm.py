"""`capsim validate SCENARIO --engine vllm`: the simulator's error against a real vLLM engine.

For each point (the scenario, or each of --rates) it
1. replays the scenario's workload through vLLM (calibration/engines/vllm_replay.py) --replays times and
   reads the measured tables of each replay;
2. simulates the same scenario with the fitted profile (--profile or the scenario's step_time);
3. compares them as `capsim validate` does (calibration/validate.py: per metric and statistic,
   per request, intervals from workload seeds and step-time model draws), against the MEDIAN of
   the replays, with the replays' own spread beside each error;
4. compares iteration composition (calibration/engines/composition.py) on every replay;
5. writes validation.json, measured/ (first replay) and simulated/ tables, each replay's engine
   records under engine/replay-K/, and plots.
An engine that fails midway leaves its measured part written; the report says so.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import sys
from pathlib import Path

import numpy as np

from calibration import validate as V
from calibration import step_checks as SC
from calibration import validate_errors as VE
from calibration import validate_report as VR
from calibration.engines import composition, tables
from calibration.engines.vllm_replay import EngineError, build_spec, engine_python, run_engine
from sim.api import load_scenario


def median_summary(summaries: list[dict]) -> dict:
    """Per compared metric, the median over replays (the reference the error is measured against)."""
    out = dict(summaries[0])
    for key in VE.LATENCIES:
        out[key] = {st: _median([s[key][st] for s in summaries]) for st in VE.STATS}
    for key in VE.SCALARS:
        out[key] = _median([s[key] for s in summaries])
    return out


def _median(values) -> float | None:
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    return float(np.median(v)) if v else None


def spread_block(metrics: dict, summaries: list[dict]) -> dict:
    """Per headline metric: the replays' values, their relative spread ((max - min) / median), whether
    the simulated value lies inside [min, max], and which bound the error is judged by."""
    out = {}
    for key, limit in VE.TARGETS.items():
        vals = [s[key]["median"] for s in summaries if s[key]["median"] is not None]
        med = float(np.median(vals)) if vals else None
        sim = metrics[key]["median"]["simulated"]
        err = metrics[key]["median"]["rel_error"]
        spread = (max(vals) - min(vals)) / med if vals and med else None
        half = spread / 2 if spread is not None else None
        judged = "target" if half is None or limit >= half else "replay spread"
        bound = limit if judged == "target" else half
        out[f"{key}.median"] = {"replays": vals, "replay_median": med, "replay_rel_spread": spread,
                                "simulated": sim, "rel_error": err, "target": limit, "judged_by": judged,
                                "bound": bound, "met": None if err is None else abs(err) <= bound,
                                "inside_replay_range": None if sim is None or not vals else
                                bool(min(vals) <= sim <= max(vals))}
    return out


def _intervals(cfg, overrides, scenario, base, choice, simulated, measured, replays) -> dict:
    workload = []
    for j in range(1, cfg.seeds):
        s2, _ = load_scenario(cfg.scenario, overrides + [f"seed={scenario.seed + j}"])
        workload.append(V.simulation(s2, base, choice).run().summary)
    res, source = SC.residuals(choice.path, choice.profile, choice.use, V._model_of(scenario, base))
    rng = np.random.default_rng([scenario.seed, 7])
    model = []
    for _ in range(cfg.model_draws):
        factors = {k: 1.0 / (1.0 + float(rng.choice(res[k]))) for k in SC.KINDS}
        sim = V.simulation(scenario, base, choice)
        sim.step_time = SC.Perturbed(sim.step_time, factors)
        model.append(sim.run().summary)
    unc = VE.uncertainty_block(simulated, measured, [simulated] + workload, [simulated] + model, replays)
    unc.update(workload_seeds=cfg.seeds, model_draws=cfg.model_draws, interval="5th-95th percentile",
               model_residuals=source)
    return unc


def profile_errors(iterations, choice, scenario, base) -> dict:
    """The profile's error on the engine's own iterations (features as `capsim fit` reads them)."""
    from calibration.fit import Roofline, predictor
    from calibration.engines.vllm_logs import iteration_rows
    from calibration.logs import iteration_observation
    from sim.api import ModelSpec

    cfg = choice.inner
    peak = cfg.peak_tflops * 1e12 if choice.use == "efficiency" and cfg.peak_tflops else None
    pred = predictor(cfg, Roofline(ModelSpec(V._model_of(scenario, base)), choice.profile.dtype, peak, None))
    sc = getattr(cfg, "shape_cache", None)
    r = [pred(o) / o.time_s - 1.0 for o in (iteration_observation(*row) for row in
                                            iteration_rows(iterations, sc.entries if sc is not None else None))]
    r = np.array(r)
    return {"iterations": len(r), "mape": float(np.abs(r).mean()) if len(r) else None,
            "time_bias": float(np.median(r)) if len(r) else None}


def _replay_all(cfg, spec, wl, out: Path, python: Path, log, slo=None) -> tuple[list, list]:
    runs, results = [], []
    for k in range(cfg.replays):
        log(f"  vLLM replay {k + 1}/{cfg.replays} of {len(spec['requests'])} requests ...")
        run = run_engine(spec, out / "engine" / f"replay-{k + 1}", python, cfg.stream)
        run.meta["scenario"] = spec["scenario"]
        tables.with_hit_keys(run.iterations, spec)   # which prefix each request's hits are (shared KV re-reads)
        res = tables.measured_result(run, wl, slo)
        res.write(out / "engine" / f"replay-{k + 1}")
        runs.append(run)
        results.append(res)
        log(f"  replay {k + 1}: {res.summary['completed']} requests in {res.summary['makespan_s']:.2f} s, "
            f"{res.summary['iterations']} iterations, {res.summary['preemptions']} preemptions")
        if not run.complete:
            break
    return runs, results


def validate_point(cfg, python: Path, overrides: list[str], out: Path, label: dict) -> dict:
    """One validation point: replays on vLLM, the simulation, errors, spread and composition."""
    log = (lambda s: print(s, file=cfg.stream, flush=True)) if cfg.stream is not None else (lambda s: None)
    scenario, base = load_scenario(cfg.scenario, overrides)
    choice = V.choose_profile(scenario, base, cfg.profile, cfg.use)
    spec, wl = build_spec(scenario, base, cfg.clock)
    simulated = V.simulation(scenario, base, choice).run()   # first: a profile that cannot run it fails early
    log(f"[{VR.label_text(label) or scenario.name}] replaying on vLLM ...")
    runs, results = _replay_all(cfg, spec, wl, out, python, log, scenario.slo)
    simulated.write(out / "simulated")
    results[0].write(out / "measured")
    summaries = [r.summary for r in results if r.summary["complete"]] or [results[0].summary]
    measured = median_summary(summaries)
    metrics = VE.compare_summaries(simulated.summary, measured)
    comp = [composition.composition_report(scenario, base, r.iterations) for r in runs]
    notes = [n for r in runs for n in r.notes]
    point = {**label, "scenario": scenario.name, "requests": len(wl), "replays": len(results),
             "complete": all(r.complete for r in runs), "notes": notes,
             "completed": {"measured": [s["completed"] for s in summaries], "simulated": simulated.summary["completed"]},
             "iterations": {"measured": [s["iterations"] for s in summaries],
                            "simulated": simulated.summary["iterations"]},
             "preemptions": {"measured": [s["preemptions"] for s in summaries],
                             "simulated": simulated.summary.get("preemptions")},
             "prefix_hit_tokens": {"measured": [s["prefix_hit_tokens"] for s in summaries],
                                   "simulated": simulated.summary.get("prefix_hit_tokens")},
             "metrics": metrics, "targets": spread_block(metrics, summaries),
             "per_request": VE.per_request_errors(simulated.requests, results[0].requests),
             "composition": {"per_replay": comp,
                             "identical_fraction": [c["identical_fraction"] for c in comp]},
             "step_time": profile_errors(runs[0].iterations, choice, scenario, base),
             "uncertainty": _intervals(cfg, overrides, scenario, base, choice, simulated.summary, measured,
                                       summaries),
             "engine": {k: v for k, v in runs[0].meta.items() if k not in ("traceback",)},
             "engine_settings": spec["engine"]}
    if cfg.plots:
        VR.plot_point(results[0], simulated, results[0].iterations, [], out, VR.label_text(label) or scenario.name,
                     results[1:])
    log(f"[{VR.label_text(label) or scenario.name}] " + VR.headline(point) + "; composition identical "
        + ", ".join(f"{c['identical_fraction']:.0%}" for c in comp if c["identical_fraction"] is not None))
    return point


def run_vllm_validation(cfg, engine_python_path: str | None) -> dict:
    """All points of `cfg` against vLLM; writes validation.json and returns the report."""
    python = engine_python(engine_python_path)
    scenario, base = load_scenario(cfg.scenario, cfg.overrides)
    choice = V.choose_profile(scenario, base, cfg.profile, cfg.use)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    points, xkey = [], "rate_rps"
    if cfg.rates:
        xkey = "rate_rps" if scenario.workload.kind == "synthetic" else "rate_scale"
        for r in cfg.rates:
            points.append(validate_point(cfg, python, cfg.overrides + [V._rate_override(scenario, r)],
                                         out / f"rate-{r:g}", {xkey: r}))
    else:
        rate = getattr(getattr(scenario.workload, "arrival", None), "rate_rps", None)
        points.append(validate_point(cfg, python, list(cfg.overrides), out, {"rate_rps": rate}))
    report = {"scenario": scenario.name, "scenario_path": str(cfg.scenario), "overrides": cfg.overrides,
              "engine": "vllm", "engine_python": str(python), "profile": str(choice.path), "use": choice.use,
              "profile_fit": choice.profile.fit.model_dump() if choice.profile.fit else None, "clock": cfg.clock,
              "command": cfg.command, "date": _dt.date.today().isoformat(), "device": "cpu",
              "dtype": points[0]["engine_settings"]["dtype"],
              "device_name": f"vLLM {points[0]['engine'].get('vllm')} on this CPU",
              "threads": points[0]["engine"].get("torch_threads"), "torch": points[0]["engine"].get("torch"),
              "definitions": {"rel_error": "(simulated - median of the replays) / median of the replays",
                              "targets": "|rel_error| of the median; e2e and itl <= 5%, ttft <= 10%, or half the "
                                         "replays' relative spread where that is wider (judged_by says which)",
                              "composition": "iterations with the same requests and token counts, capsim run on "
                                             "the engine's measured iteration durations"},
              "points": points}
    (out / "validation.json").write_text(json.dumps(report, indent=2, default=V._json_default) + "\n")
    if cfg.plots and len(points) > 1:
        VR.plot_error_vs_load(points, out / "error_vs_load.png", xkey)
    return report


def print_vllm_report(report: dict, file=None) -> None:
    """One line per point: errors of the medians, the replays' spread, composition."""
    file = file or sys.stdout
    print(f"{report['scenario']}: {report['device_name']}, clock {report['clock']}, profile "
          f"{Path(report['profile']).name} ({report['use']})", file=file)
    print(f"{'point':<14}{'TTFT med':>10}{'ITL med':>10}{'E2E med':>10}{'spread E2E':>11}{'makespan':>10}"
          f"{'composition':>13}  status", file=file)
    for p in report["points"]:
        m, t = p["metrics"], p["targets"]
        label = VR.label_text({k: p.get(k) for k in ("rate_rps", "rate_scale")}) or "-"
        comp = p["composition"]["identical_fraction"]
        sp = t["e2e_s.median"]["replay_rel_spread"]
        print(f"{label:<14}" + "".join(f"{VR._pct(m[k]['median']['rel_error']):>10}" for k in ("ttft_s", "itl_s", "e2e_s"))
              + f"{'-' if sp is None else f'{sp:.1%}':>11}{VR._pct(m['makespan_s']['rel_error']):>10}"
              + f"{'-' if not comp or comp[0] is None else f'{min(comp):.0%}':>13}  "
              + ("complete" if p["complete"] else "ENGINE FAILED (partial)"), file=file)
        for n in p["notes"]:
            print(f"  note: {n}", file=file)


def record_only(cfg, engine_python_path: str | None) -> int:
    """Replay the scenario --replays times and write the engine's records and tables, nothing else."""
    python = engine_python(engine_python_path)
    scenario, base = load_scenario(cfg.scenario, cfg.overrides)
    spec, wl = build_spec(scenario, base, cfg.clock)
    log = (lambda s: print(s, file=cfg.stream, flush=True)) if cfg.stream is not None else (lambda s: None)
    runs, _ = _replay_all(cfg, spec, wl, Path(cfg.out), python, log, scenario.slo)
    model = base / scenario.model if scenario.model.endswith(".yaml") else scenario.model
    for run in runs:
        print(f"wrote {run.out} (fit a profile: capsim fit {run.out / 'iterations.jsonl'} --model {model} "
              "--out PROFILE.yaml)")
    return 0 if all(r.complete for r in runs) else 1


def vllm_main(args, argv: list[str] | None = None) -> int:
    """`capsim validate ... --engine vllm` (dispatched by capsim/commands/calibration.py)."""
    cfg = V.validate_config(args, argv)
    try:
        if getattr(args, "record_only", False):
            return record_only(cfg, args.engine_python)
        report = run_vllm_validation(cfg, args.engine_python)
    except (EngineError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2, default=V._json_default))
    else:
        print_vllm_report(report)
        print(f"wrote {Path(args.out) / 'validation.json'}")
    return 0 if all(p["complete"] for p in report["points"]) else 1
