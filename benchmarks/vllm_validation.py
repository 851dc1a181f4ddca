"""capsim against a real vLLM engine on this machine (run by hand; results in docs/validation/vllm/).

    python benchmarks/vllm_validation.py --out docs/validation/vllm [--rounds 5] [--clock thread] [--order shuffled]
        [--points light,near-saturation,...] [--raw /tmp/capsim-vllm-raw] [--engine-python PATH]

Needs the engine's venv (calibration/engines/vllm_replay.py INSTALL). For each round it replays the
calibration scenarios (default calibrate and three layouts of shared prefixes, none the shared-prefix point's:
calibrate-shared 3 x 384 tokens, calibrate-shared-2x768, calibrate-shared-6x256) and every validation point on vLLM
once, in a seeded random order that changes from round to round (`--order shuffled`, from run 6; runs 1-5 ran the
calibration first, then the points: `--order fixed`), so slow drifts of a shared machine and any effect of a
replay's place in the round hit calibration and validation alike; each replay's records are kept under --raw
(resumable: a complete replay is not run again). Then it
1. fits the step-time profile on the pooled calibration iterations (`capsim fit`'s code, vllm format; the
   prefix-cache-hit KV term only where the calibration has shared prefixes);
2. simulates every point with it and compares with the MEDIAN of the point's replays (per metric,
   with the replays' own spread beside the error, as `capsim validate --engine vllm` does);
3. compares iteration composition on every replay, for capsim's `vllm_v1` policy and for `chunked`
   (chunk_tokens = the budget) on the same measured iteration durations;
4. fits a profile on each replay's own iterations and simulates that replay with it ("own fit"):
   what is left is scheduling, not step time;
5. same-round pairing: fits one profile per round on that round's calibration replays alone and compares each
   point's replay of round k with capsim under round k's profile; per metric the median over rounds of the
   relative errors, judged like the pooled error. Run 6 showed why: the box's speed moved by rounds (every
   replay of its round 3 ran 2-7% faster than the pooled profile, every one of round 4 2-7% slower), and a
   profile pooled over all rounds meets each replay with the average speed. Stated before run 7: from run 7
   the pairing is the headline result and the pooled comparison is reported beside it.
Writes results.json and results.md under --out, and the pooled profile as profile.yaml.

Which form of the shared-KV feature the profile prices (stated before run 5's replays were taken): `rereads`
(the KV of prefix-cache hits that another sequence of the same iteration reads too, every reader but the
first) or `hits` (every KV token read in a prefix-cache hit). Rule: for each calibration scenario with shared
prefixes (three layouts), fit each form on all the other calibration replays (calibrate and the other two
layouts, every round) and take its MAPE on the held-out layout's iterations (every round); the form with the
lower mean of the three held-out MAPEs is the one fitted on the whole pool and used for every point (a tie
within 0.1 percentage point keeps `rereads`, the form already in use). No validation point takes part.
Reported beside it, as a diagnostic only: a three-price fit on the pool (private KV, first read of a hit
prefix, re-read).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from calibration import validate as V  # noqa: E402
from calibration import validate_errors as VE  # noqa: E402
from calibration.engines import composition, tables  # noqa: E402
from calibration.engines.validate_vllm import median_summary, profile_errors, spread_block  # noqa: E402
from calibration.engines.vllm_replay import EngineRun, build_spec, engine_python, run_engine  # noqa: E402
from calibration.logs import FitLogConfig, fit_log  # noqa: E402
from benchmarks import vllm_shared_kv_form as shared_form  # noqa: E402
from sim.api import load_model, load_scenario  # noqa: E402

HERE = REPO / "benchmarks" / "vllm"
POINTS = ("light", "near-saturation", "overload", "shared-prefix", "kv-pressure", "long-prompts")
MODEL = HERE / "qwen3-0.6b-4l.yaml"
# vLLM 0.32's CPU build keeps a oneDNN primitive per batch token count, 32 per linear layer
# (vllm/model_executor/layers/utils.py: create_onednn_mm(weight, 32)); an iteration of any other token count
# builds one first (measured here: +25-30 ms for a fresh 200-240-token iteration of ~60 ms). The profile fits it.
SHAPE_CACHE = 32
CALIBRATION = "calibrate,calibrate-shared,calibrate-shared-2x768,calibrate-shared-6x256"
ORDER_SEED = 20261202   # the shuffled replay order's seed (stated before run 6)


def replay(name: str, r: int, raw: Path, python: Path, clock: str) -> tuple[EngineRun, object]:
    """Replay scenario `name` once (round r) unless a complete replay is on disk; its tables."""
    sc, base = load_scenario(HERE / f"{name}.yaml", [])
    spec, wl = build_spec(sc, base, clock)
    out = raw / name / f"round-{r}"
    meta = out / "meta.json"
    if meta.exists() and json.loads(meta.read_text()).get("status") == "complete":
        run = EngineRun(json.loads(meta.read_text()), _jsonl(out / "iterations.jsonl"),
                        _jsonl(out / "requests.jsonl"), 0, out, out / "engine.log")
    else:
        t = time.time()
        run = run_engine(spec, out, python, sys.stderr)
        print(f"  {name} round {r}: {len(run.requests)} requests, {len(run.iterations)} iterations in "
              f"{time.time() - t:.0f} s wall", file=sys.stderr, flush=True)
    run.meta["scenario"] = sc.name
    tables.with_hit_keys(run.iterations, spec)   # which prefix each request's hits are (shared KV re-reads)
    res = tables.measured_result(run, wl, sc.slo)
    res.write(out)
    return run, res


def round_order(calibrations: list[str], points: list[str], r: int, order: str) -> list[str]:
    """The replays of round r in the order they run: `fixed`, calibration first and then the points; `shuffled`,
    a permutation of both drawn from a generator seeded with the round (the same on every run of the script)."""
    names = list(calibrations) + list(points)
    if order == "fixed":
        return names
    return [names[i] for i in np.random.default_rng([ORDER_SEED, r]).permutation(len(names))]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def fit_pooled(runs: list[EngineRun], out: Path, scenarios_profile: bool, form: str = "rereads") -> Path:
    """One profile from the calibration replays' iterations, pooled (and, when `scenarios_profile`, the
    one the scenarios under benchmarks/vllm/ use)."""
    pooled = out / "calibration-iterations.jsonl"
    with pooled.open("w") as fh:
        for run in runs:   # the records with their hit_keys (the pooled file has no spec beside it)
            fh.write("".join(json.dumps(it) + "\n" for it in run.iterations))
    prof = out / "profile.yaml"
    res = fit_log(FitLogConfig(log=pooled, model=load_model(MODEL), out=prof, dtype="bf16", fmt="vllm",
                               shape_cache_entries=SHAPE_CACHE, shared_kv_form=form,
                               command="benchmarks/vllm_validation.py (pooled calibration replays)"))
    print("  profile: " + "; ".join(res.report.lines()), file=sys.stderr)
    pooled.unlink()
    if scenarios_profile:
        shutil.copyfile(prof, HERE / "vllm-cpu__qwen3-0.6b-4l.yaml")   # the scenarios' step_time profile
    return prof


def own_fit_error(run: EngineRun, res, name: str, tmp: Path, form: str = "rereads") -> dict:
    """Fit a profile on this replay's own iterations, simulate the replay with it: the remaining error."""
    prof = tmp / f"own-{name}-{run.out.name}.yaml"
    fit_log(FitLogConfig(log=run.out / "iterations.jsonl", model=load_model(MODEL), out=prof, dtype="bf16",
                         fmt="vllm", shape_cache_entries=SHAPE_CACHE, shared_kv_form=form))
    sc, base = load_scenario(HERE / f"{name}.yaml", [f"step_time.model.path={prof}",
                                                      "step_time.allow_extrapolation=true"])
    choice = V.choose_profile(sc, base, str(prof), "linear")
    sim = V.simulation(sc, base, choice).run()
    m = VE.compare_summaries(sim.summary, res.summary)
    return {k: m[k]["median"]["rel_error"] for k in ("ttft_s", "itl_s", "e2e_s")}


