"""Notebook 04: speculative decoding trade-offs, the draft-time budget, speculation against concurrency."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

from sim.figures.common import CHAPTER_MFU, DRAFTER_BYTES, LOOKUP_S, PLAIN_STEP_S, REPO, _log2_batches, _new_figure


def _drafters(pass_s: float, lookup_s: float) -> dict[str, Callable[[int], float]]:
    from sim.models.speculative import drafting_s
    return {"n-gram lookup": lambda m: lookup_s if m else 0.0,
            "draft model (one pass per draft)": lambda m: drafting_s(m, pass_s),
            "parallel block drafter (one pass)": lambda m: drafting_s(m, pass_s, parallel=True)}


def speculative_tradeoffs(acceptances: Sequence[float] = (0.25, 0.5, 0.75, 0.9), max_drafts: int = 8,
                          model: str = "qwen3-8b", hardware: str = "rtx-pro-6000-bw-ws", step_s: float = PLAIN_STEP_S,
                          context_tokens: int = 2048, mfu: float = CHAPTER_MFU, lookup_s: float = LOOKUP_S,
                          drafter_bytes: float = DRAFTER_BYTES) -> pd.DataFrame:
    """E[N_m] = 1 + sum_j a^j and the per-token latency T(m) / E[N_m] against draft length m, per
    constant acceptance a and draft source (reference section 8, sim.models.speculative).

    A round's verify costs max(the plain step, its FLOPs at `mfu`); drafting adds `lookup_s` (n-gram),
    m drafter passes (a draft model) or one pass (a parallel block drafter), a pass being the
    drafter's bytes at the plain step's effective bandwidth (2.10 GB at 588 GB/s = 3.57 ms). Four
    drafts: E[N] = 1.33 at a = 1/4, 3.05 at a = 3/4; per token 19.8 and 8.64 ms with the n-gram.
    """
    import pandas as pd
    from sim.models.spec import ModelSpec
    from sim.io.profiles import load_hardware, load_model
    from sim.models.speculative import drafter_pass_s, expected_outputs_constant, verify_flops, verify_round_s
    spec, hw = ModelSpec(load_model(model)), load_hardware(hardware)
    peak = hw.peak_flops_per_s("bf16")
    step_bytes = spec.weight_read_bytes() + context_tokens * spec.kv_bytes_per_token()
    pass_s = drafter_pass_s(drafter_bytes, step_bytes / step_s)
    rows = []
    for a in acceptances:
        for m in range(max_drafts + 1):
            n = expected_outputs_constant(a, m)
            verify = verify_round_s(step_s, verify_flops(spec, m + 1, context_tokens), peak, mfu)
            for name, draft in _drafters(pass_s, lookup_s).items():
                rnd = verify + draft(m)
                rows.append({"acceptance": a, "num_drafts": m, "expected_outputs": n, "drafter": name,
                             "verify_s": verify, "draft_s": draft(m), "round_s": rnd, "per_token_s": rnd / n,
                             "plain_per_token_s": step_s, "speedup": step_s / (rnd / n), "drafter_pass_s": pass_s})
    return pd.DataFrame(rows)


def plot_speculative_tradeoffs(table: pd.DataFrame, acceptance: float = 0.75) -> Figure:
    """Outputs per round and per-token latency against the draft length, one line per acceptance."""
    import numpy as np
    from sim.models.speculative import best_draft_length
    fig, axes = _new_figure((11.5, 4.8), 1, 3)
    ax1, ax2, ax3 = axes[0]
    first = table[table["drafter"] == table["drafter"].iloc[0]]
    for i, (a, g) in enumerate(first.groupby("acceptance")):
        ax1.plot(g["num_drafts"], g["expected_outputs"], "o-", ms=4, color=f"C{i}", label=f"a = {a:g}")
    ax1.plot(first["num_drafts"].unique(), first["num_drafts"].unique() + 1, ":", color="0.5", label="m + 1 (a = 1)")
    ax1.set_xlabel("draft length m")
    ax1.set_ylabel("E[N_m]: outputs per round")
    ax1.set_title("E[N_m] = 1 + a + ... + a^m", fontsize=9)
    ax1.legend(fontsize=8)
    ax1.grid(True, alpha=0.3)
    step = table["plain_per_token_s"].iloc[0]
    sel = table[np.isclose(table["acceptance"], acceptance)]
    for j, (name, g) in enumerate(sel.groupby("drafter", sort=False)):
        ax2.plot(g["num_drafts"], g["per_token_s"] * 1e3, "o-", ms=4, color=f"C{j + 4}", label=name)
        rt = dict(zip(g["num_drafts"], g["round_s"]))
        m = best_draft_length(lambda k: rt[k], [acceptance] * int(g["num_drafts"].max()), int(g["num_drafts"].max()))
        best = g[g["num_drafts"] == m]
        ax2.plot(m, float(best["per_token_s"].iloc[0]) * 1e3, "*", color=f"C{j + 4}", ms=12)
    ax2.axhline(step * 1e3, color="k", ls="--", lw=1, label=f"plain decode {step * 1e3:.2f} ms")
    ax2.set_xlabel("draft length m")
    ax2.set_ylabel("mean per-token latency (ms)")
    ax2.set_title(f"per-token latency at a = {acceptance:g} (star: best m)", fontsize=9)
    ax2.legend(fontsize=7)
    ax2.grid(True, alpha=0.3)
    m4 = table[(table["num_drafts"] == min(4, table["num_drafts"].max()))]
    for j, (name, g) in enumerate(m4.groupby("drafter", sort=False)):
        ax3.plot(g["acceptance"], g["per_token_s"] * 1e3, "o-", ms=4, color=f"C{j + 4}", label=name)
    ax3.axhline(step * 1e3, color="k", ls="--", lw=1, label="plain decode")
    ax3.set_xlabel("acceptance a (constant per position)")
    ax3.set_ylabel("mean per-token latency (ms)")
    ax3.set_title(f"per-token latency with m = {int(m4['num_drafts'].iloc[0])} drafts", fontsize=9)
    ax3.legend(fontsize=7)
    ax3.grid(True, alpha=0.3)
    fig.suptitle("Speculative decoding at batch 1, 2K context (reference section 8); verify = max(plain step, "
                 "verify FLOPs at 62.2% MFU)", fontsize=10)
    return fig


def draft_time_budget(acceptances: Sequence[float] = (0.25, 0.75), num_drafts: int = 4,
                      step_s: float = PLAIN_STEP_S) -> pd.DataFrame:
    """The drafting time per round at which speculation stops beating plain decode, (E[N] - 1) x
    step (reference section 8, figure 8-32): 8.7 ms for AAAA (a = 1/4), 53.9 ms for BBBB (a = 3/4)."""
    import pandas as pd
    from sim.models.speculative import draft_time_budget_s, expected_outputs_constant
    rows = []
    for a in acceptances:
        n = expected_outputs_constant(a, num_drafts)
        rows.append({"acceptance": a, "num_drafts": num_drafts, "expected_outputs": n, "plain_step_s": step_s,
                     "draft_time_budget_s": draft_time_budget_s(n, step_s)})
    return pd.DataFrame(rows)


def plot_draft_time_budget(table: pd.DataFrame, max_draft_s: float | None = None,
                           marks: dict[str, float] | None = None) -> Figure:
    """Per-token latency (step + drafting) / E[N] against drafting time per round; it crosses the
    plain step at the budget. `marks`: drafting times to show (default: the chapter's 0.1 ms lookup,
    one 3.57 ms drafter pass, four sequential passes 14.28 ms)."""
    import numpy as np
    step = float(table["plain_step_s"].iloc[0])
    top = max_draft_s or max(0.06, float(table["draft_time_budget_s"].max()) * 1.15)
    marks = marks if marks is not None else {"n-gram lookup 0.1 ms": 0.0001, "1 drafter pass 3.57 ms": 0.003572,
                                             "4 drafter passes 14.28 ms": 0.014287}
    x = np.linspace(0, top, 200)
    fig, axes = _new_figure((8.5, 5.5))
    ax = axes[0][0]
    ax.axhline(step * 1e3, color="k", lw=1.5, label=f"plain decode: {step * 1e3:.2f} ms per token")
    for i, row in enumerate(table.itertuples(index=False)):
        c = f"C{i}"
        ax.plot(x * 1e3, (step + x) / row.expected_outputs * 1e3, color=c,
                label=f"a = {row.acceptance:g}, m = {row.num_drafts}: E[N] = {row.expected_outputs:.2f}, "
                      f"per token (step + drafting) / E[N]")
        ax.plot(row.draft_time_budget_s * 1e3, step * 1e3, "o", color=c, ms=8)
        ax.annotate(f"budget {row.draft_time_budget_s * 1e3:.1f} ms", (row.draft_time_budget_s * 1e3, step * 1e3),
                    textcoords="offset points", xytext=(-30, 12 if i % 2 == 0 else -18), fontsize=8, color=c)
    for name, t in marks.items():
        ax.axvline(t * 1e3, color="0.6", ls=":", lw=1)
        ax.text(t * 1e3, 0.02, f" {name}", rotation=90, fontsize=7, color="0.4", va="bottom", ha="left",
                transform=ax.get_xaxis_transform())
    ax.set_xlim(0, top * 1e3)
    ax.set_xlabel("drafting time per round (ms)")
    ax.set_ylabel("mean per-token latency (ms)")
    ax.set_title("Draft-time budget (reference section 8, figure 8-32): speculation pays left of the crossing",
                 fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_ylim(0, None)
    return fig


def _concurrency_scenario(n: int, speculative: dict | None, prompt: int, output: int, kv_budget: str) -> Scenario:
    from sim.io.config import Scenario
    from sim.io.profiles import load_fitted, profiles_dir
    prof = load_fitted(profiles_dir() / "fitted" / "rtx-pro-6000-bw-ws__qwen3-8b__bf16__chapter.yaml")
    sched = {"kind": "continuous", "max_num_seqs": n, "max_num_batched_tokens": max(16384, prompt * n)}
    if speculative:
        sched["speculative"] = speculative
    return Scenario.model_validate({
        "name": f"concurrency-{n}", "seed": 0, "model": "qwen3-8b", "hardware": "rtx-pro-6000-bw-ws",
        "kv": {"block_tokens": 16, "format": "bf16", "budget": kv_budget, "admission": "reserve"},
        "scheduler": sched,
        # the chapter's measured decode table and prefill MFU; past batch 64 the table extrapolates
        "step_time": {"model": prof.efficiency.model_dump(), "allow_extrapolation": True},
        "workload": {"kind": "synthetic", "num_requests": n, "arrival": {"kind": "all_at_once"},
                     "prompt_tokens": {"kind": "fixed", "value": prompt},
                     "output_tokens": {"kind": "fixed", "value": output}}})


SPECULATORS = {
    "n-gram (a = 0.75, 4 drafts, 0.1 ms lookup per sequence)":
        {"draft": {"kind": "ngram", "lookup_s": LOOKUP_S}, "num_draft_tokens": 4,
         "acceptance": {"kind": "constant", "a": 0.75}},
    "draft model qwen3-0.6b (a = 0.75, 4 drafts)":
        {"draft": {"kind": "draft_model", "model": "qwen3-0.6b"}, "num_draft_tokens": 4,
         "acceptance": {"kind": "constant", "a": 0.75}},
}


def speculation_vs_concurrency(concurrency: Sequence[int] = (1, 4, 16, 64, 128, 192, 256, 320, 384, 512),
                               speculators: dict[str, dict] | None = None, prompt_tokens: int = 512,
                               output_tokens: int = 128, kv_budget: str = "70GiB") -> pd.DataFrame:
    """Simulated: `n` requests arriving together with `n` seats, plain and with each speculator, on
    Qwen3-8B / RTX PRO 6000 with the chapter's measured efficiencies (decode time from bytes read,
    verify never below its FLOPs at the prefill MFU). Under high concurrency plain batching already
    shares the weight reads and verifying m + 1 positions per sequence turns the step compute bound,
    so speculation stops paying (reference section 8)."""
    import pandas as pd
    from sim.core.simulation import Simulation
    speculators = SPECULATORS if speculators is None else speculators
    rows = []
    for n in concurrency:
        for name, cfg in [("plain decode", None), *speculators.items()]:
            s = Simulation(_concurrency_scenario(n, cfg, prompt_tokens, output_tokens, kv_budget), REPO).run().summary
            spec = s["speculative"] or {}
            rows.append({"concurrency": n, "variant": name, "tpot_p50_s": s["tpot_s"]["median"],
                         "tpot_p90_s": s["tpot_s"]["p90"], "e2e_p50_s": s["e2e_s"]["median"],
                         "output_throughput_tok_s": s["output_throughput_tok_s"], "makespan_s": s["makespan_s"],
                         "mean_acceptance_length": spec.get("mean_acceptance_length"),
                         "kv_limited_requests": s["kv_limited_requests"], "memory_fit": s["memory_fit"]})
    df = pd.DataFrame(rows)
    plain = df[df["variant"] == "plain decode"].set_index("concurrency")["tpot_p50_s"]
    df["speedup_vs_plain"] = df["concurrency"].map(plain) / df["tpot_p50_s"]
    return df


def speculation_crossover(table: pd.DataFrame) -> pd.DataFrame:
    """Per speculator, the lowest simulated concurrency at which its median TPOT is no better than
    plain decode's (NaN when it pays at every concurrency simulated)."""
    import numpy as np
    import pandas as pd
    rows = []
    for name, g in table[table["variant"] != "plain decode"].groupby("variant", sort=False):
        lost = g[g["speedup_vs_plain"] <= 1.0]
        rows.append({"variant": name, "stops_paying_at": float(lost["concurrency"].min()) if len(lost) else np.nan,
                     "best_speedup": float(g["speedup_vs_plain"].max())})
    return pd.DataFrame(rows)


