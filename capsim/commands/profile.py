"""capsim profile: step-time profiles from measured kernel tables (the `ops` model, issue [gpu-fidelity]).

- `capsim profile compose --model M --hardware H [--tp N] [--pp N] [--ep N] [--dtype bf16|fp8|nvfp4] --out FILE.yaml`: a fitted
  profile for `step_time.model: {kind: profile, path: FILE.yaml}`;
- `capsim profile step --model M --hardware H [--tp N] --batch B --context C [--prefill N]`: one composed
  iteration, by component;
- `capsim profile import-ops SRC --out profiles/ops`: rebuild the shipped kernel tables from the
  aiconfigurator CSVs (../shared/data/profiling/aiconfigurator).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from capsim.argtypes import count, number


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model profile name (profiles/models) or YAML path")
    p.add_argument("--hardware", required=True, help="hardware profile name (profiles/hardware)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs of the replica (default 1)")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages of the replica (default 1)")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel ways of a MoE model's experts over a stage's "
                                                     "tp GPUs (default 1)")
    p.add_argument("--dtype", choices=["bf16", "fp8", "nvfp4"],
                   help="GEMM precision (default bf16; nvfp4: Blackwell tables only)")
    p.add_argument("--tables", help="kernel table set under profiles/ops (default: the hardware's name)")
    p.add_argument("--mixed", choices=["one_pass", "sum"], default="one_pass",
                   help="decodes + prefill chunks as one forward pass (default) or as two iterations")
    p.add_argument("--host-overhead-ms", type=number(0.0, 1e6, what="a time in ms"), help="per-iteration host time (default: sim.io.ops_schema)")
    p.add_argument("--all-reduce", choices=["nccl", "vllm", "sglang", "trtllm"], default="nccl",
                   help="whose all-reduce times tensor parallelism: NCCL's (default) or an engine's own measured one")


def _add_compose(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("compose", help="write a fitted profile composed from measured kernel tables")
    _common(p)
    p.add_argument("--max-batch", type=count(1), default=256, help="largest decode batch of the profile (default 256)")
    p.add_argument("--max-new-tokens", type=count(128), default=8192,
                   help="largest tokens per iteration (default 8192; at least 128: the prefill efficiency is fitted "
                        "over prompts of 16 tokens up to it)")
    p.add_argument("--max-context", type=count(1), help="longest context (default min(model's, 32768))")
    p.add_argument("--out", required=True, help="profile YAML to write")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument("--json", action="store_true", help="print the composition's report as JSON")
    return p


def _add_step(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("step", help="one composed iteration's time, by component")
    _common(p)
    p.add_argument("--batch", type=count(0), default=0, help="decode sequences")
    p.add_argument("--context", type=count(0), default=1024, help="cached tokens per decode sequence")
    p.add_argument("--prefill", type=count(0), default=0, help="prompt tokens of one prefill in the same iteration")
    p.add_argument("--prefill-seqs", type=count(1, 65536), default=None,
                   help="prompts of --prefill tokens (default 1; at most 65,536)")
    p.add_argument("--cached", type=count(0), default=0, help="tokens already cached before each prefill chunk")
    p.add_argument("--allow-extrapolation", action="store_true", help="extrapolate beyond the tables (warns)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def _add_import(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("import-ops", help="rebuild profiles/ops/<card>/ from aiconfigurator's kernel CSVs")
    p.add_argument("src", help="folder with gemm_bf16.csv, gemm_fp8.csv, context/generation_attention_bf16.csv, nccl.csv")
    p.add_argument("--out", required=True, help="output folder (profiles/ops)")
    p.add_argument("--cards", help="comma-separated card folders to write (default: all)")
    p.add_argument("--gemm-fp8-more", help="more per-tensor FP8 GEMM rows in gemm_fp8.csv's schema (gpu,m,n,k,latency_ms): "
                                           "the B200 and H200 rows benchmarks/aiconfigurator_gemm_fp8.py takes from the "
                                           "aiconfigurator wheel, which the snapshot leaves out")
    p.add_argument("--more", help="a folder of the five tables above for GPUs the snapshot leaves out (B300, GB200, "
                                  "GB300), written by benchmarks/aiconfigurator_cards.py from the aiconfigurator wheel")
    return p


def _ops_cfg(args):
    from sim.io.ops_schema import OpsStepTime
    host = None if args.host_overhead_ms is None else args.host_overhead_ms / 1e3
    return OpsStepTime(tables=args.tables, dtype=args.dtype, tp=args.tp, mixed=args.mixed, host_overhead_s=host,
                       all_reduce=args.all_reduce)


def _check(args) -> None:
    from sim.io.errors import ConfigError
    for flag in ("tp", "pp", "ep"):
        if getattr(args, flag) < 1:
            raise ConfigError(f"--{flag}: expected a positive GPU count, got {getattr(args, flag)}")
    if args.host_overhead_ms is not None and args.host_overhead_ms < 0:
        raise ConfigError(f"--host-overhead-ms: expected >= 0, got {args.host_overhead_ms}")


def _cli_advice(exc, advice: str):
    """The ops model's out-of-range error with this command's remedy in place of the scenario's fields."""
    from sim.io.errors import ConfigError
    from sim.models.ops import EXTRAPOLATION_ADVICE
    return ConfigError([line.replace(EXTRAPOLATION_ADVICE, advice) for line in exc.lines])


