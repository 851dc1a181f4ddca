"""capsim report: one self-contained report.html for an output folder of `capsim run`, `plan` or `validate`;
and the `--report` flag those commands share (sim.report draws the page)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sim.io.errors import ConfigError

REPORT_HELP = ("also write OUT/report.html: one self-contained page (inline CSS and SVG figures, no script, no "
               "network) and OUT/scenario.json, the scenario it describes")


def add_report_flag(p: argparse.ArgumentParser) -> None:
    """The `--report` flag of run, plan and validate."""
    p.add_argument("--report", action="store_true", help=REPORT_HELP)


def check_report_args(args) -> None:
    """Refuse --report without --out before any work is done."""
    if getattr(args, "report", False) and not getattr(args, "out", None):
        raise ConfigError("--report needs --out: the report is written next to the outputs it shows")


def _announce(path: Path, args) -> None:
    # with --json, stdout is the JSON document: say where the report went on stderr
    print(f"wrote {path}", file=sys.stderr if getattr(args, "json", False) else sys.stdout)


def report_after(args, kind: str) -> Path:
    """After a run, plan or validation wrote OUT: record the scenario and write OUT/report.html."""
    from sim.report import record_scenario, write_plan_report, write_run_report, write_validation_report
    writer = {"run": write_run_report, "plan": write_plan_report, "validation": write_validation_report}[kind]
    info = record_scenario(args.out, args.scenario, list(args.overrides))
    path = writer(args.out, info)
    _announce(path, args)
    return path


def _add_report(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("report", help="write one self-contained report.html for an output folder of run, plan "
                                      "or validate")
    p.add_argument("out_dir", metavar="OUT_DIR", help="the --out folder of capsim run, plan or validate")
    p.add_argument("--scenario", help="the scenario that produced OUT_DIR (default: OUT_DIR/scenario.json, written "
                                      "by --report; a validation also records its scenario in validation.json)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="dotted.key=value",
                   help="the --set overrides the run used (with --scenario; repeatable)")
    p.add_argument("--force", action="store_true", help="replace an existing OUT_DIR/report.html (and a plan's "
                                                        "at-capacity/ run)")
    return p


def check_report_out(out_dir: str | Path, force: bool) -> None:
    """Refuse, before any work, to replace the report.html (and a plan's at-capacity/ folder) that OUT_DIR
    already holds unless `force`; `run/plan/validate --report` check their own --out instead."""
    from sim.report import REPORT_FILE, folder_kind
    from sim.report.plan import AT_CAPACITY
    out = Path(out_dir)
    names = [REPORT_FILE] + ([AT_CAPACITY] if folder_kind(out) == "plan" else [])
    if (out / REPORT_FILE).is_dir():
        raise ConfigError(f"{out}: {REPORT_FILE} is a folder there, where capsim report writes a file; move it")
    present = [n for n in names if (out / n).exists() or (out / n).is_symlink()]
    if present and not force:
        raise ConfigError(f"{out}: already holds {' and '.join(present)}; pass --force to replace "
                          f"{'them' if len(present) > 1 else 'it'}")


def cmd_report(args) -> int:
    """capsim report OUT_DIR [--scenario FILE [--set k=v ...]] [--force]."""
    from sim.report import write_report
    if args.overrides and not args.scenario:
        raise ConfigError("--set needs --scenario (OUT_DIR/scenario.json already holds its overrides)")
    check_report_out(args.out_dir, args.force)
    path = write_report(args.out_dir, scenario_path=args.scenario, overrides=args.overrides)
    _announce(path, args)
    return 0


def add_parsers(sub) -> None:
    """Register this module's commands on the `capsim` subparsers."""
    _add_report(sub).set_defaults(func=cmd_report)