def compositions(name: str, runs: list[EngineRun]) -> dict:
    """Composition match of capsim's vllm_v1 and chunked policies on each replay's durations."""
    out = {}
    for policy, over in (("vllm_v1", []), ("chunked", ["scheduler.kind=chunked", "scheduler.chunk_tokens=256"])):
        sc, base = load_scenario(HERE / f"{name}.yaml", over)
        reps = [composition.composition_report(sc, base, run.iterations) for run in runs]
        out[policy] = {"identical_fraction": [c["identical_fraction"] for c in reps],
                       "identical_prefix": [c["identical_prefix"] for c in reps],
                       "first_difference": reps[0]["first_difference"], "engine_iterations":
                       [c["engine_iterations"] for c in reps], "capsim_iterations": [c["capsim_iterations"] for c in reps]}
    return out


def evaluate(name: str, runs: list, results: list, prof: Path, tmp: Path, form: str = "rereads") -> dict:
    """One point: simulated (pooled profile) vs the median of the replays, spread, composition, own fit."""
    sc, base = load_scenario(HERE / f"{name}.yaml", [f"step_time.model.path={prof}",
                                                      "step_time.allow_extrapolation=true"])
    choice = V.choose_profile(sc, base, str(prof), "linear")
    simulated = V.simulation(sc, base, choice).run()
    summaries = [r.summary for r in results]
    metrics = VE.compare_summaries(simulated.summary, median_summary(summaries))
    return {"scenario": sc.name, "replays": len(runs), "metrics": metrics, "targets": spread_block(metrics, summaries),
            "preemptions": {"measured": [s["preemptions"] for s in summaries],
                            "simulated": simulated.summary.get("preemptions")},
            "prefix_hit_tokens": {"measured": [s["prefix_hit_tokens"] for s in summaries],
                                  "simulated": simulated.summary.get("prefix_hit_tokens")},
            "iterations": {"measured": [s["iterations"] for s in summaries],
                           "simulated": simulated.summary["iterations"]},
            "composition": compositions(name, runs),
            "profile_on_replay_iterations": [profile_errors(r.iterations, choice, sc, base) for r in runs],
            "own_fit_errors": [own_fit_error(r, res, name, tmp, form) for r, res in zip(runs, results)],
            "cpu_share": [float(np.sum([it["cpu_s"] for it in r.iterations]) /
                                max(1e-9, np.sum([it["duration_s"] for it in r.iterations]))) for r in runs]}


