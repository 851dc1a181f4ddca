"""`capsim memory --tp/--pp/--ep/--attention-dp`: a replica over several GPUs, per GPU (sim.models.parallel).

Weights, KV per token, activations and the KV budget are given per GPU (the fullest one); the KV budget
of the replica is the per-GPU budget times its GPUs; `fits_per_gpu` says whether the fullest GPU holds
its weights, activations and its share of the KV the requests need. A model whose weights fit no GPU of
the layout is refused with the smallest layout that would fit.
"""

from __future__ import annotations

import argparse

from sim.io.errors import ConfigError
from sim.io.units import fmt_bytes


def _degree(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not 1 <= value <= 1024:
        raise argparse.ArgumentTypeError(f"expected a GPU count in 1..1,024, got {text!r}")
    return value


def add_parallel_args(p: argparse.ArgumentParser) -> None:
    """--tp, --pp, --ep on `capsim memory`."""
    p.add_argument("--tp", type=_degree, default=1, help="tensor-parallel GPUs per pipeline stage (default 1)")
    p.add_argument("--pp", type=_degree, default=1, help="pipeline stages (default 1)")
    p.add_argument("--ep", type=_degree, default=1, help="expert-parallel GPUs among the tp of a stage (MoE; default 1)")
    p.add_argument("--attention-dp", type=_degree, default=1,
                   help="attention data-parallel ranks of tp x pp GPUs each (MoE; default 1): each rank holds "
                        "everything but the routed experts and its own requests' KV; experts spread over "
                        "attention-dp x tp GPUs, of which --ep hold whole experts")


class _PerGpu:
    """A spec stand-in for kv_footprint: KV bytes per token on the fullest GPU."""

    def __init__(self, per_token: float):
        self.per_token = per_token

    def kv_bytes_per_token(self, fmt: str) -> float:
        """The fullest GPU's KV bytes per token (whatever `fmt`: computed for the command's format)."""
        return self.per_token


def layout_of(args, spec):
    """The command's layout, checked against the model (errors name --tp/--pp/--ep and the allowed values)."""
    from sim.models.parallel import Layout, layout_problems
    dp = getattr(args, "attention_dp", 1)
    experts = args.tp * dp
    if experts % args.ep:
        what = f"--tp ({args.tp})" if dp == 1 else f"--attention-dp x --tp ({experts})"
        raise ConfigError(f"--ep: {args.ep} must divide {what}; allowed: "
                          f"{[d for d in range(1, experts + 1) if experts % d == 0]}")
    layout = Layout(args.tp, args.pp, args.ep, attention_dp=dp)
    problems = layout_problems(spec, layout, "parallel")
    if problems:
        flags = [line.replace("parallel.", "--", 1) for line in problems]
        raise ConfigError([line.replace("--attention_dp", "--attention-dp", 1) for line in flags])
    return layout


def kv_budget_of(args, spec, hw):
    """(layout, KV budget per GPU or None): --kv-budget (the replica's, split over its GPUs) or
    --gpu-memory-utilization of the card less the fullest GPU's weights and --activation. A model whose
    weights do not fit is refused with the smallest layout that would fit."""
    from sim.models.memory import kv_budget_from_utilization
    from sim.models.parallel import weights_per_gpu
    layout = layout_of(args, spec)
    budget = args.kv_budget if (args.kv_budget is None or layout.trivial) else args.kv_budget // layout.gpus
    if hw is not None and args.gpu_memory_utilization is None:
        why = not_fitting(spec, hw, layout, args.weight_format, hw.memory_bytes, args.activation)
        if why:
            raise ConfigError(why)
    if args.gpu_memory_utilization is not None:
        if hw is None:
            raise ConfigError("--gpu-memory-utilization needs --hardware")
        if budget is not None:
            raise ConfigError("give either --kv-budget or --gpu-memory-utilization, not both")
        try:
            budget = kv_budget_from_utilization(hw, weights_per_gpu(spec, layout, args.weight_format).total,
                                                args.gpu_memory_utilization, args.activation)
        except ValueError as exc:
            why = not_fitting(spec, hw, layout, args.weight_format, args.gpu_memory_utilization * hw.memory_bytes,
                              args.activation)
            raise ConfigError(f"--gpu-memory-utilization {args.gpu_memory_utilization}: {exc}"
                              + (f"; {why}" if why else "")) from None
    return layout, budget


def not_fitting(spec, hw, layout, fmt: str, usable: float, reserve: int) -> str | None:
    """Why the weights do not fit the fullest GPU (with the smallest layout that would), or None."""
    from sim.models.parallel import KV_HEADROOM, nothing_fits, smallest_fitting_layout, weights_per_gpu
    w = weights_per_gpu(spec, layout, fmt).total
    if w + reserve <= usable:
        return None
    where = f"one {hw.name}" if layout.trivial else f"{layout.describe()} ({layout.gpus} x {hw.name})"
    per = "" if layout.trivial else " per GPU"
    msg = (f"{spec.profile.name} ({fmt}) does not fit {where}: {fmt_bytes(w)} of weights{per}"
           + (f" + {fmt_bytes(reserve)} of activations" if reserve else "") + f" > {fmt_bytes(usable)} usable")
    best = smallest_fitting_layout(spec, int(usable), fmt, reserve)
    if best is None:
        return msg + nothing_fits(spec, int(usable), fmt, reserve, "--weight-format")
    msg += f"; the smallest layout that fits is {_suggest(spec, best, fmt)}, leaving {KV_HEADROOM:.0%} or more for KV"
    tp_only = smallest_fitting_layout(spec, int(usable), fmt, reserve, max_pp=1)
    if best.pp > 1 and tp_only is not None:
        msg += f"; with tensor parallelism alone: {_suggest(spec, tp_only, fmt)}"
    return msg


def _suggest(spec, lay, fmt: str) -> str:
    from sim.models.parallel import weights_per_gpu
    flags = (f"--tp {lay.tp}" + (f" --pp {lay.pp}" if lay.pp > 1 else "") + (f" --ep {lay.ep}" if lay.ep > 1 else "")
             + (f" --attention-dp {lay.attention_dp}" if lay.attention_dp > 1 else ""))
    return f"{lay.describe()} ({lay.gpus} GPUs, {fmt_bytes(weights_per_gpu(spec, lay, fmt).total)} of weights per GPU: {flags})"


def parallel_view(args, spec, hw, layout, budget_per_gpu: int | None,
                  state_pool_per_gpu: int = 0) -> tuple[dict, object]:
    """(`parallel` JSON block, KV footprint per GPU) for a multi-GPU layout; `budget_per_gpu` is the KV pool's, beside
    a linear-attention model's state pool of `state_pool_per_gpu` (counted in what each GPU must hold)."""
    from sim.models.memory import kv_footprint
    from sim.models.parallel import kv_bytes_per_token_per_gpu, kv_replication, weights_per_gpu
    w = weights_per_gpu(spec, layout, args.weight_format)
    per_token = kv_bytes_per_token_per_gpu(spec, layout, args.kv_format)
    try:
        # attention data-parallel ranks share the requests out: a GPU holds its rank's (the busiest) share
        requests = -(-args.requests // layout.attention_dp)
        plan = kv_footprint(_PerGpu(per_token), args.prompt, args.output, requests, args.shared_prefix,
                            args.kv_format, args.block_size, budget_per_gpu)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    block = {"tp": layout.tp, "pp": layout.pp, "ep": layout.ep, "gpus": layout.gpus,
             "weights_per_gpu": w.as_dict(), "kv_bytes_per_token_per_gpu": per_token,
             "kv_replication": kv_replication(spec, layout), "activation_bytes_per_gpu": args.activation,
             "kv_bytes_per_gpu": plan.total_kv_bytes, "kv_budget_bytes_per_gpu": budget_per_gpu,
             "kv_budget_bytes_per_replica": budget_per_gpu * layout.gpus if budget_per_gpu is not None else None}
    if layout.attention_dp > 1:
        block["attention_dp"] = layout.attention_dp
    if state_pool_per_gpu:
        block["state_pool_bytes_per_gpu"] = state_pool_per_gpu
    if hw is not None:
        need = (w.total + args.activation + state_pool_per_gpu
                + (budget_per_gpu if budget_per_gpu is not None else plan.total_kv_bytes))
        block["gpu_memory_bytes"] = hw.memory_bytes
        block["fits_per_gpu"] = bool(need <= hw.memory_bytes and plan.fits is not False)
    return block, plan


def parallel_rows(block: dict) -> list[tuple[str, str]]:
    """The text view of the `parallel` block."""
    w = block["weights_per_gpu"]
    dp = f"attention dp {block['attention_dp']} x " if block.get("attention_dp") else ""
    rows = [("layout", f"{dp}tp {block['tp']} x pp {block['pp']} (ep {block['ep']}): {block['gpus']} GPUs per replica"),
            ("weights per GPU", f"{fmt_bytes(w['total'])} (attention {fmt_bytes(w['attention'])}, FFN/experts "
                                f"{fmt_bytes(w['ffn'])}, embedding {fmt_bytes(w['embedding'])}, lm_head "
                                f"{fmt_bytes(w['lm_head'])}, norms {fmt_bytes(w['norms'])}; stage {w['stage']})"),
            ("KV per token per GPU", f"{block['kv_bytes_per_token_per_gpu']:g} B (each KV element kept "
                                     f"{block['kv_replication']}x)"),
            ("activations per GPU", fmt_bytes(block["activation_bytes_per_gpu"]) if block["activation_bytes_per_gpu"]
             else "0 B (none reserved: --activation sets the activations' and CUDA graphs' share)"),
            ("KV for the requests per GPU", fmt_bytes(block["kv_bytes_per_gpu"]))]
    if block["kv_budget_bytes_per_gpu"] is not None:
        rows += [("KV budget per GPU", fmt_bytes(block["kv_budget_bytes_per_gpu"])),
                 ("KV budget per replica", fmt_bytes(block["kv_budget_bytes_per_replica"]))]
    if "fits_per_gpu" in block:
        rows.append(("fits per GPU", "yes" if block["fits_per_gpu"] else "NO"))
    return rows
