"""capsim's command line: one subcommand per question, registered by the modules of capsim.commands.

`main(argv) -> int` so tests call it in-process. A new command goes in a new module of capsim.commands
(with `add_parsers(sub)`), listed in COMMAND_MODULES. Commands that need torch import it lazily.
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


def build_parser() -> argparse.ArgumentParser:
    """The `capsim` argument parser with every registered command."""
    from capsim import __version__
    parser = argparse.ArgumentParser(prog="capsim", description="Capacity planning for LLM inference serving")
    parser.add_argument("--version", action="version", version=f"capsim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse `argv`, run the command, print configuration errors as `error: ...` lines (exit 2)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
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
