"""capsim run, validate-scenario and compare: simulate scenarios and print their summaries."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from capsim.commands.report import add_report_flag, check_report_args, report_after
from sim.io.errors import ConfigError
from sim.io.units import fmt_bytes, parse_bytes


def _add_run(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("run", help="simulate a scenario and print its summary")
    p.add_argument("scenario", help="scenario YAML")
    p.add_argument("--out", help="write summary.json, requests.csv and iterations.csv here (all or nothing)")
    p.add_argument("--force", action="store_true", help="overwrite those files if --out already holds them")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="dotted.key=value",
                   help="override a scenario field (repeatable), e.g. --set scheduler.max_num_seqs=32")
    p.add_argument("--json", action="store_true", help="print summary.json instead of the table")
    p.add_argument("--progress", action="store_true", help="show progress on stderr")
    add_report_flag(p)
    return p


def _fmt_ms(x) -> str:
    return "-" if x is None else f"{x * 1e3:.2f}"


def print_summary(s: dict, file=None) -> None:
    """The run's headline numbers as text on `file` (stdout by default)."""
    file = file or sys.stdout
    def num(x, fmt="{:.3f}"):
        return "-" if x is None else fmt.format(x)
    from sim.io.describe import slo_text, step_time_line
    setup = s.get("setup") or {}
    print(f"scenario {s['scenario']}: {s['completed']}/{s['requests']} completed, {s['rejected']} rejected, "
          f"{s['cancelled']} cancelled, {s['good']} good", file=file)
    if setup:
        print(f"{setup['model']} on {setup['hardware']}, {setup['scheduler']} scheduler; "
              f"{step_time_line(setup['step_time_fit'])}", file=file)
    print(f"makespan {num(s['makespan_s'])} s   throughput {num(s['output_throughput_tok_s'], '{:.1f}')} tok/s, "
          f"{num(s['request_throughput_rps'])} req/s   goodput {num(s['goodput_rps'])} req/s   "
          f"SLO attainment {num(s['slo_attainment'])}"
          + (f" ({slo_text(setup['slo'])})" if setup else ""), file=file)
    stats = ("mean", "median", "p90", "p99", "max")
    cells = {key: [_fmt_ms(s[key][k]) for k in stats] for key in ("ttft_s", "itl_s", "tpot_s", "e2e_s")}
    # 10 characters a column, wider where a value needs it (columns never run together)
    widths = [max(10, 1 + max(len(row[i]) for row in cells.values())) for i in range(len(stats))]
    print(f"{'ms':<6}" + "".join(f"{k:>{w}}" for k, w in zip(stats, widths)), file=file)
    for key, row in cells.items():
        print(f"{key[:-2].upper():<6}" + "".join(f"{c:>{w}}" for c, w in zip(row, widths)), file=file)
    print(f"KV peak {fmt_bytes(s['peak_kv_bytes'])} of {fmt_bytes(s['kv_capacity_bytes'])}   memory fit "
          f"{'yes' if s['memory_fit'] else 'NO (' + '; '.join(memory_misfit(s)) + ')'}   preemptions {s['preemptions']} ({s['recomputed_tokens']} tokens recomputed)",
          file=file)
    print(f"GPU-s per good {num(s['gpu_seconds_per_good'])}   energy per good "
          f"{num(s['energy_j_per_good'], '{:.1f}')} J", file=file)
    par = s.get("parallel")
    if par:  # a replica over several GPUs (sim.models.parallel)
        dp = f"attention dp {par['attention_dp']}, " if par.get("attention_dp", 1) > 1 else ""
        print(f"replica of {par['gpus_per_replica']} GPUs ({dp}tp {par['tp']}, pp {par['pp']}, ep {par['ep']}), "
              f"{par['gpus']} in all; per GPU: weights {fmt_bytes(par['weights_bytes_per_gpu'])}, KV budget "
              f"{fmt_bytes(par['kv_budget_bytes_per_gpu'])}, activations {fmt_bytes(par['activation_bytes_per_gpu'])}",
              file=file)
    if s.get("disaggregation"):  # prefill and decode pools (sim.core.pools)
        from sim.core.pools import describe_pools
        print("\n".join(describe_pools(s["disaggregation"])), file=file)


