"""Notebook 03: prefix caching on the Mooncake trace and the value per byte of a cached prefix."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

from sim.figures.common import CHAPTER_MFU, GiB, MOONCAKE_REL, MiB, REPO, _log2_batches, _new_figure


def shared_data_dir() -> Path:
    """The public data folder: $CAPSIM_SHARED_DATA, else ../shared/data next to the repository."""
    env = os.environ.get("CAPSIM_SHARED_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


def mooncake_trace(data_dir: str | Path | None = None) -> Path | None:
    """The Mooncake FAST'25 conversation trace under the data folder, or None when it is absent."""
    p = Path(data_dir or shared_data_dir()) / MOONCAKE_REL
    return p if p.is_file() else None


# The step-time model of benchmarks/bench_sim.py (and prefix_cache_sweep.py), shipped as
# profiles/assumed/llama-3.1-8b__h100-sxm__section7.yaml. Assumed, not measured.
ASSUMED_STEP_TIME = "llama-3.1-8b__h100-sxm__section7"
PREFIX_MODEL, PREFIX_HARDWARE = "llama-3.1-8b", "h100-sxm"


def _prefix_step_time() -> dict:
    from sim.models.assumed import linear_step_time
    model, name, hardware = linear_step_time(ASSUMED_STEP_TIME)
    if (name, hardware) != (PREFIX_MODEL, PREFIX_HARDWARE):
        raise ValueError(f"{ASSUMED_STEP_TIME}: is for {name} on {hardware}, the figure runs {PREFIX_MODEL} on {PREFIX_HARDWARE}")
    return model


def prefix_cache_curve(trace: str | Path | None = None, budgets_gib: Sequence[float] = (8, 16, 32, 64, 128, 256),
                       window_s: tuple[float, float] = (0.0, 300.0), rate_scale: float = 0.3,
                       baseline: bool = True, block_tokens: int = 128, prefix_index: str = "all") -> pd.DataFrame:
    """Prefix hit rate and TTFT against KV-cache size on a window of the Mooncake conversation trace.

    Llama-3.1-8B BF16 on one H100 SXM with the assumed step-time model of benchmarks/bench_sim.py,
    chunked prefill, reserved admission, LRU eviction; the trace's arrivals x `rate_scale` (it is a
    whole cluster's traffic). Blocks of 128 tokens (a 512-token trace block is 4 of them; 16-token
    blocks give the same hit rates on this window to 0.1%, 3x slower). With `baseline`, every budget also runs with prefix
    caching off. Budgets beyond the card's memory are what-ifs (a bigger card or a tier serving hits
    at HBM speed): column `card_fit` says which fit an 80 GB H100. `prefix_index` is kv.prefix_index:
    all (vLLM's policy, the default) or foresight (only blocks a later request will match: an upper bound).

    Raises FileNotFoundError when the trace is absent (see :func:`mooncake_trace`).
    """
    import pandas as pd
    from sim.io.config import Scenario
    from sim.core.simulation import Simulation
    path = Path(trace) if trace is not None else mooncake_trace()
    if path is None or not path.is_file():
        raise FileNotFoundError(f"the Mooncake conversation trace is not at {trace or shared_data_dir() / MOONCAKE_REL}")
    step = _prefix_step_time()
    rows = []
    for gib in budgets_gib:
        for caching in ((True, False) if baseline else (True,)):
            sc = Scenario.model_validate({
                "name": f"mooncake-{gib:g}GiB-{'on' if caching else 'off'}", "seed": 0,
                "model": PREFIX_MODEL, "hardware": PREFIX_HARDWARE,
                "kv": {"block_tokens": block_tokens, "format": "bf16", "budget": int(gib * GiB),
                       "admission": "reserve", "prefix_caching": caching, "prefix_index": prefix_index,
                       "eviction": "lru"},
                "scheduler": {"kind": "chunked", "max_num_seqs": 128, "max_num_batched_tokens": 8192,
                              "chunk_tokens": 2048},
                "step_time": {"model": step},
                "workload": {"kind": "trace", "path": str(path), "format": "mooncake", "window_s": list(window_s),
                             "rate_scale": rate_scale, "trace_block_tokens": 512}})
            s = Simulation(sc, REPO).run().summary
            rows.append({"kv_budget_gib": gib, "prefix_caching": caching, "requests": s["requests"],
                         "completed": s["completed"], "rejected": s["rejected"],
                         "prefix_hit_rate": s["prefix_hit_rate"], "prefix_hit_tokens": s["prefix_hit_tokens"],
                         "ttft_p50_s": s["ttft_s"]["median"], "ttft_p90_s": s["ttft_s"]["p90"],
                         "ttft_p99_s": s["ttft_s"]["p99"], "e2e_p50_s": s["e2e_s"]["median"],
                         "output_throughput_tok_s": s["output_throughput_tok_s"], "evictions": s["evictions"],
                         "card_fit": s["card_fit"], "window_s": f"{window_s[0]:g}-{window_s[1]:g}",
                         "rate_scale": rate_scale})
    return pd.DataFrame(rows)