def plot_speculation_vs_concurrency(table: pd.DataFrame) -> Figure:
    """Speculative and plain decoding's throughput and latency as concurrency rises, crossover marked."""
    fig, axes = _new_figure((11.5, 4.8), 1, 2)
    ax1, ax2 = axes[0]
    conc = sorted(table["concurrency"].unique())
    cross = speculation_crossover(table).set_index("variant")["stops_paying_at"]
    for i, (name, g) in enumerate(table.groupby("variant", sort=False)):
        c = "k" if name == "plain decode" else f"C{i}"
        ax1.plot(g["concurrency"], g["tpot_p50_s"] * 1e3, "o-", color=c, ms=4, label=name)
        ax2.plot(g["concurrency"], g["output_throughput_tok_s"], "o-", color=c, ms=4, label=name)
        hollow = g[~g["memory_fit"]]
        ax1.plot(hollow["concurrency"], hollow["tpot_p50_s"] * 1e3, "o", color=c, ms=9, mfc="none")
        if name in cross and not math.isnan(cross[name]):
            ax1.axvline(cross[name], color=c, ls=":", lw=1)
    for ax in (ax1, ax2):
        _log2_batches(ax, [2**k for k in range(int(math.log2(max(conc))) + 1) if 2**k >= min(conc)])
        ax.set_xlabel("concurrency (requests decoding together)")
        ax.grid(True, alpha=0.3)
    ax1.set_ylabel("median TPOT (ms per output token)")
    ax1.set_title("per-token latency (dotted: speculation stops paying; ring: waited for KV)", fontsize=9)
    ax2.set_ylabel("output tokens / s (whole run, incl. prefill)")
    ax2.set_title("throughput", fontsize=9)
    ax1.legend(fontsize=7)
    fig.suptitle("Speculation under concurrency: Qwen3-8B on RTX PRO 6000, chapter efficiencies, "
                 f"{int(table['concurrency'].max())} at most", fontsize=10)
    return fig
