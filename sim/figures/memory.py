"""Notebook 01: KV per token and per request, requests that fit a budget, reads per output token (b_KV)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Sequence

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

from sim.figures.common import GiB, KiB, _log2_batches, _new_figure


SHAPES = {"short": (2048, 256), "long": (8192, 256)}   # reference section 1's workload classes


def memory_fit_table(kv_budget: str | int = "12GiB", shapes: dict[str, tuple[int, int]] | None = None,
                     kv_format: str = "bf16", weight_format: str = "bf16", block_tokens: int = 16,
                     models: Iterable[str] | None = None) -> pd.DataFrame:
    """One row per shipped model (profiles/models): KV per token, KV per request of each shape
    (prompt + output - 1 tokens in whole blocks, reference section 3) and how many such requests
    fit `kv_budget` at once (a linear-attention model's state pool taken out first, at most its slots:
    state_bytes_per_request). `shapes` maps a name to (prompt, output) tokens; each adds columns
    kv_bytes_per_request_NAME and requests_fit_NAME. Qwen3-8B: 144 KiB per token; 324 MiB per short
    request (2048 in, 256 out), 37 fit 12 GiB; 1188 MiB per long request (8192 in), 10 fit."""
    import pandas as pd
    from sim.models.memory import kv_footprint, state_slots
    from sim.models.spec import ModelSpec
    from sim.io.profiles import known_names, load_model
    from sim.io.units import parse_bytes
    budget = parse_bytes(kv_budget) if isinstance(kv_budget, str) else int(kv_budget)
    shapes = SHAPES if shapes is None else shapes
    rows = []
    for name in models or known_names("models"):
        spec = ModelSpec(load_model(name))
        row = {"model": name, "total_params": spec.total_params, "active_params": spec.active_params,
               "weight_bytes": spec.weight_bytes(weight_format), "kv_format": kv_format,
               "kv_bytes_per_token": spec.kv_bytes_per_token(kv_format), "kv_budget_bytes": budget}
        state = spec.state_bytes_per_sequence   # linear-attention models: a state pool beside the KV (sim.core.sizing)
        slots = state_slots(budget, state) if state else None
        kv_budget = budget - slots * state if state else budget
        row["state_bytes_per_request"] = state
        for label, (prompt, output) in shapes.items():
            plan = kv_footprint(spec, prompt, output, 1, 0, kv_format, block_tokens, kv_budget)
            row[f"prompt_tokens_{label}"] = prompt
            row[f"output_tokens_{label}"] = output
            row[f"kv_bytes_per_request_{label}"] = plan.kv_bytes_per_request
            row[f"requests_fit_{label}"] = plan.max_requests if slots is None else min(plan.max_requests, slots)
        rows.append(row)
    return pd.DataFrame(rows).sort_values("kv_bytes_per_token", kind="stable").reset_index(drop=True)


def plot_memory_fit(table: pd.DataFrame) -> Figure:
    """KV per token per model, and how many requests of each shape fit the budget."""
    import numpy as np
    fig, axes = _new_figure((11, 5.5), 1, 2)
    ax1, ax2 = axes[0]
    y = np.arange(len(table))
    ax1.barh(y, table["kv_bytes_per_token"] / KiB, color="C0")
    for i, v in enumerate(table["kv_bytes_per_token"] / KiB):
        ax1.text(v, i, f" {v:.4g}", va="center", fontsize=8)
    ax1.set_yticks(y, table["model"])
    ax1.set_xlabel(f"KV per token (KiB, {table['kv_format'].iloc[0]})")
    ax1.set_title("KV cache per token", fontsize=10)
    ax1.grid(axis="x", alpha=0.3)
    ax1.set_xlim(0, table["kv_bytes_per_token"].max() / KiB * 1.2)
    shapes = [c[len("requests_fit_"):] for c in table.columns if c.startswith("requests_fit_")]
    h = 0.8 / max(len(shapes), 1)
    for j, label in enumerate(shapes):
        vals = table[f"requests_fit_{label}"]
        shape = f"{label} ({table[f'prompt_tokens_{label}'].iloc[0]} in, {table[f'output_tokens_{label}'].iloc[0]} out)"
        off = ((len(shapes) - 1) / 2 - j) * h
        ax2.barh(y + off, vals, height=h, color=f"C{j + 1}", label=shape)
        for i, v in enumerate(vals):
            ax2.text(v, i + off, f" {v}", va="center", fontsize=7)
    ax2.set_yticks(y, table["model"])
    ax2.set_xscale("symlog", linthresh=1)
    ax2.set_xlim(0, max(table[f"requests_fit_{s}"].max() for s in shapes) * 6)
    budget = table["kv_budget_bytes"].iloc[0]
    ax2.set_xlabel(f"requests whose whole KV (and linear-attention state) fits {budget / GiB:g} GiB at once")
    ax2.set_title("requests that fit the KV budget (reserved for all outputs)", fontsize=10)
    ax2.legend(fontsize=8, loc="upper right")
    ax2.grid(axis="x", alpha=0.3)
    return fig


def reads_per_token(model: str = "qwen3-8b", contexts: Sequence[int] = (2048, 8192),
                    batches: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256),
                    weight_format: str = "bf16", kv_format: str = "bf16", hardware: str | None = None) -> pd.DataFrame:
    """Bytes one decode iteration reads per output token, d(b, L) = D_w / b + L k (reference
    section 4): at 2K, 14.38 GiB at b = 1 down to 0.50 GiB at b = 64. Column `b_kv` is the smallest
    batch whose KV reads reach the weight reads, ceil(D_w / (L k)): 51 at 2K, 13 at 8K. With
    `hardware`, the roofline time bound per iteration too."""
    import pandas as pd
    from sim.models.spec import ModelSpec
    from sim.io.profiles import load_hardware, load_model
    from sim.models.roofline import b_kv, decode_reads
    spec = ModelSpec(load_model(model))
    hw = load_hardware(hardware) if hardware else None
    peak = hw.peak_flops_per_s("bf16") if hw else None
    bw = hw.bandwidth_bytes_per_s if hw else None
    w, k = spec.weight_read_bytes(weight_format), spec.kv_bytes_per_token(kv_format)
    rows = []
    for ctx in contexts:
        bk = b_kv(w, ctx, k)
        for b in batches:
            r = decode_reads(spec, b, ctx, weight_format, kv_format, peak, bw)
            rows.append({"model": spec.profile.name, "context_tokens": ctx, "batch": b,
                         "weight_read_bytes": w, "kv_bytes_per_token": k,
                         "bytes_per_iteration": r.bytes_per_iteration,
                         "weight_bytes_per_output_token": r.weight_bytes_per_output_token,
                         "kv_bytes_per_output_token": r.kv_bytes_per_output_token,
                         "bytes_per_output_token": r.bytes_per_output_token,
                         "time_bound_s": r.time_bound_s, "b_kv": bk})
    return pd.DataFrame(rows)


def plot_reads_per_token(reads: pd.DataFrame) -> Figure:
    """Figure 8-3 style: reads per output token against batch size, weights amortised over the
    batch, KV not; b_KV where the two are equal."""
    fig, axes = _new_figure((8.5, 5.5))
    ax = axes[0][0]
    batches = sorted(reads["batch"].unique())
    first = reads[reads["context_tokens"] == reads["context_tokens"].iloc[0]]
    ax.plot(first["batch"], first["weight_bytes_per_output_token"] / GiB, "--", color="0.4",
            label="weights / b (every context)")
    for i, (ctx, g) in enumerate(reads.groupby("context_tokens", sort=True)):
        c = f"C{i}"
        ax.plot(g["batch"], g["bytes_per_output_token"] / GiB, "o-", color=c, label=f"total, {ctx:,}-token context")
        kv = g["kv_bytes_per_output_token"].iloc[0] / GiB
        ax.axhline(kv, color=c, ls=":", lw=1.2, label=f"KV per token at {ctx:,} ({kv:.2f} GiB)")
        bk = int(g["b_kv"].iloc[0])
        ax.axvline(bk, color=c, ls="-.", lw=1)
        ax.annotate(f"b_KV = {bk}", (bk, kv), textcoords="offset points", xytext=(4, 8), color=c, fontsize=9)
    _log2_batches(ax, batches)
    ax.set_yscale("log")
    ax.set_xlabel("batch size b (sequences decoding together)")
    ax.set_ylabel("bytes read per output token (GiB, log)")
    ax.set_title(f"{reads['model'].iloc[0]}: d(b, L) = D_w / b + L k  (reference section 4, figure 8-3)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return fig
