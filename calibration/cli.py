"""`capsim calibrate` and `capsim fit`: argument parsers and entry points (called by capsim.cli).

torch is imported only inside calibrate_main (through calibration.harness), so `capsim` and
`capsim fit` work without torch installed.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from sim.api import ConfigError

DEVICES = ("cpu", "cuda", "mps")
DTYPES = ("bf16", "fp16", "fp32")


def add_calibrate_args(parser: argparse.ArgumentParser) -> None:
    """`capsim calibrate`'s arguments."""
    parser.add_argument("--model", required=True, help="model profile name (profiles/models) or YAML path")
    parser.add_argument("--device", choices=DEVICES, default="cpu")
    parser.add_argument("--dtype", choices=DTYPES, default="bf16")
    parser.add_argument("--grid", choices=("tiny", "quick", "standard", "full"), default="quick",
                        help="shapes to time; cpu grids are smaller than accelerator grids (see docs/calibration.md)")
    parser.add_argument("--out", required=True,
                        help="profile YAML path, or a folder (file named <device>__<model>__<dtype>[__graphs].yaml); "
                             "the raw points CSV goes beside it, and a rerun resumes from it")
    parser.add_argument("--layers", type=int_in(1), default=None,
                        help="time only this many layers and scale to the whole model (default: all that fit)")
    parser.add_argument("--hardware", default=None,
                        help="hardware profile name (profiles/hardware): datasheet peaks for MFU/MBU and the file name")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="replay decode shapes as CUDA graphs at padded batch sizes (a separate profile)")
    parser.add_argument("--attention", choices=("torch", "no-cudnn"), default="torch",
                        help="attention kernels: torch's choice (default), or on CUDA without cuDNN's, which "
                             "build a plan per new shape; `capsim validate` replays with the profile's setting")
    parser.add_argument("--repeats", type=int_in(1), default=None,
                        help="timed runs per shape (default 3 on cpu, 5 else)")
    parser.add_argument("--max-repeats", type=int_in(1), default=None,
                        help="keep repeating (up to this, default 3 x --repeats) while the times spread by more than "
                             "10%% of the median")
    parser.add_argument("--warmup", type=int_in(0), default=None,
                        help="untimed runs per shape (default 1 on cpu, 2 else)")
    parser.add_argument("--threads", type=int_in(1), default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--clock", choices=("wall", "thread"), default="wall",
                        help="thread: time the one torch thread's CPU time instead of wall time (needs --device cpu "
                             "--threads 1; for CPUs shared with other jobs)")
    parser.add_argument("--seed", type=int_in(0, 2**32 - 1), default=0,
                        help="seed of the reference model's weights and inputs (default 0)")
    parser.add_argument("--max-points", type=int_in(0), default=None,
                        help="measure at most this many new points, then stop (rerun to continue)")


