"""The arguments of `capsim validate`, in a module of their own: building the command line must not
import the validation machinery (pandas, the replay) for every other command."""

from __future__ import annotations

import argparse
import math

from calibration.cli import int_in
from sim.api import ConfigError


def add_validate_args(p: argparse.ArgumentParser) -> None:
    """The arguments of `capsim validate`."""
    p.add_argument("scenario", help="scenario YAML (its workload is replayed for real and simulated)")
    p.add_argument("--profile", help="fitted profile (default: the scenario's step_time profile)")
    p.add_argument("--use", choices=("linear", "efficiency"), help="which of the profile's models (default linear)")
    p.add_argument("--device", choices=("cpu", "cuda", "mps"), default="cpu")
    p.add_argument("--out", required=True, help="validation.json, measured/ and simulated/ tables and plots go here")
    p.add_argument("--rates", type=rate_list, help="comma-separated arrival rates (req/s; a trace's rate_scale) to repeat it at")
    p.add_argument("--clock", choices=("wall", "thread"), default="wall",
                   help="thread: a virtual clock advanced by the CPU time of the one torch thread (shared CPUs; "
                        "needs --device cpu and 1 thread)")
    p.add_argument("--threads", type=int_in(1), help="torch CPU threads (default: the profile's calibration run's)")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), help="reference model dtype (default: the profile's)")
    p.add_argument("--seeds", type=int, default=5, help="workload replications for the workload interval (default 5)")
    p.add_argument("--replays", type=int, default=1,
                   help="replay each point this many times; the spread of the measured values is reported as the "
                        "measurement's own noise (the tables written are the first replay's)")
    p.add_argument("--model-draws", type=int, default=20,
                   help="step-time model draws for the model interval (default 20)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="dotted.key=value",
                   help="override a scenario field (repeatable)")
    p.add_argument("--no-plots", dest="plots", action="store_false")
    p.add_argument("--json", action="store_true", help="print validation.json")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--engine", choices=("reference", "vllm"), default="reference",
                   help="what measures: the reference model driven by capsim's scheduler (default), or a real vLLM "
                        "engine in its own interpreter (calibration/engines/validate_vllm.py)")
    p.add_argument("--engine-python", help="--engine vllm: python of the engine's venv (default "
                                           "/work/venvs/vllm/bin/python)")
    p.add_argument("--record-only", action="store_true",
                   help="--engine vllm: only replay and write the engine's records and tables (a calibration run for "
                        "`capsim fit OUT/engine/replay-1/iterations.jsonl`); no profile needed")


def rate_list(text: str) -> str:
    """argparse type of --rates: comma-separated positive finite numbers, every item given (`1,,2` is refused,
    not read as 1,2); the text itself is kept (calibration.validate reads it, and records it as given)."""
    items = text.split(",")
    if any(not x.strip() for x in items):
        raise argparse.ArgumentTypeError(f"an empty item in {text!r}; expected comma-separated positive finite "
                                         "numbers such as 0.2,0.5,1 (req/s)")
    try:
        values = [float(x) for x in items]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated positive finite numbers such as 0.2,0.5,1 (req/s), got {text!r}") from None
    bad = [x.strip() for x, v in zip(items, values) if not (math.isfinite(v) and v > 0)]
    if bad:
        raise argparse.ArgumentTypeError(f"expected positive finite numbers, got {bad[0]!r}")
    return text


def check_validate_args(args: argparse.Namespace) -> None:
    """Refuse flags that the chosen --engine would ignore (a ConfigError naming them)."""
    if getattr(args, "engine", "reference") == "vllm":
        return
    given = [flag for flag, on in (("--record-only", getattr(args, "record_only", False)),
                                   ("--engine-python", getattr(args, "engine_python", None) is not None)) if on]
    if given:
        it = "them" if len(given) > 1 else "it"
        raise ConfigError(f"{' and '.join(given)}: only with --engine vllm (the default reference engine would "
                          f"ignore {it}); add --engine vllm or drop {it}")