def paired(name: str, results: list, round_profiles: list[Path], targets: dict) -> dict:
    """Same-round pairing: replay k against capsim with the profile fitted on round k's calibration replays
    alone (replayed in the same few minutes, so a slow or fast spell of the box hits both); per metric the
    median over rounds of (simulated - measured) / measured, judged like the pooled error (the target, or half
    the replays' spread where that is wider)."""
    per = {key: [] for key in VE.TARGETS}
    for res, prof in zip(results, round_profiles):
        sc, base = load_scenario(HERE / f"{name}.yaml", [f"step_time.model.path={prof}",
                                                          "step_time.allow_extrapolation=true"])
        sim = V.simulation(sc, base, V.choose_profile(sc, base, str(prof), "linear")).run().summary
        for key in VE.TARGETS:
            m, s = res.summary[key]["median"], sim[key]["median"]
            per[key].append(None if not m or s is None else float(s / m - 1.0))
    out = {}
    for key in VE.TARGETS:
        errs = [e for e in per[key] if e is not None]
        err = float(np.median(errs)) if errs else None
        t = targets[f"{key}.median"]
        out[f"{key}.median"] = {"per_round": per[key], "rel_error": err, "bound": t["bound"],
                                "judged_by": t["judged_by"], "met": None if err is None else abs(err) <= t["bound"]}
    return out


def markdown_paired(report: dict) -> str:
    """The same-round pairing's table (each replay against its own round's profile)."""
    rows = ["| point | TTFT med err | ITL med err | E2E med err | met (by) | E2E error per round |",
            "|---|---|---|---|---|---|"]
    for name, p in report["points"].items():
        t = p["paired"]
        met = ", ".join(f"{k.split('_')[0]} {'yes' if v['met'] else 'no'} "
                        f"({'spread' if v['judged_by'] != 'target' else 'target'})" for k, v in t.items())
        err = [f"{t[k]['rel_error']:+.1%}" for k in ("ttft_s.median", "itl_s.median", "e2e_s.median")]
        rounds = " / ".join(f"{e:+.1%}" for e in t["e2e_s.median"]["per_round"] if e is not None)
        rows.append(f"| {name} | {' | '.join(err)} | {met} | {rounds} |")
    return "\n".join(rows) + "\n"