def calibrate_main(args: argparse.Namespace) -> int:
    """`capsim calibrate`: time the grid on this device (resumable), fit, write and summarise the profile."""
    from sim.api import load_hardware, load_model
    try:
        _check_repeats(args)
        model = load_model(args.model)
        hardware = load_hardware(args.hardware) if args.hardware else None
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        from calibration.harness import RunConfig, calibrate
    except ImportError as exc:
        print(f"error: capsim calibrate needs torch ({exc}); install it with `pip install torch` "
              "(or `pip install capsim[calibrate]`)", file=sys.stderr)
        return 2
    command = "capsim calibrate " + " ".join(shlex.quote(a) for a in _argv_of(args))
    try:
        cfg = RunConfig(model=model, device=args.device, dtype=args.dtype, grid=args.grid, out=Path(args.out),
                        layers=args.layers, hardware=hardware, cuda_graphs=args.cuda_graphs, attention=args.attention,
                        repeats=args.repeats,
                        max_repeats=args.max_repeats, warmup=args.warmup, seed=args.seed,
                        max_points=args.max_points, threads=args.threads, clock=args.clock, command=command)
        res = calibrate(cfg)
    except KeyboardInterrupt:
        print("\ninterrupted: the finished points are saved; rerun the same command to resume", file=sys.stderr)
        return 130
    except (ValueError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if res.profile is None:
        if res.remaining:
            print(f"{res.measured_now} points measured, {res.remaining} to go (in {res.points_path}); "
                  "rerun the same command to continue")
            return 0
        print(f"no profile written: fewer than 2 shapes ran (see {res.points_path})", file=sys.stderr)
        return 1
    _print_summary(res)
    from calibration.advice import heldout_warning
    fit = res.profile.fit
    warning = heldout_warning(fit.mape if fit is not None else None, args.clock)
    if warning:
        print(warning, file=sys.stderr)
    return 0


def _check_repeats(args: argparse.Namespace) -> None:
    """--max-repeats below the timed runs per shape (--repeats or its default) would be quietly raised to them."""
    if args.max_repeats is None:
        return
    repeats = args.repeats if args.repeats is not None else (3 if args.device == "cpu" else 5)
    if args.max_repeats < repeats:
        given = "--repeats" if args.repeats is not None else f"the default --repeats on {args.device}"
        raise ConfigError(f"--max-repeats {args.max_repeats}: below {given} ({repeats}); expected an integer "
                          f">= {repeats} (the most timed runs per shape, --repeats being the fewest)")


def _argv_of(args: argparse.Namespace) -> list[str]:
    out = ["--model", args.model, "--device", args.device, "--dtype", args.dtype, "--grid", args.grid,
           "--out", str(args.out)]
    for flag, value in (("--layers", args.layers), ("--hardware", args.hardware), ("--repeats", args.repeats),
                        ("--max-repeats", args.max_repeats),
                        ("--warmup", args.warmup), ("--threads", args.threads)):
        if value is not None:
            out += [flag, str(value)]
    if args.cuda_graphs:
        out.append("--cuda-graphs")
    if args.attention != "torch":
        out += ["--attention", args.attention]
    if args.clock != "wall":
        out += ["--clock", args.clock]
    return out


def _print_summary(res) -> None:
    m = res.meta
    print(f"profile: {res.profile_path}")
    print(f"points:  {res.points_path} ({res.measured_now} measured now, {res.skipped} reused)")
    for line in res.report.lines():
        print(f"  {line}")
    vr = res.profile.valid_range
    print(f"  valid range: batch <= {vr.max_batch}, new tokens <= {vr.max_new_tokens}, "
          f"context <= {vr.max_context_tokens}")
    print(f"  measured ceilings: matmul {float(m['matmul_tflops']):.4g} TFLOP/s, copy {float(m['copy_gbs']):.4g} GB/s")
    print("  for a hardware profile's `measured:` block:")
    print(f"    measured: {{matmul_tflops: {float(m['matmul_tflops']):.4g}, copy_bandwidth_gbs: "
          f"{float(m['copy_gbs']):.4g}, dtype: {m['dtype']}, source: \"{res.profile_path.name}\"}}")


# ---------------------------------------------------------------------------------------------
# capsim fit


def add_fit_args(parser: argparse.ArgumentParser) -> None:
    """`capsim fit`'s arguments."""
    parser.add_argument("log", help="per-iteration log CSV (columns in docs/calibration.md), a points CSV written "
                                    "by `capsim calibrate`, or splitwise-sim's perf_model.csv (--format splitwise)")
    parser.add_argument("--model", required=True, help="model profile name or YAML path (for FLOPs and bytes)")
    parser.add_argument("--out", required=True, help="profile YAML to write")
    parser.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    parser.add_argument("--columns", nargs="+", default=[], metavar="OURS=THEIRS",
                        help="map log columns to ours, e.g. duration_ms=iter_ms prefill_tokens=num_prefill_tokens")
    parser.add_argument("--format", choices=("iterations", "points", "splitwise", "vllm", "vllm-log"), default=None,
                        help="input kind (default: points when the file starts with '# format=capsim', vllm for "
                             "a vLLM replay's iterations.jsonl, vllm-log for vLLM's iteration-details log lines, "
                             "else iterations)")
    parser.add_argument("--where", nargs="+", default=[], metavar="COLUMN=VALUE",
                        help="keep only rows with these values (e.g. hardware=a100-80gb tensor_parallel=8)")
    parser.add_argument("--hardware", default=None, help="hardware profile: peak FLOP/s and bandwidth for MFU/MBU")
    parser.add_argument("--devices", type=_positive_int, default=None,
                        help="devices one iteration ran on (tensor parallel); multiplies the peaks "
                             "(splitwise: taken from tensor_parallel)")
    parser.add_argument("--dtype", choices=DTYPES, default="bf16", help="weights and KV format of the logged run")
    parser.add_argument("--peak-tflops", type=_positive_float, default=None, help="peak for MFU when no --hardware")
    parser.add_argument("--bandwidth-gbs", type=_positive_float, default=None,
                        help="bandwidth for MBU when no --hardware")
    parser.add_argument("--cuda-graphs", action="store_true", help="the logged engine ran decode as CUDA graphs")
    parser.add_argument("--shape-cache", type=_positive_int, default=None, metavar="N",
                        help="the engine keeps kernels for its N most recent batch token counts and builds one for "
                             "any other (vLLM 0.32's CPU build: 32): fit that cost too (vllm format)")
    parser.add_argument("--source", default=None, help="provenance text (default: the log path)")


def fit_main(args: argparse.Namespace) -> int:
    """`capsim fit`: fit a profile from an engine log, report the rows used and the held-out error."""
    from calibration.logs import FitLogConfig, fit_log
    from sim.api import check_out_file, load_hardware, load_model
    try:
        check_out_file(args.out, getattr(args, "force", False))
        try:
            model = load_model(args.model)
        except ConfigError as exc:
            raise ConfigError(f"--model: {exc}") from None
        try:
            hardware = load_hardware(args.hardware) if args.hardware else None
        except ConfigError as exc:
            raise ConfigError(f"--hardware: {exc}") from None
        cfg = FitLogConfig(
            log=Path(args.log), model=model, out=Path(args.out),
            columns=_pairs(args.columns, "--columns"), where=_pairs(args.where, "--where"), fmt=args.format,
            hardware=hardware, devices=args.devices,
            dtype=args.dtype, peak_tflops=args.peak_tflops, bandwidth_gbs=args.bandwidth_gbs,
            cuda_graphs=args.cuda_graphs, source=args.source, shape_cache_entries=args.shape_cache,
            command=_fit_command(args))
        res = fit_log(cfg)
    except (ValueError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"profile: {res.path} ({res.report.n_points} iterations, {res.report.n_heldout} held out)")
    for line in res.report.lines():
        print(f"  {line}")
    for line in res.extra:
        print(f"  {line}")
    return 0


def _fit_command(args: argparse.Namespace) -> str:
    argv = [args.log, "--model", args.model, "--out", args.out]
    for flag, values in (("--columns", args.columns), ("--where", args.where)):
        if values:
            argv += [flag, *values]
    for flag, value in (("--format", args.format), ("--hardware", args.hardware), ("--devices", args.devices),
                        ("--dtype", args.dtype), ("--peak-tflops", args.peak_tflops),
                        ("--bandwidth-gbs", args.bandwidth_gbs), ("--shape-cache", args.shape_cache)):
        if value is not None:
            argv += [flag, str(value)]
    if args.cuda_graphs:
        argv.append("--cuda-graphs")
    return "capsim fit " + " ".join(shlex.quote(str(a)) for a in argv)


def _positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (argparse names the flag in its error)."""
    try:
        x = float(text)
    except ValueError:
        x = float("nan")
    if not 0 < x < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return x


def int_in(low: int, high: int | None = None):
    """argparse type: an integer >= low (and <= high when given); argparse names the flag in its error
    (`argument --threads: expected an integer >= 1, got '0'`)."""
    want = f"an integer >= {low:,}" if high is None else f"an integer in {low:,}..{high:,}"

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = None
        if n is None or n < low or (high is not None and n > high):
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}")
        return n
    return parse


_positive_int = int_in(1)


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        for part in item.split(","):
            if not part.strip():
                continue
            key, sep, value = part.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"{flag} {part!r}: expected NAME=VALUE")
            out[key.strip()] = value.strip()
    return out