def memory_misfit(s: dict) -> list[str]:
    """Why summary.json says memory_fit false, in words (each reason with its count)."""
    why = []
    pools = s.get("disaggregation") or {}
    misfits = [(name, p) for name in ("prefill", "decode") if isinstance(p := pools.get(name), dict)
               and p.get("card_fit") is False and "weights_bytes" in p and "kv_budget_bytes" in p]
    if misfits:  # each pool has its own budget: name the pool that does not fit, with its own figures
        for name, p in misfits:
            cards = p.get("gpus_per_replica", 1)
            why.append(f"{name} pool: weights {fmt_bytes(p['weights_bytes'])} + KV budget "
                       f"{fmt_bytes(p['kv_budget_bytes'])} (+ activations) exceed its replica's {cards} "
                       f"card{'s' if cards != 1 else ''}")
    elif not s.get("card_fit", True) and s.get("parallel"):
        par = s["parallel"]
        why.append(f"per GPU, weights {fmt_bytes(par['weights_bytes_per_gpu'])} + KV budget "
                   f"{fmt_bytes(par['kv_budget_bytes_per_gpu'])} (+ activations) exceed the card")
    elif not s.get("card_fit", True):
        why.append(f"weights {fmt_bytes(s['weights_bytes'])} + KV budget {fmt_bytes(s['kv_budget_bytes'])} "
                   "(+ activations) exceed the card")
    if s.get("kv_limited_requests"):
        why.append(f"{s['kv_limited_requests']} request(s) waited for KV")
    if s.get("kv_rejected_requests"):
        why.append(f"{s['kv_rejected_requests']} rejected for lack of KV")
    if s.get("preemptions"):
        why.append(f"{s['preemptions']} preemption(s)")
    return why or ["see summary.json"]


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


RUN_FILES = ("summary.json", "requests.csv", "iterations.csv")


def cmd_run(args) -> int:
    """`capsim run`: simulate one scenario, print its summary, write its tables with --out."""
    from sim.api import run_scenario
    from sim.io.outputs import check_out_dir, staged_output
    check_report_args(args)
    names = RUN_FILES + (("report.html", "scenario.json") if args.report else ())
    if args.out:  # refuse a bad --out before the run, not after it
        check_out_dir(args.out, args.force, names)
    from sim.core.simulation import fewer_collections
    with fewer_collections():  # reading the workload and writing the tables make few reference cycles too
        result = run_scenario(args.scenario, args.overrides, progress=_Progress() if args.progress else None)
        if args.out:
            with staged_output(args.out, args.force, names) as stage:
                result.write(stage)
    if args.json:
        print(json.dumps(result.summary, indent=2))
    else:
        print_summary(result.summary)
        if args.out:
            print(f"wrote {Path(args.out) / 'summary.json'}, requests.csv, iterations.csv")
    if args.report:
        report_after(args, "run")
    return 0


def _add_validate(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("validate-scenario", help="check scenario files and print every error of every file")
    p.add_argument("files", nargs="+")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="dotted.key=value",
                   help="override applied to every file before checking it (repeatable), as run takes it")
    return p


def scenario_errors(files: list[str], overrides: list[str]) -> list[str]:
    """Every error of every scenario file: the schema, then what `run` resolves before it simulates."""
    from sim.core.simulation import Simulation
    from sim.io.config import load_scenario
    errors = []
    for f in files:
        try:
            scenario, base = load_scenario(f, overrides)
        except ConfigError as exc:
            errors.extend(exc.lines)
            continue
        try:
            Simulation(scenario, base).check()
        except ConfigError as exc:  # raised deep inside (`kv.budget: ...`): name the scenario file
            errors.extend(exc.in_file(f).lines)
    return errors


def cmd_validate(args) -> int:
    """`capsim validate-scenario`: check scenario files and print every error of every file: the schema, then what
    `run` resolves before it simulates (model, card, memory and layout, the step-time model and its profile, the
    workload and its trace), so a file said valid here does not fail at the start of a run."""
    errors = scenario_errors(args.files, args.overrides)
    for line in errors:
        print(line)
    if not errors:
        print(f"{len(args.files)} scenario file(s) valid")
    return 2 if errors else 0


def _add_compare(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("compare", help="run several scenarios and print one comparison table")
    p.add_argument("scenarios", nargs="+")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="dotted.key=value",
                   help="override applied to every scenario (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object per scenario")
    p.add_argument("--out", help="also write the table as compare.csv and compare.json here (all or nothing)")
    p.add_argument("--force", action="store_true", help="overwrite compare.csv / compare.json in --out")
    return p


COMPARE_FILES = ("compare.csv", "compare.json")


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
    """`capsim compare`: several scenarios side by side (memory need, deadlines, cost per good result)."""
    from sim.io.outputs import check_out_dir, staged_output
    if args.out:
        check_out_dir(args.out, args.force, COMPARE_FILES)
    errors = scenario_errors(args.scenarios, args.overrides)  # every bad file at once, before running any
    if errors:
        raise ConfigError(errors)
    rows = compare_rows(args.scenarios, args.overrides)
    if args.out:
        import pandas as pd
        with staged_output(args.out, args.force, COMPARE_FILES) as stage:
            pd.DataFrame(rows).to_csv(stage / "compare.csv", index=False)
            (stage / "compare.json").write_text(json.dumps(rows, indent=2) + "\n")
        print(f"wrote {Path(args.out) / 'compare.csv'}, compare.json", file=sys.stderr)
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


def add_parsers(sub) -> None:
    """Register this module's commands on the `capsim` subparsers."""
    _add_run(sub).set_defaults(func=cmd_run)
    _add_validate(sub).set_defaults(func=cmd_validate)
    _add_compare(sub).set_defaults(func=cmd_compare)
