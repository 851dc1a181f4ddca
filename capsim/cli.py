"""capsim's command line: one subcommand per question, registered by the modules of capsim.commands.

`main(argv) -> int` so tests call it in-process. A new command goes in a new module of capsim.commands
(with `add_parsers(sub)`), listed in COMMAND_MODULES, its command names in COMMANDS. Commands that need torch
import it lazily.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from sim.io.errors import ConfigError

COMMAND_MODULES = [
    "capsim.commands.memory",
    "capsim.commands.run",
    "capsim.commands.capacity",
    "capsim.commands.figures",
    "capsim.commands.calibration",
    "capsim.commands.report",
    "capsim.commands.profile",
    "capsim.commands.published",
]

COMMANDS = {
    "memory": "capsim.commands.memory", "run": "capsim.commands.run", "validate-scenario": "capsim.commands.run",
    "compare": "capsim.commands.run", "sweep": "capsim.commands.capacity", "plan": "capsim.commands.capacity",
    "plan-plane": "capsim.commands.capacity", "figures": "capsim.commands.figures",
    "calibrate": "capsim.commands.calibration", "fit": "capsim.commands.calibration",
    "validate": "capsim.commands.calibration", "report": "capsim.commands.report", "profile": "capsim.commands.profile",
    "validate-published": "capsim.commands.published",
}
"""Which module of COMMAND_MODULES registers each command: a command line names one, and only that module (and what
it imports) is loaded to parse it (tests/cli/test_cli_commands.py checks the map against the full parser)."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `capsim` argument parser: with `command` (a key of COMMANDS) only the module that registers it, else
    every registered command (help, --version, a misspelt command: argparse then lists them all)."""
    from capsim import __version__
    parser = argparse.ArgumentParser(prog="capsim", description="Capacity planning for LLM inference serving")
    parser.add_argument("--version", action="version", version=f"capsim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in [COMMANDS[command]] if command in COMMANDS else COMMAND_MODULES:
        importlib.import_module(name).add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse `argv`, run the command, print configuration errors as `error: ...` lines (exit 2)."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    try:
        if getattr(args, "out", None) == "":  # `--out "$DIR"` with DIR unset: not the current folder, not nowhere
            raise ConfigError("--out: empty path (an unset shell variable?); give a folder or file name")
        return args.func(args)
    except ConfigError as exc:
        for line in exc.lines:
            print(f"error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `capsim run ... | head`: the reader left; no traceback for that
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except ModuleNotFoundError as exc:
        if exc.name == "torch":
            print("error: this command needs PyTorch: pip install 'capsim[calibrate]' "
                  "(on the project's machines: pip install torch==2.13.0)", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