def cmd_compose(args) -> int:
    """Write the composed profile and print where, with its errors against the composition."""
    from sim.io.outputs import check_out_file
    from sim.models.ops_compose import compose_profile, write_composed
    _check(args)
    if not args.out:
        from sim.io.errors import ConfigError
        raise ConfigError("--out: empty path; give the profile YAML to write")
    check_out_file(args.out, args.force)  # before composing: a folder, an unwritable place or an existing file
    from sim.io.errors import ConfigError
    try:
        profile, report = compose_profile(args.model, args.hardware, args.tp, args.dtype, args.tables, args.mixed,
                                          None if args.host_overhead_ms is None else args.host_overhead_ms / 1e3,
                                          args.max_batch, args.max_new_tokens, args.max_context, args.all_reduce,
                                          args.pp, args.ep)
    except ConfigError as exc:
        raise _cli_advice(exc, "keep --max-batch, --max-new-tokens and --max-context within the tables "
                               "(a profile is composed from measurements only)") from None
    command = "capsim profile " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if len(sys.argv) > 2 else \
        f"capsim profile compose --model {args.model} --hardware {args.hardware} --tp {args.tp} --pp {args.pp} --ep {args.ep}"
    write_composed(profile, args.out, command)
    if args.json:
        print(json.dumps({"out": str(args.out), **report}, indent=2))
    else:
        e, lin = report["errors"]["efficiency"], report["errors"]["linear"]
        lay = profile.parallel
        print(f"wrote {args.out}: {profile.model} on {lay.tp * lay.pp} x {profile.hardware} (tp {lay.tp}, pp {lay.pp}, "
              f"ep {lay.ep}), {profile.dtype}; "
              f"{report['grid_points']} composed iterations; efficiency error median {e[0]:.1%} (max {e[1]:.1%}), "
              f"linear median {lin[0]:.1%} (max {lin[1]:.1%})")
    return 0


def cmd_step(args) -> int:
    """Print one composed iteration by component."""
    from sim.io.profiles import load_hardware, load_model
    from sim.models.ops_compose import build_composed_model, cli_layout, decode_plan, prefill_plan
    from sim.models.spec import ModelSpec
    _check(args)
    spec, hw = ModelSpec(load_model(args.model)), load_hardware(args.hardware)
    from sim.io.errors import ConfigError
    try:
        model = build_composed_model(_ops_cfg(args), spec, hw, cli_layout(spec, args.tp, args.pp, args.ep),
                                     args.dtype or "bf16", args.allow_extrapolation)
    except ConfigError as exc:  # this command's flags, not the scenario field the model names
        raise ConfigError([line.replace("step_time.model.tables (default: the hardware, ", "--tables (default: "
                                        "--hardware, ").replace("step_time.model.tables", "--tables")
                           for line in exc.lines]) from None
    for flag, given in (("--prefill-seqs", args.prefill_seqs is not None), ("--cached", args.cached > 0)):
        if given and not args.prefill:  # it describes the prefill: without one it would be ignored
            raise ConfigError(f"{flag}: only with --prefill (it describes the prefill chunk)")
    plan = decode_plan(args.batch, args.context) if args.batch else None
    if args.prefill:
        plan = prefill_plan(args.prefill_seqs or 1, args.prefill, args.cached, plan)
    if plan is None:
        raise ConfigError("give --batch (decodes) and/or --prefill (prompt tokens)")
    try:
        parts = model.breakdown_s(plan.new_tokens, plan.prefill_seqs, plan.prefill_pairs, plan.decode_seqs,
                                  plan.decode_kv_tokens, plan.decode_logits + plan.prefill_logits,
                                  plan.decode_positions)
        step_s = model.step_s(plan)
    except ConfigError as exc:
        raise _cli_advice(exc, "keep --batch, --context and --prefill within the tables or pass "
                               "--allow-extrapolation (in proportion to the work)") from None
    out = {"step_ms": step_s * 1e3, "one_pass_ms": sum(parts.values()) * 1e3,
           "components_ms": {k: v * 1e3 for k, v in parts.items()}, "tables": model.tables.name,
           "dtype": model.dtype, "tp": model.tp, "pp": args.pp, "ep": args.ep}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{spec.profile.name} on {model.tp} x {hw.name} ({model.dtype}, tables {model.tables.name}): "
          f"{out['step_ms']:.3f} ms ({args.mixed})")
    for k, v in out["components_ms"].items():
        print(f"  {k:22s} {v:9.3f} ms")
    return 0


def cmd_import(args) -> int:
    """Rebuild the kernel tables."""
    from capsim.ops_import import import_ops
    cards = [c.strip() for c in args.cards.split(",")] if args.cards else None
    more = Path(args.gemm_fp8_more) if args.gemm_fp8_more else None
    import_ops(Path(args.src), Path(args.out), cards, gemm_fp8_more=more,
               more=Path(args.more) if args.more else None)
    return 0


def add_parsers(sub) -> None:
    """Register `capsim profile ...` on the `capsim` subparsers."""
    p = sub.add_parser("profile", help="step-time profiles from measured kernel tables (compose, step, import-ops)")
    inner = p.add_subparsers(dest="profile_command", required=True)
    _add_compose(inner).set_defaults(func=cmd_compose)
    _add_step(inner).set_defaults(func=cmd_step)
    _add_import(inner).set_defaults(func=cmd_import)
