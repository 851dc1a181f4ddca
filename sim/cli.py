"""capsim's command line: memory | run | validate-scenario | compare | sweep | plan | plan-plane | figures |
calibrate | fit | validate.

`main(argv) -> int` so tests call it in-process. `calibrate`, `fit` and `validate` import their code (and torch)
lazily.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sim.errors import ConfigError
from sim.units import fmt_bytes, parse_bytes


# ---- capsim memory ---------------------------------------------------------------------------

def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 1,4,16,64, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _size(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_memory(sub) -> None:
    p = sub.add_parser("memory", help="does this model fit, how many requests fit the KV budget, what each step reads")
    p.add_argument("--model", required=True, help="model profile name (profiles/models) or YAML path")
    p.add_argument("--prompt", type=int, default=2048, help="prompt tokens per request")
    p.add_argument("--output", type=int, default=256, help="output tokens per request")
    p.add_argument("--requests", type=int, default=1, help="requests of this shape held at once")
    p.add_argument("--shared-prefix", type=int, default=0, help="leading prompt tokens identical across requests")
    p.add_argument("--kv-format", default="bf16", help="bf16 | fp16 | fp8 | q8_0 | q4_0")
    p.add_argument("--weight-format", default="bf16", help="bf16 | fp8 | int4 | q2_k")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--kv-budget", type=_size, help="KV budget: 12GiB, 12GB or bytes")
    p.add_argument("--gpu-memory-utilization", type=float,
                   help="instead of --kv-budget: fraction of --hardware memory, minus weights and --activation")
    p.add_argument("--activation", type=_size, default=0, help="activation / CUDA-graph workspace (with utilization)")
    p.add_argument("--hardware", help="hardware profile for the time bound and utilization budget")
    p.add_argument("--batch", type=_int_list, help="reads view: batch sizes, e.g. 1,4,16,64")
    p.add_argument("--context", type=int, help="reads view: context tokens per sequence (default: --prompt)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def cmd_memory(args) -> int:
    from sim.memory import kv_budget_from_utilization, kv_plan
    from sim.modelspec import ModelSpec
    from sim.profile import load_hardware, load_model
    from sim.roofline import b_kv, decode_reads

    spec = ModelSpec(load_model(args.model))
    hw = load_hardware(args.hardware) if args.hardware else None
    budget = args.kv_budget
    if args.gpu_memory_utilization is not None:
        if hw is None:
            raise ConfigError("--gpu-memory-utilization needs --hardware")
        if budget is not None:
            raise ConfigError("give either --kv-budget or --gpu-memory-utilization, not both")
        budget = kv_budget_from_utilization(hw, spec.weight_bytes(args.weight_format), args.gpu_memory_utilization,
                                            args.activation)
    try:
        plan = kv_plan(spec, args.prompt, args.output, args.requests, args.shared_prefix, args.kv_format,
                       args.block_size, budget)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    out = {"model": spec.profile.name, **plan.as_dict(),
           "weight_format": args.weight_format,
           "total_params": spec.total_params,
           "weight_bytes": spec.weight_bytes(args.weight_format),
           "weight_read_bytes_per_step": spec.weight_read_bytes(args.weight_format)}
    if hw is not None:
        out["hardware"] = hw.name
        out["hardware_memory_bytes"] = hw.memory_bytes
    if args.batch:
        ctx = args.context or args.prompt
        peak = hw.peak_flops_per_s("bf16") if hw else None
        bw = hw.bandwidth_bytes_per_s if hw else None
        reads = []
        for b in args.batch:
            r = decode_reads(spec, b, ctx, args.weight_format, args.kv_format, peak, bw)
            reads.append({"batch": b, "context_tokens": ctx, "bytes_per_iteration": r.bytes_per_iteration,
                          "bytes_per_output_token": r.bytes_per_output_token,
                          "weight_bytes_per_output_token": r.weight_bytes_per_output_token,
                          "kv_bytes_per_output_token": r.kv_bytes_per_output_token,
                          "flops_per_iteration": r.flops, "time_bound_s": r.time_bound_s,
                          "memory_bound": r.memory_bound})
        out["reads"] = reads
        out["b_kv"] = b_kv(spec.weight_read_bytes(args.weight_format), ctx, spec.kv_bytes_per_token(args.kv_format))
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    rows = [
        ("model", spec.profile.name),
        ("weights", f"{fmt_bytes(out['weight_bytes'])} ({args.weight_format}); read per step {fmt_bytes(out['weight_read_bytes_per_step'])}"),
        ("KV per token", f"{plan.kv_bytes_per_token:g} B ({args.kv_format})"),
        ("tokens stored per request", f"{plan.tokens_stored_per_request} -> {plan.blocks_per_request} blocks of {plan.block_tokens}"),
        ("KV per request" + (" (private)" if plan.shared_prefix_blocks else ""), fmt_bytes(plan.kv_bytes_per_request)),
        ("shared prefix", f"{plan.shared_prefix_blocks} blocks, {fmt_bytes(plan.shared_prefix_bytes)}"),
        (f"total KV for {plan.requests}", fmt_bytes(plan.total_kv_bytes)),
    ]
    if budget is not None:
        rows += [("KV budget", fmt_bytes(budget)), ("fits", "yes" if plan.fits else "NO"),
                 ("max requests", str(plan.max_requests))]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    if args.batch:
        print()
        print(f"{'batch':>6} {'bytes/iter':>12} {'bytes/token':>12} {'weights/tok':>12} {'KV/tok':>10} {'time bound':>11}")
        for r in out["reads"]:
            tb = f"{r['time_bound_s'] * 1e3:.2f} ms" if r["time_bound_s"] is not None else "-"
            print(f"{r['batch']:>6} {fmt_bytes(r['bytes_per_iteration']):>12} {fmt_bytes(r['bytes_per_output_token']):>12} "
                  f"{fmt_bytes(r['weight_bytes_per_output_token']):>12} {fmt_bytes(r['kv_bytes_per_output_token']):>10} {tb:>11}")
        print(f"b_KV (KV reads reach weight reads) at {args.context or args.prompt} tokens: {out['b_kv']}")
    return 0


# ---- capsim run / validate-scenario ----------------------------------------------------------

def _add_run(sub) -> None:
    p = sub.add_parser("run", help="simulate a scenario and print its summary")
    p.add_argument("scenario", help="scenario YAML")
    p.add_argument("--out", help="write summary.json, requests.csv and iterations.csv here")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="dotted.key=value",
                   help="override a scenario field (repeatable), e.g. --set scheduler.max_num_seqs=32")
    p.add_argument("--json", action="store_true", help="print summary.json instead of the table")
    p.add_argument("--progress", action="store_true", help="show progress on stderr")


def _fmt_ms(x) -> str:
    return "-" if x is None else f"{x * 1e3:.2f}"


def print_summary(s: dict, file=None) -> None:
    file = file or sys.stdout
    def num(x, fmt="{:.3f}"):
        return "-" if x is None else fmt.format(x)
    print(f"scenario {s['scenario']}: {s['completed']}/{s['requests']} completed, {s['rejected']} rejected, "
          f"{s['cancelled']} cancelled, {s['good']} good", file=file)
    print(f"makespan {num(s['makespan_s'])} s   throughput {num(s['output_throughput_tok_s'], '{:.1f}')} tok/s, "
          f"{num(s['request_throughput_rps'])} req/s   goodput {num(s['goodput_rps'])} req/s   "
          f"SLO attainment {num(s['slo_attainment'])}", file=file)
    print(f"{'ms':<6}{'mean':>10}{'median':>10}{'p90':>10}{'p99':>10}{'max':>10}", file=file)
    for key in ("ttft_s", "itl_s", "tpot_s", "e2e_s"):
        st = s[key]
        print(f"{key[:-2].upper():<6}" + "".join(f"{_fmt_ms(st[k]):>10}" for k in ("mean", "median", "p90", "p99", "max")),
              file=file)
    print(f"KV peak {fmt_bytes(s['peak_kv_bytes'])} of {fmt_bytes(s['kv_capacity_bytes'])}   memory fit "
          f"{'yes' if s['memory_fit'] else 'NO'}   preemptions {s['preemptions']} ({s['recomputed_tokens']} tokens recomputed)",
          file=file)
    print(f"GPU-s per good {num(s['gpu_seconds_per_good'])}   energy per good "
          f"{num(s['energy_j_per_good'], '{:.1f}')} J", file=file)


class _Progress:
    """A one-line progress indicator on stderr, redrawn at most every 1% of the requests."""

    def __init__(self, stream=None):
        self.stream, self.last = stream or sys.stderr, -1

    def __call__(self, done: int, total: int) -> None:
        pct = done * 100 // max(total, 1)
        if pct != self.last:
            self.last = pct
            self.stream.write(f"\r{done}/{total} requests done ({pct}%)")
            if done == total:
                self.stream.write("\n")
            self.stream.flush()


def cmd_run(args) -> int:
    from sim.api import run_scenario
    result = run_scenario(args.scenario, args.overrides, progress=_Progress() if args.progress else None)
    if args.out:
        result.write(args.out)
    if args.json:
        print(json.dumps(result.summary, indent=2))
    else:
        print_summary(result.summary)
        if args.out:
            print(f"wrote {Path(args.out) / 'summary.json'}, requests.csv, iterations.csv")
    return 0


def _add_validate(sub) -> None:
    p = sub.add_parser("validate-scenario", help="check scenario files and print every error of every file")
    p.add_argument("files", nargs="+")


def cmd_validate(args) -> int:
    from sim.config import load_scenario
    errors = []
    for f in args.files:
        try:
            load_scenario(f)
        except ConfigError as exc:
            errors.extend(exc.lines)
    for line in errors:
        print(line)
    if not errors:
        print(f"{len(args.files)} scenario file(s) valid")
    return 2 if errors else 0


def _add_compare(sub) -> None:
    p = sub.add_parser("compare", help="run several scenarios and print one comparison table")
    p.add_argument("scenarios", nargs="+")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="dotted.key=value",
                   help="override applied to every scenario (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object per scenario")


def compare_rows(paths: list[str], overrides: list[str]) -> list[dict]:
    """One row per scenario: memory need against the budget, time, deadlines, cost per good result."""
    from sim.api import run_scenario
    rows = []
    for path in paths:
        s = run_scenario(path, overrides).summary
        budget = s["kv_budget_bytes"]
        on_time = s["good"] == s["requests"]
        rows.append({"scenario": s["scenario"], "kv_need_bytes": s["kv_need_bytes"], "kv_budget_bytes": budget,
                     "memory_fit": s["memory_fit"], "makespan_s": s["makespan_s"], "good": s["good"],
                     "requests": s["requests"], "deadline_met": on_time,
                     "feasible": bool(s["memory_fit"] and on_time),
                     "gpu_seconds_per_good": s["gpu_seconds_per_good"], "energy_j_per_good": s["energy_j_per_good"]})
    return rows


def cmd_compare(args) -> int:
    rows = compare_rows(args.scenarios, args.overrides)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    head = f"{'scenario':<22}{'KV need':>12}{'budget':>12}{'fits':>6}{'makespan':>10}{'on time':>9}{'feasible':>9}{'GPU-s/good':>11}{'J/good':>9}"
    print(head)
    for r in rows:
        gpu = "-" if r["gpu_seconds_per_good"] is None else f"{r['gpu_seconds_per_good']:.3f}"
        joule = "-" if r["energy_j_per_good"] is None else f"{r['energy_j_per_good']:.0f}"
        print(f"{r['scenario']:<22}{r['kv_need_bytes'] / 2**20:>8.0f} MiB{r['kv_budget_bytes'] / 2**20:>8.0f} MiB"
              f"{'yes' if r['memory_fit'] else 'no':>6}{r['makespan_s']:>9.2f}s{r['good']:>5}/{r['requests']:<3}"
              f"{'yes' if r['feasible'] else 'no':>9}{gpu:>11}{joule:>9}")
    return 0


# ---- capsim sweep / plan / plan-plane (sim.sweep, sim.plan; Dask imported only to fan out) -------

def _add_fanout(p) -> None:
    where = p.add_mutually_exclusive_group()
    where.add_argument("--workers", type=int, metavar="N",
                       help="worker processes of a local Dask cluster (default: one per core); 1 runs in-process")
    where.add_argument("--dask", metavar="ADDRESS",
                       help="send the work to an existing Dask scheduler, e.g. tcp://10.0.0.5:8786 (workers need "
                            "capsim installed and the scenario's files at the same paths)")


def _add_sweep(sub) -> None:
    p = sub.add_parser("sweep", help="run a scenario over the cross product of --grid values (Dask fan-out)")
    p.add_argument("scenario", help="scenario YAML")
    p.add_argument("--grid", action="append", required=True, metavar="dotted.key=v1,v2,...",
                   help="an axis of the grid (repeatable); values are parsed as YAML, e.g. "
                        "--grid scheduler.max_num_seqs=16,32,64 --grid kv.format=bf16,q8_0")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="dotted.key=value",
                   help="override applied to every point (repeatable)")
    p.add_argument("--out", required=True, help="results.csv, points.jsonl (resumable) and plots go here")
    _add_fanout(p)
    p.add_argument("--fresh", action="store_true", help="ignore points already in OUT/points.jsonl")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar on stderr")


def cmd_sweep(args) -> int:
    from sim.sweep import parse_axes, print_results, run_sweep
    axes = parse_axes(args.grid)
    outcome = run_sweep(args.scenario, axes, args.out, args.overrides, workers=args.workers, address=args.dask,
                        progress=args.progress, fresh=args.fresh)
    print_results(outcome, axes)
    print(f"{outcome.total} points: {outcome.computed} run now, {outcome.skipped} already done"
          f"{f', {len(outcome.failed)} failed' if outcome.failed else ''}; wrote "
          + ", ".join(str(f) for f in outcome.files if f.suffix in (".csv", ".parquet", ".png")))
    for rec in outcome.failed:
        print(f"error: point {rec['key']}: {rec['error'].splitlines()[0]}", file=sys.stderr)
    return 1 if outcome.failed else 0


def _add_plan(sub) -> None:
    p = sub.add_parser("plan", help="goodput capacity, replicas for a target rate, the cheapest configuration")
    p.add_argument("scenario", help="scenario YAML (synthetic workload with a rate, or a trace)")
    p.add_argument("--slo", help="bounds in seconds, e.g. ttft=2,tpot=0.1,e2e=30 (also itl=: each request's "
                                 "largest gap); default: the scenario's slo")
    p.add_argument("--attainment", type=float, default=0.9,
                   help="fraction of requests that must meet every SLO (default 0.9, DistServe's)")
    p.add_argument("--target-rps", type=float, help="total arrival rate to size the cluster for")
    p.add_argument("--search", action="append", default=[], metavar="dotted.key=v1,v2,...",
                   help="an axis of the configuration space (repeatable), e.g. --search scheduler.max_num_seqs=32,64")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="dotted.key=value",
                   help="override a scenario field (repeatable)")
    p.add_argument("--replications", type=int, default=3, help="seeds per rate (default 3)")
    p.add_argument("--requests", type=int, help="requests per run (workload.num_requests, or a trace's max_requests)")
    p.add_argument("--tol", type=float, default=0.02, help="relative width at which bisection stops (default 0.02)")
    p.add_argument("--start-rps", type=float, help="first rate tried (default: the scenario's)")
    p.add_argument("--max-replicas", type=int, default=64, help="largest cluster the replica check tries")
    p.add_argument("--out", required=True, help="plan.json, rates.csv, search.csv and plots go here")
    _add_fanout(p)
    p.add_argument("--json", action="store_true", help="print plan.json instead of the tables")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def cmd_plan(args) -> int:
    from sim.plan import parse_slo, print_plan, run_plan

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    res = run_plan(args.scenario, args.out, slo=parse_slo(args.slo) if args.slo else None, target=args.attainment,
                   target_rps=args.target_rps, search=args.search, overrides=args.overrides,
                   replications=args.replications, requests=args.requests, tol=args.tol, start_rps=args.start_rps,
                   workers=args.workers, address=args.dask, max_replicas=args.max_replicas,
                   log=None if args.quiet else log)
    if args.json:
        print(json.dumps(res.as_dict(), indent=2, default=str))
    else:
        print_plan(res)
        print("wrote " + ", ".join(str(f) for f in res.files))
    return 0


def _add_plane(sub) -> None:
    p = sub.add_parser("plan-plane", help="place scenarios on the memory / deadline plane (reference section 9)")
    p.add_argument("scenarios", nargs="+")
    p.add_argument("--deadline", type=float, help="seconds (default: each scenario's slo.e2e_s)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="dotted.key=value",
                   help="override applied to every scenario (repeatable)")
    p.add_argument("--out", required=True, help="plane.csv and memory_deadline_plane.png go here")
    p.add_argument("--json", action="store_true", help="print one JSON object per scenario")


def cmd_plane(args) -> int:
    from sim.plan import print_plane, run_plane
    rows, files = run_plane(args.scenarios, args.out, args.overrides, args.deadline)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_plane(rows)
        print("wrote " + ", ".join(str(f) for f in files))
    return 0


# ---- capsim figures (sim.figures: the notebooks' figures, drawn with matplotlib) ----------------

def _add_figures(sub) -> None:
    from sim.figures import FIGURES
    p = sub.add_parser("figures", help="write every what-if figure (PNG) and its data (CSV), as the notebooks draw them")
    p.add_argument("--out", required=True, help="NAME.png and NAME[-part].csv go here")
    p.add_argument("--only", nargs="+", action="extend", choices=list(FIGURES), metavar="NAME",
                   help="only these figures (repeatable): " + ", ".join(FIGURES))
    p.add_argument("--data-dir", help="public data folder holding traces/mooncake_fast25 (default: "
                                      "$CAPSIM_SHARED_DATA, else ../shared/data next to the repository); figures "
                                      "that need it are skipped when it is absent")


def cmd_figures(args) -> int:
    from sim.figures import write_figures
    try:
        files, skipped = write_figures(args.out, args.only, args.data_dir,
                                       log=lambda line: print(line, file=sys.stderr, flush=True))
    except FileNotFoundError as exc:
        raise ConfigError(str(exc)) from None
    pngs = [f for f in files if f.suffix == ".png"]
    print(f"wrote {len(pngs)} figure(s) and {len(files) - len(pngs)} data file(s) to {args.out}"
          + (f"; skipped {', '.join(skipped)} (data absent)" if skipped else ""))
    return 0


# ---- calibration (torch, imported lazily) ------------------------------------------------------

def _add_calibration(sub) -> None:
    try:
        from calibration.cli import add_calibrate_args, add_fit_args
    except ImportError:  # calibration not installed: keep the commands, explain on use
        add_calibrate_args = add_fit_args = None
    p = sub.add_parser("calibrate", help="time a reference transformer on this device and write a fitted profile")
    if add_calibrate_args:
        add_calibrate_args(p)
    p = sub.add_parser("fit", help="fit a step-time profile from a serving engine's per-iteration log")
    if add_fit_args:
        add_fit_args(p)


def _add_real_validate(sub) -> None:
    try:
        from calibration.validate import add_validate_args
    except ImportError:  # calibration not installed: keep the command, explain on use
        add_validate_args = None
    p = sub.add_parser("validate", help="replay a scenario for real on this device and measure the simulator's error")
    if add_validate_args:
        add_validate_args(p)


def cmd_real_validate(args) -> int:
    from calibration.validate import validate_main
    return validate_main(args)


def cmd_calibrate(args) -> int:
    from calibration.cli import calibrate_main
    return calibrate_main(args)


def cmd_fit(args) -> int:
    from calibration.cli import fit_main
    return fit_main(args)


COMMANDS = {"memory": cmd_memory, "run": cmd_run, "validate-scenario": cmd_validate, "compare": cmd_compare,
            "sweep": cmd_sweep, "plan": cmd_plan, "plan-plane": cmd_plane, "figures": cmd_figures,
            "calibrate": cmd_calibrate, "fit": cmd_fit,
            "validate": cmd_real_validate}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="capsim", description="Capacity planning for LLM inference serving")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_memory(sub)
    _add_run(sub)
    _add_validate(sub)
    _add_compare(sub)
    _add_sweep(sub)
    _add_plan(sub)
    _add_plane(sub)
    _add_figures(sub)
    _add_calibration(sub)
    _add_real_validate(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except ConfigError as exc:
        for line in exc.lines:
            print(f"error: {line}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if exc.name == "torch":
            print("error: this command needs PyTorch: pip install 'capsim[calibrate]' "
                  "(on the project's machines: pip install torch==2.13.0)", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
