"""capsim sweep, plan and plan-plane (sim.planning; Dask is imported only to fan out)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from capsim.commands.report import add_report_flag, check_report_args, report_after
from capsim.argtypes import count, dask_address, fraction, number, positive
from capsim.commands.plan_layouts import add_layout_flags, cmd_plan_layouts
from sim.io.errors import ConfigError
from sim.io.outputs import staged_output
from sim.io.units import fmt_bytes, parse_bytes

DEFAULT_MAX_REPLICAS = 64
"""--max-replicas when not given (None in the parser, so that plan --gpus can tell a given one and refuse it)."""


def _add_fanout(p) -> None:
    where = p.add_mutually_exclusive_group()
    where.add_argument("--workers", type=count(1, 4096), metavar="N",
                       help="worker processes of a local Dask cluster (default: one per core); 1 runs in-process")
    where.add_argument("--dask", metavar="ADDRESS", type=dask_address,
                       help="send the work to an existing Dask scheduler, e.g. tcp://10.0.0.5:8786 (workers need "
                            "capsim installed and the scenario's files at the same paths)")


def _add_sweep(sub) -> argparse.ArgumentParser:
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
    p.add_argument("--force", action="store_true", help="write into an --out folder that holds other files "
                                                        "(resuming a sweep in its own folder needs no --force)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar on stderr")
    return p


def cmd_sweep(args) -> int:
    """`capsim sweep`: run the scenario over the grid, resumable, and print the table."""
    from sim.planning.sweep import parse_axes, print_results, run_sweep
    axes = parse_axes(args.grid)
    outcome = run_sweep(args.scenario, axes, args.out, args.overrides, workers=args.workers, address=args.dask,
                        progress=args.progress, fresh=args.fresh, force=args.force)
    print_results(outcome, axes)
    print(f"{outcome.total} points: {outcome.computed} run now, {outcome.skipped} already done"
          f"{f', {len(outcome.failed)} failed' if outcome.failed else ''}; wrote "
          + ", ".join(str(f) for f in outcome.files if f.suffix in (".csv", ".parquet", ".png")))
    for rec in outcome.failed:
        print(f"error: point {rec['key']}: {rec['error'].splitlines()[0]}", file=sys.stderr)
    return 1 if outcome.failed else 0


def _add_plan(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("plan", help="goodput capacity, replicas for a target rate, the cheapest configuration")
    p.add_argument("scenario", help="scenario YAML (synthetic workload with a rate, or a trace)")
    p.add_argument("--slo", help="bounds in seconds, e.g. ttft=2,tpot=0.1,e2e=30 (also itl=: each request's "
                                 "largest gap); default: the scenario's slo")
    p.add_argument("--attainment", type=fraction, default=0.9,
                   help="fraction of requests that must meet every SLO (default 0.9, DistServe's)")
    p.add_argument("--target-rps", type=positive, help="total arrival rate to size the cluster for")
    p.add_argument("--search", action="append", default=[], metavar="dotted.key=v1,v2,...",
                   help="an axis of the configuration space (repeatable), e.g. --search scheduler.max_num_seqs=32,64")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="dotted.key=value",
                   help="override a scenario field (repeatable)")
    p.add_argument("--replications", type=count(1, 1000), default=3, help="seeds per rate (default 3)")
    p.add_argument("--requests", type=count(1, 100_000_000), help="requests per run (workload.num_requests, or a trace's max_requests); with --gpus, the "
                        "scenario's deployment's, scaled to each deployment's GPUs (a deployment on half the "
                        "scenario's GPUs runs half as many)")
    p.add_argument("--tol", type=number(0.0, 1.0, low_open=True), default=0.02, help="relative width at which bisection stops (default 0.02)")
    p.add_argument("--start-rps", type=number(1e-6, 1e9, what="a rate in req/s"),
                   help="first rate tried (default: the scenario's; at least 1e-6)")
    p.add_argument("--max-replicas", type=count(1, 100_000),
                   help=f"largest cluster the replica check tries (default {DEFAULT_MAX_REPLICAS})")
    p.add_argument("--step-time-error", type=number(0.0, 0.99, low_open=True, what="a fraction (0.07 = 7%)"),
                   help="also find the capacity (and replicas) with every step this fraction faster and slower: "
                        "how far the answer moves with the step-time model's error, e.g. the one the run quotes")
    p.add_argument("--out", required=True, help="plan.json, rates.csv, search.csv and plots go here (all or nothing)")
    p.add_argument("--force", action="store_true", help="overwrite files already in --out")
    _add_fanout(p)
    p.add_argument("--json", action="store_true", help="print plan.json instead of the tables")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    add_report_flag(p)
    add_layout_flags(p)
    return p


def cmd_plan(args) -> int:
    """`capsim plan`: goodput capacity, replicas for a target rate, the ranked search."""
    if args.gpus is not None:  # the layout search (capsim.commands.plan_layouts)
        return cmd_plan_layouts(args)
    given = [flag for flag, value in (("--card", args.card), ("--tp", args.tp), ("--pp", args.pp), ("--ep", args.ep),
                                      ("--attention-dp", args.attention_dp),
                                      ("--price-per-gpu-hour", args.price_per_gpu_hour)) if value is not None]
    if args.modes != "agg,disagg":
        given.append("--modes")
    if given:
        raise ConfigError(f"{', '.join(given)}: only with --gpus N (the layout search); without it plan sizes the "
                          "scenario's own layout")
    from sim.planning.capacity import run_plan
    from sim.planning.plan_text import print_plan
    from sim.planning.slo import parse_slo

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    check_report_args(args)
    with staged_output(args.out, args.force) as stage:
        res = _run_plan(args, stage, parse_slo, run_plan, log)
    res.files = [Path(args.out) / Path(f).relative_to(stage) for f in res.files]
    if args.json:
        print(json.dumps(res.as_dict(), indent=2, default=str))
    else:
        print_plan(res)
        print("wrote " + ", ".join(str(f) for f in res.files))
    if args.report:
        report_after(args, "plan")
    return 0


def _run_plan(args, out, parse_slo, run_plan, log):
    return run_plan(args.scenario, out, slo=parse_slo(args.slo) if args.slo is not None else None, target=args.attainment,
                    target_rps=args.target_rps, search=args.search, overrides=args.overrides,
                    replications=args.replications, requests=args.requests, tol=args.tol, start_rps=args.start_rps,
                    workers=args.workers, address=args.dask,
                    max_replicas=DEFAULT_MAX_REPLICAS if args.max_replicas is None else args.max_replicas,
                    log=None if args.quiet else log, step_time_error=args.step_time_error)


def _add_plane(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("plan-plane", help="place scenarios on the memory / deadline plane (reference section 9)")
    p.add_argument("scenarios", nargs="+")
    p.add_argument("--deadline", type=positive, help="seconds (default: each scenario's slo.e2e_s)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="dotted.key=value",
                   help="override applied to every scenario (repeatable)")
    p.add_argument("--out", required=True, help="plane.csv and memory_deadline_plane.png go here (all or nothing)")
    p.add_argument("--force", action="store_true", help="overwrite files already in --out")
    p.add_argument("--json", action="store_true", help="print one JSON object per scenario")
    return p


def cmd_plane(args) -> int:
    """`capsim plan-plane`: the given scenarios on the memory / deadline plane."""
    from sim.planning.plane import print_plane, run_plane
    with staged_output(args.out, args.force) as stage:
        rows, files = run_plane(args.scenarios, stage, args.overrides, args.deadline)
    files = [Path(args.out) / Path(f).relative_to(stage) for f in files]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_plane(rows)
        print("wrote " + ", ".join(str(f) for f in files))
    return 0


def add_parsers(sub) -> None:
    """Register this module's commands on the `capsim` subparsers."""
    _add_sweep(sub).set_defaults(func=cmd_sweep)
    _add_plan(sub).set_defaults(func=cmd_plan)
    _add_plane(sub).set_defaults(func=cmd_plane)
