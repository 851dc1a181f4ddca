"""capsim memory: does this model fit, how many requests fit the KV budget, what each step reads."""

from __future__ import annotations

import argparse
from dataclasses import replace
import json
import sys
from pathlib import Path

from sim.models.memory import STATE_TO_KV_RATIO
from sim.io.errors import ConfigError
from capsim.argtypes import count as _count, fraction as _fraction, int_list as _int_list, size as _size
from sim.io.units import fmt_bytes
from capsim.commands.memory_parallel import add_parallel_args, kv_budget_of, parallel_rows, parallel_view


def _add_memory(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("memory", help="does this model fit, how many requests fit the KV budget, what each step reads")
    p.add_argument("--model", required=True, help="model profile name (profiles/models) or YAML path")
    p.add_argument("--prompt", type=_count(1), default=2048, help="prompt tokens per request")
    p.add_argument("--output", type=_count(1), default=256, help="output tokens per request")
    p.add_argument("--requests", type=_count(1), default=1, help="requests of this shape held at once")
    p.add_argument("--shared-prefix", type=_count(0), default=0, help="leading prompt tokens identical across requests")
    p.add_argument("--kv-format", default="bf16", choices=["fp32", "bf16", "fp16", "fp8", "q8_0", "q4_0"],
                   help="bf16 | fp16 | fp8 | q8_0 | q4_0 | fp32")
    p.add_argument("--weight-format", default="bf16",
                   choices=["fp32", "bf16", "fp16", "fp8", "int4", "nvfp4", "mxfp4", "q2_k"],
                   help="bf16 | fp8 | int4 | nvfp4 (4.5 bits) | mxfp4 (4.25 bits) | q2_k | fp16 | fp32")
    p.add_argument("--expert-weight-format", default=None,
                   choices=["fp32", "bf16", "fp16", "fp8", "int4", "nvfp4", "mxfp4", "q2_k"],
                   help="MoE models: the routed experts' format when not --weight-format's (an experts-only NVFP4 "
                        "checkpoint: --weight-format bf16 --expert-weight-format nvfp4)")
    p.add_argument("--attention-weight-format", default=None,
                   choices=["fp32", "bf16", "fp16", "fp8", "int4", "nvfp4", "mxfp4", "q2_k"],
                   help="the attention matrices' format when not --weight-format's (NVIDIA's DeepSeek NVFP4 "
                        "checkpoints: --weight-format nvfp4 --attention-weight-format bf16)")
    p.add_argument("--block-size", type=_count(1, 65536), default=16, help="tokens per KV block")
    p.add_argument("--kv-budget", type=_size, help="KV budget: 12GiB, 12GB or bytes")
    p.add_argument("--gpu-memory-utilization", type=_fraction,
                   help="instead of --kv-budget: fraction of --hardware memory, minus weights and --activation")
    p.add_argument("--activation", type=_size, default=0, help="activation / CUDA-graph workspace (with utilization)")
    p.add_argument("--state-to-kv-ratio", type=float, default=STATE_TO_KV_RATIO,
                   help="models with linear-attention layers: their state pool's memory relative to the KV pool's "
                        "(a scenario's kv.state_to_kv_ratio; SGLang's --mamba-full-memory-ratio, default 0.9)")
    p.add_argument("--hardware", help="hardware profile for the time bound and utilization budget")
    p.add_argument("--batch", type=_int_list, help="reads view: batch sizes, e.g. 1,4,16,64")
    p.add_argument("--context", type=_count(1), help="reads view: context tokens per sequence (default: --prompt)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_parallel_args(p)
    return p


def _refuse_ignored_flags(args, hw) -> None:
    """A flag that would be ignored is an error, not figures printed without it."""
    for flag, given, needs, present in (("--activation", args.activation, "--gpu-memory-utilization or --hardware",
                                         args.gpu_memory_utilization is not None or hw is not None),
                                        ("--context", args.context, "--batch", bool(args.batch))):
        if given and not present:
            raise ConfigError(f"{flag}: only with {needs} (it has no effect without it)")


def _card_and_context(args, spec, hw, layout, budget, out: dict) -> None:
    """The card (and whether weights + budget fit it: `card_fit`) into `out`; warn, as `capsim run` does, of a
    request longer than the model's context."""
    if hw is not None:
        out["hardware"] = hw.name
        out["hardware_memory_bytes"] = hw.memory_bytes
        if budget is not None and layout.trivial:  # (a layout over several GPUs says fits per GPU)
            out["card_fit"] = out["weight_bytes"] + budget <= hw.memory_bytes
    limit = spec.profile.max_position_embeddings
    if args.prompt + args.output > limit:  # a real engine would refuse such a request
        print(f"warning: --prompt + --output = {args.prompt + args.output:,} positions, more than "
              f"{spec.profile.name}'s {limit:,}; figures as asked, a real engine would refuse the request",
              file=sys.stderr)


def _spec_of(args):
    """The ModelSpec of --model, with --expert-weight-format's routed experts (MoE models only) and
    --attention-weight-format's attention matrices."""
    from sim.io.profiles import load_model
    from sim.models.spec import ModelSpec
    try:
        profile = load_model(args.model)
    except ConfigError as exc:
        raise ConfigError([f"--model: {line}" for line in exc.lines]) from None
    if args.expert_weight_format is not None and profile.moe is None:
        raise ConfigError(f"--expert-weight-format: {profile.name} has no routed experts (a dense model); "
                          "use --weight-format")
    return ModelSpec(profile, expert_format=args.expert_weight_format, attention_format=args.attention_weight_format)


def _text_rows(args, spec, hw, layout, budget, plan, out: dict) -> list[tuple[str, str]]:
    """capsim memory's text lines before the layout's: the model's weights and the requests' KV, with the budget."""
    # under a layout the KV lines below are the fullest GPU's (parallel_view), its attention-DP rank's requests
    gpu = "" if layout.trivial else " per GPU"
    ranks = layout.attention_dp
    rows = [
        ("model", spec.profile.name),
        ("weights", f"{fmt_bytes(out['weight_bytes'])} ({args.weight_format}); read per step {fmt_bytes(out['weight_read_bytes_per_step'])}"),
        ("KV per token" + gpu, f"{plan.kv_bytes_per_token:g} B ({args.kv_format})"),
        ("tokens stored per request", f"{plan.tokens_stored_per_request} -> {plan.blocks_per_request} blocks of {plan.block_tokens}"),
        ("KV per request" + (" (private)" if plan.shared_prefix_blocks else "") + gpu, fmt_bytes(plan.kv_bytes_per_request)),
        ("shared prefix" + gpu, f"{plan.shared_prefix_blocks} blocks, {fmt_bytes(plan.shared_prefix_bytes)}"),
        (f"total KV for {plan.requests}" + gpu, fmt_bytes(plan.total_kv_bytes)
         + (f" (one of {ranks} attention-DP ranks' {plan.requests} of {args.requests} requests)" if ranks > 1 else "")),
    ]
    if "state_bytes_per_request" in out:
        lin = spec.profile.linear_attention
        rows.append(("linear-attention state per request" + gpu, f"{fmt_bytes(out['state_bytes_per_request'])} "
                     f"({lin.layers} layers, {lin.state_format} state; whatever the length)"))
        if "state_slots" in out:
            rows.append(("state pool" + gpu, f"{fmt_bytes(out['state_pool_bytes'])}: {out['state_slots']} requests' state "
                         f"(--state-to-kv-ratio {args.state_to_kv_ratio:g}), the rest of the budget KV"))
    if "window_kv_bytes_per_request" in out:
        p = spec.profile
        rows.append(("sliding-window KV per request", f"{fmt_bytes(out['window_kv_bytes_per_request'])} over the replica "
                     f"({p.sliding_window_layers} layers x {p.sliding_window} tokens; not charged to the pool)"))
    if budget is not None:
        after = " (after the state pool)" if "state_slots" in out else ""
        rows += [("KV budget" + gpu + after, fmt_bytes(budget)), ("fits", "yes" if plan.fits else "NO"),
                 ("max requests" + (" per attention-DP rank" if ranks > 1 else ""), str(plan.max_requests))]
        if out.get("card_fit") is False:  # (known only with --hardware)
            budget += out.get("state_pool_bytes", 0)
            rows.append(("card", f"NO: weights {fmt_bytes(out['weight_bytes'])} + KV budget {fmt_bytes(budget)} "
                                 f"exceed {hw.name}'s {fmt_bytes(hw.memory_bytes)}"))
    return rows


def _state_pool(args, spec, layout, budget) -> dict | None:
    """A linear-attention model's fixed state per request (per GPU under a layout) and, with a budget, the state pool
    it takes (sim.core.sizing: --state-to-kv-ratio r of the KV pool's memory, r / (1 + r) of the budget, in whole
    requests' states); None for other models."""
    from sim.models.memory import state_slots
    from sim.models.parallel import state_bytes_per_sequence_per_gpu
    if spec.profile.linear_attention is None:
        return None
    r = args.state_to_kv_ratio
    if not r > 0:
        raise ConfigError(f"--state-to-kv-ratio: expected a number above 0, got {r:g}")
    per_seq = spec.state_bytes_per_sequence if layout.trivial else state_bytes_per_sequence_per_gpu(spec, layout)
    out = {"state_bytes_per_request": int(per_seq)}
    if budget is not None:
        slots = state_slots(budget, per_seq, r)
        if slots < 1:
            raise ConfigError(f"--state-to-kv-ratio: {r:g} of the KV pool's memory holds no request's linear-attention "
                              f"state ({per_seq / 2**20:,.1f} MiB each); raise it, or give the KV budget more memory")
        out.update(state_slots=slots, state_pool_bytes=slots * per_seq)
    return out


def _with_slots(plan, state: dict | None):
    """`plan` with its max requests capped at the state pool's slots (and fits only if the requests get one)."""
    if state is None or "state_slots" not in state or plan.max_requests is None:
        return plan
    slots = state["state_slots"]
    return replace(plan, max_requests=min(plan.max_requests, slots), fits=bool(plan.fits and plan.requests <= slots))


def cmd_memory(args) -> int:
    """`capsim memory`: weights, KV per request, how many requests fit, and what each step reads."""
    from sim.models.memory import kv_footprint
    from sim.io.profiles import load_hardware
    from sim.models.roofline import b_kv, decode_reads

    spec = _spec_of(args)
    try:
        hw = load_hardware(args.hardware) if args.hardware else None
    except ConfigError as exc:
        raise ConfigError([f"--hardware: {line}" for line in exc.lines]) from None
    _refuse_ignored_flags(args, hw)
    layout, budget = kv_budget_of(args, spec, hw)  # --tp/--pp/--ep: the KV figures below are then per GPU
    if args.shared_prefix > args.prompt:
        raise ConfigError(f"--shared-prefix ({args.shared_prefix}) exceeds --prompt ({args.prompt})")
    state = _state_pool(args, spec, layout, budget)
    kv_budget = budget if state is None or budget is None else budget - state["state_pool_bytes"]
    try:
        plan = _with_slots(kv_footprint(spec, args.prompt, args.output, args.requests, args.shared_prefix,
                                        args.kv_format, args.block_size, kv_budget), state)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    out = {"model": spec.profile.name, **plan.as_dict(),
           "weight_format": args.weight_format,
           **({"expert_weight_format": args.expert_weight_format} if args.expert_weight_format else {}),
           **({"attention_weight_format": args.attention_weight_format} if args.attention_weight_format else {}),
           "total_params": spec.total_params,
           "weight_bytes": spec.weight_bytes(args.weight_format),
           "weight_read_bytes_per_step": spec.weight_read_bytes(args.weight_format), **(state or {})}
    if spec.profile.sliding_window:  # kept beside the pool, not in it (ModelSpec.window_kv_elements_per_sequence)
        from sim.models.formats import kv_bytes_per_element
        window = spec.window_kv_elements_per_sequence * kv_bytes_per_element(args.kv_format)
        out["window_kv_bytes_per_request"] = int(window)
    _card_and_context(args, spec, hw, layout, budget, out)
    if args.batch:
        ctx = args.context or args.prompt
        # a replica's reads over all its GPUs' bandwidth and FLOPs (replicated parts, collectives not counted)
        peak = hw.peak_flops_per_s("bf16") * layout.gpus if hw else None
        bw = hw.bandwidth_bytes_per_s * layout.gpus if hw else None
        reads = []
        for b in args.batch:
            r = decode_reads(spec, b, ctx, args.weight_format, args.kv_format, peak, bw)
            reads.append({"batch": b, "context_tokens": ctx, "bytes_per_iteration": r.bytes_per_iteration,
                          "bytes_per_output_token": r.bytes_per_output_token,
                          "weight_bytes_per_output_token": r.weight_bytes_per_output_token,
                          "kv_bytes_per_output_token": r.kv_bytes_per_output_token,
                          **({"state_bytes_per_output_token": r.state_bytes_per_output_token}
                             if r.state_bytes_per_output_token else {}),
                          "flops_per_iteration": r.flops, "time_bound_s": r.time_bound_s,
                          "memory_bound": r.memory_bound})
        out["reads"] = reads
        out["b_kv"] = b_kv(spec.weight_read_bytes(args.weight_format), ctx, spec.kv_bytes_per_token(args.kv_format))
    if not layout.trivial:
        out["parallel"], plan = parallel_view(args, spec, hw, layout, kv_budget,
                                              (state or {}).get("state_pool_bytes", 0))
        plan = _with_slots(plan, state)
        out.update(plan.as_dict())
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    rows = _text_rows(args, spec, hw, layout, kv_budget, plan, out)
    if "parallel" in out:
        rows += parallel_rows(out["parallel"])
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    if args.batch:
        print()
        print(f"{'batch':>6} {'bytes/iter':>12} {'bytes/token':>12} {'weights/tok':>12} {'KV/tok':>10} {'time bound':>11}")
        for r in out["reads"]:
            tb = f"{r['time_bound_s'] * 1e3:.2f} ms" if r["time_bound_s"] is not None else "-"
            print(f"{r['batch']:>6} {fmt_bytes(r['bytes_per_iteration']):>12} {fmt_bytes(r['bytes_per_output_token']):>12} "
                  f"{fmt_bytes(r['weight_bytes_per_output_token']):>12} {fmt_bytes(r['kv_bytes_per_output_token']):>10} {tb:>11}")
        print(f"b_KV (KV reads reach weight reads) at {args.context or args.prompt} tokens: {out['b_kv']}")
    return 0


def add_parsers(sub) -> None:
    """Register this module's commands on the `capsim` subparsers."""
    _add_memory(sub).set_defaults(func=cmd_memory)