def markdown(report: dict) -> str:
    """The results table of docs/validation.md."""
    head = ("| point | TTFT med err | ITL med err | E2E med err | replays' E2E spread | met (by) | composition "
            "vllm_v1 | composition chunked | preemptions real / sim | own-fit E2E err |\n|---|---|---|---|---|---|---|---|---|---|")
    rows = [head]
    for name, p in report["points"].items():
        m, t = p["metrics"], p["targets"]

        def pct(x):
            return "-" if x is None else f"{x:+.1%}"
        met = ", ".join(f"{k.split('_')[0]} {'yes' if v['met'] else 'no'} ({'spread' if v['judged_by'] != 'target' else 'target'})"
                        for k, v in t.items())
        comp = {k: "/".join(f"{x:.1%}" for x in v["identical_fraction"]) for k, v in p["composition"].items()}
        own = "/".join(pct(e["e2e_s"]) for e in p["own_fit_errors"])
        sp = t["e2e_s.median"]["replay_rel_spread"]
        rows.append(f"| {name} | {pct(m['ttft_s']['median']['rel_error'])} | {pct(m['itl_s']['median']['rel_error'])} | "
                    f"{pct(m['e2e_s']['median']['rel_error'])} | {'-' if sp is None else f'{sp:.1%}'} | {met} | "
                    f"{comp['vllm_v1']} | {comp['chunked']} | {p['preemptions']['measured']} / "
                    f"{p['preemptions']['simulated']} | {own} |")
    return "\n".join(rows) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(REPO / "docs" / "validation" / "vllm"))
    ap.add_argument("--raw", default="/tmp/capsim-vllm-raw", help="each replay's engine records (resumable)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--points", default=",".join(POINTS))
    ap.add_argument("--clock", choices=("wall", "thread"), default="thread")
    ap.add_argument("--calibration", default=CALIBRATION,
                    help=f"comma-separated calibration scenarios under benchmarks/vllm/, pooled (default {CALIBRATION}; "
                         "calibrate-shared has shared prefixes, calibrate-long more long prompts)")
    ap.add_argument("--shared-kv-form", choices=("rule", *shared_form.FORMS), default="rule",
                    help="the shared-KV feature's form: `rule` (default) picks it on the calibration replays by the "
                         "rule above; rereads or hits force one (to compare on the same replays)")
    ap.add_argument("--order", choices=("shuffled", "fixed"), default="shuffled",
                    help="the replay order within each round: shuffled (default; a seeded permutation of the calibration "
                         "scenarios and the points, a different one per round, so no scenario always runs at the same "
                         "place in a round) or fixed (calibration first, then the points, as runs 1-5 did)")
    ap.add_argument("--engine-python")
    args = ap.parse_args(argv)
    python = engine_python(args.engine_python)
    out, raw = Path(args.out), Path(args.raw)
    out.mkdir(parents=True, exist_ok=True)
    points = [p for p in args.points.split(",") if p]
    calibrations = [c for c in args.calibration.split(",") if c]
    cal, cal_names, cal_rounds, reps = [], [], [], {p: [] for p in points}
    t0 = time.time()
    orders = []
    for r in range(1, args.rounds + 1):
        order = round_order(calibrations, points, r, args.order)
        orders.append(order)
        print(f"round {r}/{args.rounds} ({time.time() - t0:.0f} s): {', '.join(order)}", file=sys.stderr, flush=True)
        for name in order:
            run = replay(name, r, raw, python, args.clock)
            if name in calibrations:
                cal.append(run)
                cal_names.append(name)
                cal_rounds.append(r)
            else:
                reps[name].append(run)
    # the scenarios under benchmarks/vllm/ use the profile of docs/validation/vllm/ (a run elsewhere leaves it)
    scenarios = args.calibration == CALIBRATION and out.resolve() == (REPO / "docs" / "validation" / "vllm").resolve()
    rule = shared_form.choose([(n, run.iterations) for n, (run, _) in zip(cal_names, cal)], SHAPE_CACHE)
    print("\n".join(shared_form.lines(rule)), file=sys.stderr, flush=True)
    form = rule["chosen"] if args.shared_kv_form == "rule" else args.shared_kv_form
    prof = fit_pooled([run for run, _ in cal], out, scenarios, form)
    round_profiles = []
    for r in range(1, args.rounds + 1):   # each round's calibration replays alone, for the same-round pairing
        (out / "rounds" / f"round-{r}").mkdir(parents=True, exist_ok=True)
        round_profiles.append(fit_pooled([run for (run, _), k in zip(cal, cal_rounds) if k == r],
                                         out / "rounds" / f"round-{r}", False, form))
    tmp = raw / "own-fits"
    tmp.mkdir(parents=True, exist_ok=True)
    report = {"engine": cal[0][0].meta.get("vllm"), "torch": cal[0][0].meta.get("torch"), "clock": args.clock,
              "rounds": args.rounds, "calibration": calibrations, "profile": str(prof.relative_to(REPO)) if prof.is_relative_to(REPO) else str(prof),
              "command": "python benchmarks/vllm_validation.py " + " ".join(argv or sys.argv[1:]),
              "wall_s": None, "order": args.order, "round_orders": orders, "shared_kv_form": {"used": form, "by": args.shared_kv_form, **rule}, "points": {}}
    for p in points:
        runs, results = [x[0] for x in reps[p]], [x[1] for x in reps[p]]
        report["points"][p] = evaluate(p, runs, results, prof, tmp, form)
        report["points"][p]["paired"] = paired(p, results, round_profiles, report["points"][p]["targets"])
        print(markdown({"points": {p: report["points"][p]}}).splitlines()[-1], file=sys.stderr, flush=True)
    report["wall_s"] = time.time() - t0
    (out / "results.json").write_text(json.dumps(report, indent=1, default=V._json_default) + "\n")
    how = "by the rule" if args.shared_kv_form == "rule" else "forced by --shared-kv-form"
    (out / "results.md").write_text(markdown(report) + "\nSame-round pairing (each replay against the profile of its "
                                    "own round's calibration replays):\n\n" + markdown_paired(report)
                                    + f"\nshared-KV form used: {form} ({how})\n\n"
                                    + "\n".join(shared_form.lines(rule)) + "\n")
    shutil.rmtree(tmp, ignore_errors=True)
    print(markdown(report) + "\n" + markdown_paired(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
