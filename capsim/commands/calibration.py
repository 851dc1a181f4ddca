"""capsim calibrate, fit and validate: the torch harness (calibration/), imported lazily."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from capsim.commands.report import add_report_flag, report_after
from sim.io.errors import ConfigError
from sim.io.units import fmt_bytes, parse_bytes


def _add_calibration_calibrate(sub) -> argparse.ArgumentParser:
    try:
        from calibration.cli import add_calibrate_args
    except ImportError:  # calibration not installed: keep the command, explain on use
        add_calibrate_args = None
    p = sub.add_parser("calibrate", help="time a reference transformer on this device and write a fitted profile")
    if add_calibrate_args:
        add_calibrate_args(p)
    return p


def _add_calibration_fit(sub) -> argparse.ArgumentParser:
    try:
        from calibration.cli import add_fit_args
    except ImportError:  # calibration not installed: keep the command, explain on use
        add_fit_args = None
    p = sub.add_parser("fit", help="fit a step-time profile from a serving engine's per-iteration log")
    if add_fit_args:
        add_fit_args(p)
    return p


def _add_real_validate(sub) -> argparse.ArgumentParser:
    try:
        from calibration.validate_args import add_validate_args  # light: no pandas, no replay
    except ImportError:  # calibration not installed: keep the command, explain on use
        add_validate_args = None
    p = sub.add_parser("validate", help="replay a scenario for real on this device and measure the simulator's error")
    if add_validate_args:
        add_validate_args(p)
        add_report_flag(p)
    return p


def cmd_real_validate(args) -> int:
    """`capsim validate`: replay for real and measure the simulator's error (needs torch; --engine vllm: a
    real vLLM engine in its own interpreter, calibration/engines/)."""
    if getattr(args, "engine", "reference") == "vllm":
        from calibration.engines.validate_vllm import vllm_main
        rc = vllm_main(args)
    else:
        from calibration.validate import validate_main
        rc = validate_main(args)
    if rc == 0 and args.report:
        report_after(args, "validation")
    return rc


def cmd_calibrate(args) -> int:
    """`capsim calibrate`: time the reference model on this device and fit a profile (needs torch)."""
    from calibration.cli import calibrate_main
    return calibrate_main(args)


def cmd_fit(args) -> int:
    """`capsim fit`: fit a step-time profile from an engine's per-iteration log."""
    from calibration.cli import fit_main
    return fit_main(args)


def add_parsers(sub) -> None:
    """Register this module's commands on the `capsim` subparsers."""
    _add_calibration_calibrate(sub).set_defaults(func=cmd_calibrate)
    _add_calibration_fit(sub).set_defaults(func=cmd_fit)
    _add_real_validate(sub).set_defaults(func=cmd_real_validate)