def plot_prefix_cache(curve: pd.DataFrame) -> Figure:
    """Prefix hit rate and TTFT against the KV-cache size, with the card's real budget marked."""
    from sim.models.memory import kv_budget_from_utilization
    from sim.models.spec import ModelSpec
    from sim.io.profiles import load_hardware, load_model
    fig, axes = _new_figure((8.5, 7.5), 2, 1, sharex=True)
    ax1, ax2 = axes[:, 0]
    on = curve[curve["prefix_caching"]]
    off = curve[~curve["prefix_caching"]]
    ax1.plot(on["kv_budget_gib"], on["prefix_hit_rate"] * 100, "o-", color="C2", label="prefix caching on")
    ax1.set_ylabel("prefix hit rate (% of prompt tokens)")
    ax1.set_ylim(0, max(on["prefix_hit_rate"].max() * 100 * 1.2, 5))
    h100 = kv_budget_from_utilization(load_hardware(PREFIX_HARDWARE),
                                      ModelSpec(load_model(PREFIX_MODEL)).weight_bytes("bf16"), 0.9, 4 * GiB) / GiB
    for ax in (ax1, ax2):
        ax.axvline(h100, color="0.5", ls="--", lw=1)
        ax.grid(True, which="both", alpha=0.3)
    ax1.text(h100, ax1.get_ylim()[1] * 0.95, f" H100 80 GB: {h100:.0f} GiB for KV\n (0.9 x 80 GB - weights - 4 GiB)",
             fontsize=7, va="top", color="0.35")
    for rows, style, tag in ((on, "-", "on"), (off, "--", "off")):
        if len(rows):
            ax2.plot(rows["kv_budget_gib"], rows["ttft_p50_s"], "o" + style, color="C0", label=f"TTFT p50, caching {tag}")
            ax2.plot(rows["kv_budget_gib"], rows["ttft_p90_s"], "^" + style, color="C3", label=f"TTFT p90, caching {tag}")
    for row in on.itertuples(index=False):
        if row.rejected:
            ax2.annotate(f"{row.rejected} rejected (KV need > budget)", (row.kv_budget_gib, row.ttft_p50_s),
                         textcoords="offset points", xytext=(8, -14), fontsize=7)
    ax2.set_yscale("log")
    _log2_batches(ax2, on["kv_budget_gib"])
    ax2.set_xlabel("KV cache budget (GiB)")
    ax2.set_ylabel("TTFT of served requests (s, log)")
    ax1.legend(fontsize=8, loc="upper left")
    ax2.legend(fontsize=8)
    r = curve.iloc[0]
    ax1.set_title(f"Mooncake conversation trace, window {r['window_s']} s, arrivals x{r['rate_scale']:g} "
                  f"({int(r['requests'])} requests); Llama-3.1-8B, H100 SXM (assumed step time)", fontsize=9)
    return fig


