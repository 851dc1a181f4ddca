"""capsim calibrate, fit and validate: the torch harness (calibration/), imported lazily."""

from __future__ import annotations

import argparse
import importlib

from capsim.commands.report import add_report_flag, report_after


def _add(sub, name: str, help_: str, module: str, adder: str) -> argparse.ArgumentParser:
    """Register `name`; its arguments come from calibration (absent when calibration is not installed:
    the command is kept and explains itself on use)."""
    p = sub.add_parser(name, help=help_)
    try:
        add_args = getattr(importlib.import_module(module), adder)
    except ImportError:
        return p
    add_args(p)
    if name == "validate":
        add_report_flag(p)
    return p


def cmd_real_validate(args) -> int:
    """`capsim validate`: replay for real and measure the simulator's error (needs torch; --engine vllm: a
    real vLLM engine in its own interpreter, calibration/engines/)."""
    from calibration.validate_args import check_validate_args
    check_validate_args(args)  # flags the chosen engine would ignore: refused before any replay
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
    _add(sub, "calibrate", "time a reference transformer on this device and write a fitted profile",
         "calibration.cli", "add_calibrate_args").set_defaults(func=cmd_calibrate)
    _add(sub, "fit", "fit a step-time profile from a serving engine's per-iteration log",
         "calibration.cli", "add_fit_args").set_defaults(func=cmd_fit)
    # calibration.validate_args is light: no pandas, no replay
    _add(sub, "validate", "replay a scenario for real on this device and measure the simulator's error",
         "calibration.validate_args", "add_validate_args").set_defaults(func=cmd_real_validate)
