"""`capsim plan --gpus N`: the layout search (sim.planning.layouts), reached through `capsim plan`'s
parser (capsim.commands.capacity adds these flags and hands over when --gpus is given)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sim.io.errors import ConfigError
from sim.io.outputs import staged_output


MAX_GPUS = 1024
"""The largest --gpus budget searched: the deployments to rank grow with it (about 4,600 at 1,000 cards)."""


def add_layout_flags(p) -> None:
    """The layout search's flags on `capsim plan`."""
    g = p.add_argument_group("layout search (with --gpus: rank deployments of a GPU budget; docs/disaggregation.md)")
    g.add_argument("--gpus", type=int, metavar="N",
                   help="GPU budget: rank aggregated and disaggregated deployments (tp, pp, ep, replicas, P:D split) "
                        "of N cards by goodput per GPU")
    g.add_argument("--card", metavar="HARDWARE", help="the budget's card (a hardware profile; default: the scenario's)")
    g.add_argument("--tp", metavar="1,2,4,8", help="tensor-parallel degrees to try (default: 1,2,4,8 within N)")
    g.add_argument("--pp", metavar="1,2", help="pipeline stages to try (default: 1)")
    g.add_argument("--ep", metavar="1,8", help="expert-parallel degrees to try, dividing tp (default: 1)")
    g.add_argument("--attention-dp", metavar="1,4", help="attention data-parallel ranks to try (MoE models; ep then "
                                                      "divides attention-dp x tp; default: 1)")
    g.add_argument("--modes", default="agg,disagg", metavar="agg,disagg",
                   help="aggregated replicas, disaggregated prefill/decode pools, or both (default)")
    g.add_argument("--price-per-gpu-hour", type=float, metavar="USD",
                   help="rank by requests per dollar at capacity instead of goodput per GPU")


_ONE_DEPLOYMENT_FLAGS = (
    ("step_time_error", "--step-time-error: only without --gpus (it bands one deployment's capacity: plan the "
                        "deployment the layout search ranks first with it)"),
    ("target_rps", "--target-rps: only without --gpus (it sizes the replicas of one deployment for a rate: plan the "
                   "deployment the layout search ranks first with it, or give a --gpus budget whose capacity "
                   "covers the rate)"),
    ("max_replicas", "--max-replicas: only without --gpus (it bounds --target-rps's replica check; the layout search "
                     "spends the --gpus budget instead)"),
    ("search", "--search: only without --gpus (it ranks configurations of one deployment: plan the deployment the "
               "layout search ranks first with it; --set applies a setting to every deployment)"),
    ("start_rps", "--start-rps: only without --gpus (each deployment's bisection starts from the scenario's rate "
                  "scaled to its GPUs: set that rate with --set, e.g. --set workload.arrival.rate_rps=R)"),
)
"""Flags of `capsim plan` that size or search one deployment, refused with --gpus (attribute, message)."""


def _given(args, dest: str) -> bool:
    """Whether the flag was given: its value differs from the parser's default (None, [] or False)."""
    value = getattr(args, dest, None)
    return value is not None and value is not False and value != []


def cmd_plan_layouts(args) -> int:
    """Run the layout search of `capsim plan --gpus` and print its ranking."""
    from sim.planning.layouts import parse_degrees, print_layout_plan, run_layout_plan
    from sim.planning.slo import parse_slo
    refused = [why for flag, why in _ONE_DEPLOYMENT_FLAGS if _given(args, flag)]
    if refused:  # flags of plan without --gpus the layout search would otherwise ignore without a word
        raise ConfigError(refused)
    if not 1 <= args.gpus <= MAX_GPUS:
        raise ConfigError(f"--gpus: expected a GPU count in 1..{MAX_GPUS:,} (the search ranks every deployment of "
                          f"the budget), got {args.gpus}")
    if args.card is not None:  # an unknown card is the command's error, not every layout's
        from sim.io.profiles import known_names, load_hardware
        try:
            load_hardware(args.card)
        except ConfigError:
            raise ConfigError(f"--card: unknown hardware {args.card!r}; known: {', '.join(known_names('hardware'))}") \
                from None

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    degrees = {"tp": parse_degrees(args.tp, "--tp", None), "pp": parse_degrees(args.pp, "--pp", None),
               "ep": parse_degrees(args.ep, "--ep", None), "dp": parse_degrees(args.attention_dp, "--attention-dp", None)}
    slo = parse_slo(args.slo) if args.slo is not None else None
    with staged_output(args.out, args.force) as stage:  # a used --out is refused before any run, as plan does
        res = run_layout_plan(args.scenario, stage, args.gpus, card=args.card,
                              price_per_gpu_hour=args.price_per_gpu_hour, **degrees,
                              modes=tuple(m.strip() for m in args.modes.split(",") if m.strip()),
                              slo=slo, target=args.attainment, replications=args.replications,
                              requests=args.requests, tol=args.tol, overrides=args.overrides, workers=args.workers,
                              address=args.dask, log=None if args.quiet else log)
        if args.report:  # written with the ranking, all or nothing
            from sim.report import write_layouts_report
            res.files.append(write_layouts_report(stage, args.out))
    res.files = [Path(args.out) / Path(f).relative_to(stage) for f in res.files]
    if args.json:
        print(json.dumps(res.as_dict(), indent=2, default=str))
    else:
        print_layout_plan(res)
        print("wrote " + ", ".join(str(f) for f in res.files))
    if res.rows and not any(r.get("capacity_rps") for r in res.rows):  # an answer ("none"), as plan without --gpus
        print(f"note: none of the {len(res.rows)} deployment(s) of {res.gpus} x {res.card} has a capacity "
              "(each row's note says why)", file=sys.stderr)
    return 0