def prefix_value_per_byte(prefix_tokens: Sequence[int] = (256, 512, 1024, 2048, 4096, 6144, 8192, 16384, 32768),
                          hit_probabilities: Sequence[float] = (0.1, 0.25, 0.5, 1.0),
                          links_gbs: dict[str, float] | None = None, model: str = "qwen3-8b",
                          hardware: str = "rtx-pro-6000-bw-ws", mfu: float = CHAPTER_MFU) -> pd.DataFrame:
    """Value of keeping a prefix, V_h = p_h (T_r - T_f) - T_m, per byte it occupies (sim.planning.valuation,
    reference section 6): recompute from its FLOPs at `mfu`, fetch and maintenance over each link.
    Prefix A (6144 tokens, 864 MiB) at p_h = 0.5 over PCIe Gen5: 132.7 ms, 0.154 ms per MiB, worth
    keeping above p_h = 4.8%; prefix B (2048 tokens): 40.3 ms, 0.140 ms per MiB."""
    import pandas as pd
    from sim.models.spec import ModelSpec
    from sim.io.profiles import load_hardware, load_model
    from sim.planning.valuation import value_prefix
    spec, hw = ModelSpec(load_model(model)), load_hardware(hardware)
    links = links_gbs or {"PCIe Gen5 (64 GB/s)": 64.0, "PCIe Gen4 (32 GB/s)": 32.0}
    rows = []
    for link, gbs in links.items():
        for p in hit_probabilities:
            for n in prefix_tokens:
                v = value_prefix(spec, hw, n, p, mfu, link_bytes_per_s=gbs * 1e9)
                rows.append({"link": link, "hit_probability": p, "prefix_tokens": n, "prefix_bytes": v.prefix_bytes,
                             "recompute_s": v.recompute_s, "fetch_s": v.fetch_s, "maintenance_s": v.maintenance_s,
                             "value_s": v.value_s, "value_s_per_mib": v.value_s * MiB / v.prefix_bytes,
                             "break_even_hit_probability": v.break_even_hit_probability})
    return pd.DataFrame(rows)


def plot_prefix_value(table: pd.DataFrame, marks: dict[str, int] | None = None) -> Figure:
    """Value per byte of keeping a prefix against its length, with the chapter's prefixes marked."""
    marks = {"A": 6144, "B": 2048} if marks is None else marks
    fig, axes = _new_figure((11, 4.8), 1, 2)
    ax1, ax2 = axes[0]
    link0 = table["link"].iloc[0]
    t = table[table["link"] == link0]
    for i, (p, g) in enumerate(t.groupby("hit_probability")):
        ax1.plot(g["prefix_tokens"], g["value_s_per_mib"] * 1e3, "o-", color=f"C{i}", ms=4, label=f"p_h = {p:g}")
        if math.isclose(p, 0.5):
            for name, n in marks.items():
                row = g[g["prefix_tokens"] == n]
                if len(row):
                    y = float(row["value_s_per_mib"].iloc[0]) * 1e3
                    ax1.plot(n, y, "*", color="k", ms=11, zorder=5)
                    up = n == max(marks.values())
                    ax1.annotate(f"{name}: {n} tokens, {y:.3f} ms/MiB\n(V_h {float(row['value_s'].iloc[0]) * 1e3:.1f} ms)",
                                 (n, y), textcoords="offset points", xytext=(-70, 18) if up else (-20, -30), fontsize=7,
                                 arrowprops={"arrowstyle": "-", "color": "0.5", "lw": 0.6})
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("prefix tokens")
    ax1.set_ylabel("V_h per MiB of KV kept (ms / MiB)")
    ax1.axhline(0, color="0.5", lw=0.8)
    ax1.set_title(f"value per byte of a cached prefix ({link0})", fontsize=9)
    ax1.grid(True, alpha=0.3)
    ax1.legend(fontsize=8)
    p0 = table["hit_probability"].iloc[0]
    for i, (link, g) in enumerate(table[table["hit_probability"] == p0].groupby("link", sort=False)):
        ax2.plot(g["prefix_tokens"], g["break_even_hit_probability"] * 100, "o-", color=f"C{i + 4}", ms=4, label=link)
        for name, n in marks.items():
            row = g[g["prefix_tokens"] == n]
            if len(row):
                y = float(row["break_even_hit_probability"].iloc[0]) * 100
                ax2.annotate(f"{name}: {y:.1f}%", (n, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax2.set_xscale("log", base=2)
    ax2.set_ylim(0, None)
    ax2.set_xlabel("prefix tokens")
    ax2.set_ylabel("break-even hit probability T_m / (T_r - T_f) (%)")
    ax2.set_title("keep a prefix when its hit probability is above", fontsize=9)
    ax2.grid(True, which="both", alpha=0.3)
    ax2.legend(fontsize=8)
    fig.suptitle("Reference section 6: long prefixes earn more per byte (recompute grows super-linearly)", fontsize=10)
    return fig
