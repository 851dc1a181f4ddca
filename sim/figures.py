"""The what-if figures: each computes its data with the project's own code and draws it.

Every figure has a data function returning a pandas DataFrame and a ``plot_*`` function returning
a :class:`matplotlib.figure.Figure` (no pyplot state; matplotlib is imported only to draw). The
notebooks under ``notebooks/`` call these, and ``capsim figures --out DIR`` writes every figure
as ``DIR/<name>.png`` with its data as ``DIR/<name>.csv`` (see :data:`FIGURES`), so nothing is
computed only inside a notebook.

Numbers quoted in docstrings are the reference chapter's (sections 3-9, as in tests/chapter8);
``tests/test_figures.py`` checks the figures' data against them.

| figure | question | notebook |
|---|---|---|
| memory-fit | KV per token and per request of every shipped model; requests that fit a budget | 01 |
| reads-per-token | bytes read per output token against batch size, b_KV (figure 8-3) | 01 |
| scheduler-gantt | the four-request example as iteration timelines, r0's output intervals (figure 8-2 style) | 02 |
| token-budget | late arrivals' TTFT against the longest interval, over the token budget | 02 |
| prefix-cache | hit rate and TTFT against KV-cache size on the Mooncake trace (needs ../shared/data) | 03 |
| prefix-value | value per byte of keeping long vs short prefixes (section 6) | 03 |
| speculative-tradeoffs | outputs per round and per-token latency against draft length and acceptance | 04 |
| draft-budget | the draft-time budget crossover (figure 8-32) | 04 |
| speculation-concurrency | when speculation stops paying as concurrency rises (simulated) | 04 |
| goodput-vs-rate | goodput and latency percentiles against arrival rate, Azure conversation trace | 05 |
| replicas | goodput capacity per replica and replicas for a target rate (capsim plan) | 05 |
| memory-deadline-plane | the chapter's schemes A-D on the memory / deadline plane (figure 8-35) | 05 |
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

if TYPE_CHECKING:  # numpy, pandas and the simulator are imported where used: `capsim --help` stays fast
    import pandas as pd
    from matplotlib.figure import Figure
    from sim.simulation import Result

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = REPO / "scenarios"
CHAPTER8 = SCENARIOS / "chapter8"
GiB, MiB, KiB = 2**30, 2**20, 2**10
MOONCAKE_REL = Path("traces") / "mooncake_fast25" / "conversation_trace.jsonl"

# Reference section 8's inputs, used as defaults of the speculative figures.
PLAIN_STEP_S = 0.02626          # measured batch-1 decode step at 2K context
LOOKUP_S = 0.0001               # assumed n-gram draft lookup per round
DRAFTER_BYTES = 2.10e9          # a 1.95 GiB drafter (measured)
CHAPTER_MFU = 0.622             # unrounded batch-1 prefill MFU (sections 4, 6, 8)


def _scenario_file(path: str | Path) -> Path:
    p = Path(path)
    if not p.is_absolute() and not p.exists():
        p = SCENARIOS / p
    if not p.exists():
        raise FileNotFoundError(f"scenario {path} not found (looked under {SCENARIOS})")
    return p


def _run(path: str | Path, overrides: Sequence[str] = ()) -> Result:
    from sim.config import load_scenario
    from sim.simulation import Simulation
    scenario, base = load_scenario(_scenario_file(path), list(overrides))
    return Simulation(scenario, base).run()


def _new_figure(figsize, rows=1, cols=1, **kw):
    from matplotlib.figure import Figure
    fig = Figure(figsize=figsize, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, **kw)
    return fig, axes


def _log2_batches(ax, values) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(values))
    ax.set_xticklabels([f"{v:g}" for v in values])
    ax.minorticks_off()


# ==== 01 memory fit ================================================================================

SHAPES = {"short": (2048, 256), "long": (8192, 256)}   # reference section 1's workload classes


def memory_fit_table(kv_budget: str | int = "12GiB", shapes: dict[str, tuple[int, int]] | None = None,
                     kv_format: str = "bf16", weight_format: str = "bf16", block_tokens: int = 16,
                     models: Iterable[str] | None = None) -> pd.DataFrame:
    """One row per shipped model (profiles/models): KV per token, KV per request of each shape
    (prompt + output - 1 tokens in whole blocks, reference section 3) and how many such requests
    fit `kv_budget` at once. `shapes` maps a name to (prompt, output) tokens; each adds columns
    kv_bytes_per_request_NAME and requests_fit_NAME. Qwen3-8B: 144 KiB per token; 324 MiB per short
    request (2048 in, 256 out), 37 fit 12 GiB; 1188 MiB per long request (8192 in), 10 fit."""
    import pandas as pd
    from sim.memory import kv_plan
    from sim.modelspec import ModelSpec
    from sim.profile import known_names, load_model
    from sim.units import parse_bytes
    budget = parse_bytes(kv_budget) if isinstance(kv_budget, str) else int(kv_budget)
    shapes = SHAPES if shapes is None else shapes
    rows = []
    for name in models or known_names("models"):
        spec = ModelSpec(load_model(name))
        row = {"model": name, "total_params": spec.total_params, "active_params": spec.active_params,
               "weight_bytes": spec.weight_bytes(weight_format), "kv_format": kv_format,
               "kv_bytes_per_token": spec.kv_bytes_per_token(kv_format), "kv_budget_bytes": budget}
        for label, (prompt, output) in shapes.items():
            plan = kv_plan(spec, prompt, output, 1, 0, kv_format, block_tokens, budget)
            row[f"prompt_tokens_{label}"] = prompt
            row[f"output_tokens_{label}"] = output
            row[f"kv_bytes_per_request_{label}"] = plan.kv_bytes_per_request
            row[f"requests_fit_{label}"] = plan.max_requests
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
    ax2.set_xlabel(f"requests whose whole KV fits {budget / GiB:g} GiB at once")
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
    from sim.modelspec import ModelSpec
    from sim.profile import load_hardware, load_model
    from sim.roofline import b_kv, decode_reads
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


# ==== 02 schedulers =================================================================================

POLICIES = ("fixed", "continuous", "chunked")


def iteration_membership(result: Result, atol: float = 1e-9) -> pd.DataFrame:
    """Which request took part in which iteration, derived from a Result's tables.

    A request prefills in the iterations with prefill tokens between its admission and its first
    token, and decodes (one output each) in every iteration of its replica that ends after its
    first token and no later than its finish. That is how the fixed, continuous and chunked
    schedulers run requests that are never preempted and do not speculate; the derivation is
    checked against every iteration's `batch_size` and `decode_sequences` and each request's
    `output_tokens`, and raises ValueError where it does not hold (preemption, speculation).

    Returns one row per (iteration, request): iteration, replica, start_s, end_s, request, role
    (prefill | decode), prefill_tokens (that request's share when it can be attributed) and
    emits (whether the request got an output token at the end of the iteration).
    """
    import numpy as np
    import pandas as pd
    if result.summary.get("speculative"):
        raise ValueError("iteration_membership: speculative rounds emit several tokens per iteration; "
                         "membership is not derivable from the tables")
    its = result.iterations.reset_index(drop=True)
    req = result.requests
    if (req["preemptions"] > 0).any():
        raise ValueError("iteration_membership: preempted requests recompute; membership is not derivable")
    end = (its["start_s"] + its["duration_s"]).to_numpy()
    start = its["start_s"].to_numpy()
    rep = its["replica"].to_numpy()
    has_prefill = its["prefill_tokens"].to_numpy() > 0
    rows = []
    for r in req[req["status"] == "finished"].itertuples(index=False):
        here = rep == r.replica
        pre = np.flatnonzero(here & has_prefill & (start >= r.admitted_s - atol) & (end <= r.first_token_s + atol))
        dec = np.flatnonzero(here & (end > r.first_token_s + atol) & (end <= r.finish_s + atol))
        if len(dec) != r.output_tokens - 1 or not len(pre) or abs(end[pre[-1]] - r.first_token_s) > atol:
            raise ValueError(f"iteration_membership: request {r.id} does not decode in every iteration between its "
                             f"first token and its finish ({len(dec)} iterations for {r.output_tokens - 1} outputs)")
        for i in pre:
            rows.append({"iteration": int(i), "request": int(r.id), "role": "prefill", "emits": i == pre[-1],
                         "prompt_tokens": int(r.prompt_tokens - r.cached_tokens), "whole_prefill": len(pre) == 1})
        for i in dec:
            rows.append({"iteration": int(i), "request": int(r.id), "role": "decode", "emits": True,
                         "prompt_tokens": 0, "whole_prefill": False})
    m = pd.DataFrame(rows, columns=["iteration", "request", "role", "emits", "prompt_tokens", "whole_prefill"])
    counts = m.groupby("iteration")["role"].agg(members="size", decodes=lambda s: int((s == "decode").sum()))
    counts = counts.reindex(range(len(its)), fill_value=0)
    bad = (counts["members"].to_numpy() != its["batch_size"].to_numpy()) | \
          (counts["decodes"].to_numpy() != its["decode_sequences"].to_numpy())
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"iteration_membership: iteration {i} has batch {its['batch_size'][i]} "
                         f"({its['decode_sequences'][i]} decoding) but {counts['members'][i]} derived members "
                         f"({counts['decodes'][i]} decoding)")
    # a prefill member's tokens: the iteration's when it prefills alone; its whole prompt when every
    # prefill member of the iteration prefills in this one iteration (whole-prompt prefills)
    tokens = []
    for row in m.itertuples(index=False):
        if row.role == "decode":
            tokens.append(0)
            continue
        peers = m[(m["iteration"] == row.iteration) & (m["role"] == "prefill")]
        if len(peers) == 1:
            tokens.append(int(its["prefill_tokens"][row.iteration]))
        elif peers["whole_prefill"].all() and peers["prompt_tokens"].sum() == its["prefill_tokens"][row.iteration]:
            tokens.append(row.prompt_tokens)
        else:
            tokens.append(np.nan)
    m["prefill_tokens"] = tokens
    m["replica"] = rep[m["iteration"]]
    m["start_s"] = start[m["iteration"]]
    m["end_s"] = end[m["iteration"]]
    return m[["iteration", "replica", "start_s", "end_s", "request", "role", "prefill_tokens", "emits"]] \
        .sort_values(["iteration", "request"], kind="stable").reset_index(drop=True)


def output_times(result: Result, request: int = 0) -> pd.DataFrame:
    """A request's output tokens: index (1 = first token), time_s, interval_s since the previous
    output (NaN for the first). Derived with :func:`iteration_membership`."""
    import numpy as np
    import pandas as pd
    m = iteration_membership(result)
    t = m[(m["request"] == request) & m["emits"]]["end_s"].to_numpy()
    return pd.DataFrame({"request": request, "output": np.arange(1, len(t) + 1), "time_s": t,
                         "interval_s": np.concatenate(([np.nan], np.diff(t)))})


def scheduler_gantt(policy: str | Sequence[str] = POLICIES, overrides: Sequence[str] = ()) -> pd.DataFrame:
    """The four-request example of reference section 5 (scenarios/chapter8/four-requests-POLICY.yaml)
    as an iteration Gantt table: one row per (policy, iteration, request) with its role and tokens,
    the request's arrival, the run's makespan and longest output interval (of any request): 870.47
    and 26.31 ms fixed, 765.59 and 375.97 ms continuous, 844.25 and 132.56 ms chunked. `policy`: one
    of fixed, continuous, chunked, or several; `overrides` apply to each (`--set` syntax)."""
    if not isinstance(policy, str):
        import pandas as pd
        return pd.concat([scheduler_gantt(p, overrides) for p in policy], ignore_index=True)
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    res = _run(CHAPTER8 / f"four-requests-{policy}.yaml", overrides)
    m = iteration_membership(res)
    req = res.requests.set_index("id")
    m.insert(0, "policy", policy)
    m["arrival_s"] = req.loc[m["request"], "arrival_s"].to_numpy()
    m["makespan_s"] = res.summary["makespan_s"]
    m["longest_interval_s"] = res.summary["itl_s"]["max"]
    return m


def output_intervals(policies: Sequence[str] = POLICIES, request: int = 0) -> pd.DataFrame:
    """Output times and intervals of one request of the four-request example under each policy
    (reference section 5: r0 at 163.33, 189.62, 565.59, ... ms under continuous batching)."""
    import pandas as pd
    frames = []
    for p in policies:
        f = output_times(_run(CHAPTER8 / f"four-requests-{p}.yaml"), request)
        f.insert(0, "policy", p)
        frames.append(f)
    return pd.concat(frames, ignore_index=True)


def plot_scheduler_gantt(gantt: pd.DataFrame, intervals: pd.DataFrame | None = None, request: int = 0) -> Figure:
    """One timeline per policy (iterations as bars per request, prefill orange, decode blue, arrivals
    as triangles, the request's outputs as ticks and its longest interval marked), then the
    request's output intervals side by side."""
    import numpy as np
    import pandas as pd
    policies = list(dict.fromkeys(gantt["policy"]))
    rows = len(policies) + (intervals is not None)
    fig, axes = _new_figure((11, 2.4 * rows + 0.6), rows, 1)
    xmax = max(gantt["end_s"].max() * 1e3 * 1.02, 1)
    for ax, pol in zip(axes[:, 0], policies):
        g = gantt[gantt["policy"] == pol]
        reqs = sorted(g["request"].unique())
        ypos = {r: len(reqs) - 1 - i for i, r in enumerate(reqs)}
        for it_start, it_end in g[["start_s", "end_s"]].drop_duplicates().to_numpy() * 1e3:
            ax.axvline(it_start, color="0.85", lw=0.8, zorder=0)
        for row in g.itertuples(index=False):
            y = ypos[row.request]
            color = "C1" if row.role == "prefill" else "C0"
            ax.barh(y, (row.end_s - row.start_s) * 1e3, left=row.start_s * 1e3, height=0.6, color=color,
                    edgecolor="white", lw=0.6)
            if row.role == "prefill" and (row.end_s - row.start_s) * 1e3 > 0.06 * xmax:
                label = f"{int(row.prefill_tokens):,}" if not pd.isna(row.prefill_tokens) else "prefill"
                ax.text((row.start_s + row.end_s) / 2 * 1e3, y, label, ha="center", va="center", fontsize=7,
                        color="white")
        arr = g.drop_duplicates("request")
        ax.plot(arr["arrival_s"] * 1e3, [ypos[r] + 0.38 for r in arr["request"]], "v", color="k", ms=5)
        for r, t0 in zip(arr["request"], arr["arrival_s"]):
            t1 = g[g["request"] == r]["start_s"].min()
            if t1 > t0:
                ax.plot([t0 * 1e3, t1 * 1e3], [ypos[r], ypos[r]], color="0.55", lw=1.2, ls=(0, (2, 2)))
        if request in ypos:
            t = g[(g["request"] == request) & g["emits"]]["end_s"].to_numpy() * 1e3
            y = ypos[request]
            ax.plot(t, [y + 0.38] * len(t), "|", color="C3", ms=9, mew=2)
            if len(t) > 1:
                j = int(np.argmax(np.diff(t)))
                ax.annotate("", (t[j + 1], y + 0.42), (t[j], y + 0.42),
                            arrowprops={"arrowstyle": "<->", "color": "C3", "lw": 1.2})
                ax.text((t[j] + t[j + 1]) / 2, y + 0.5, f"r{request}'s longest interval {t[j + 1] - t[j]:.2f} ms",
                        ha="center", va="bottom", fontsize=8, color="C3")
        ax.set_yticks([ypos[r] for r in reqs], [f"r{r}" for r in reqs])
        ax.set_ylim(-0.5, len(reqs) - 0.1)
        ax.set_xlim(0, xmax)
        ax.set_title(f"{pol}: makespan {g['makespan_s'].iloc[0] * 1e3:.2f} ms, longest output interval "
                     f"{g['longest_interval_s'].iloc[0] * 1e3:.2f} ms", fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.25)
    axes[len(policies) - 1, 0].set_xlabel("time (ms)")
    from matplotlib.patches import Patch
    from matplotlib.lines import Line2D
    axes[0, 0].legend(handles=[Patch(color="C1", label="prefill (new tokens)"), Patch(color="C0", label="decode"),
                               Line2D([], [], marker="v", ls="", color="k", label="arrival"),
                               Line2D([], [], ls=(0, (2, 2)), color="0.55", label="waiting"),
                               Line2D([], [], marker="|", ls="", color="C3", mew=2, ms=9, label=f"r{request} output")],
                      fontsize=7, loc="upper right", ncol=5)
    if intervals is not None:
        ax = axes[-1, 0]
        pols = list(dict.fromkeys(intervals["policy"]))
        w = 0.8 / len(pols)
        for i, pol in enumerate(pols):
            f = intervals[(intervals["policy"] == pol) & intervals["interval_s"].notna()]
            ax.bar(f["output"] - 1 + (i - (len(pols) - 1) / 2) * w, f["interval_s"] * 1e3, width=w, label=pol,
                   color=f"C{i + 2}")
        ax.set_xlabel(f"output interval of r{request} (between output k and k + 1)")
        ax.set_ylabel("ms")
        ax.set_title(f"r{request}'s output intervals", fontsize=9, loc="left")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("The four-request example (reference section 5): iteration timelines", fontsize=11)
    return fig


def token_budget_tradeoff(budgets: Sequence[int] = (512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384),
                          max_num_seqs: int = 4, late: Sequence[int] = (2, 3), running: int = 0) -> pd.DataFrame:
    """The token budget (max_num_batched_tokens, with chunk_tokens equal to it) of chunked prefill on
    the four-request example with `max_num_seqs` seats: a larger budget lets the late arrivals (r2's
    8K prompt, r3) reach their first token sooner and stretches the longest output interval of the
    running request r0 (reference section 5, "Token budget and execution shapes")."""
    import pandas as pd
    rows = []
    for b in budgets:
        res = _run(CHAPTER8 / "four-requests-chunked.yaml",
                   [f"scheduler.max_num_batched_tokens={b}", f"scheduler.chunk_tokens={b}",
                    f"scheduler.max_num_seqs={max_num_seqs}"])
        q = res.requests.set_index("id")
        rows.append({"max_num_batched_tokens": b, "chunk_tokens": b, "max_num_seqs": max_num_seqs,
                     "late_ttft_mean_s": float(q.loc[list(late), "ttft_s"].mean()),
                     "late_ttft_max_s": float(q.loc[list(late), "ttft_s"].max()),
                     "running_longest_interval_s": float(q.loc[running, "max_itl_s"]),
                     "longest_interval_s": res.summary["itl_s"]["max"], "makespan_s": res.summary["makespan_s"]})
    return pd.DataFrame(rows)


def plot_token_budget(table: pd.DataFrame, late_label: str = "r2, r3", running_label: str = "r0") -> Figure:
    fig, axes = _new_figure((11, 4.5), 1, 2)
    ax1, ax2 = axes[0]
    b = table["max_num_batched_tokens"]
    ax1.plot(b, table["late_ttft_mean_s"] * 1e3, "o-", color="C1", label=f"late arrivals' mean TTFT ({late_label})")
    ax1.plot(b, table["running_longest_interval_s"] * 1e3, "s-", color="C0",
             label=f"longest output interval of {running_label}")
    _log2_batches(ax1, b)
    ax1.set_xticklabels([f"{v // 1024}K" if v >= 1024 else f"{v}" for v in b])
    ax1.set_xlabel("token budget per iteration (max_num_batched_tokens = chunk_tokens)")
    ax1.set_ylabel("ms")
    ax1.grid(True, alpha=0.3)
    ax1.legend(fontsize=8)
    ax1.set_title("raising the budget: late arrivals leave the queue sooner ...", fontsize=9)
    ax2.plot(table["running_longest_interval_s"] * 1e3, table["late_ttft_mean_s"] * 1e3, "o-", color="C2")
    spots: dict[tuple, list[str]] = {}  # budgets with the same outcome share one label
    for row in table.itertuples(index=False):
        key = (round(row.running_longest_interval_s * 1e3, 6), round(row.late_ttft_mean_s * 1e3, 6))
        spots.setdefault(key, []).append(f"{row.max_num_batched_tokens}")
    for (x, y), labels in spots.items():
        ax2.annotate(", ".join(labels), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax2.set_xlabel(f"longest output interval of {running_label} (ms)")
    ax2.set_ylabel(f"late arrivals' mean TTFT (ms)")
    ax2.grid(True, alpha=0.3)
    ax2.set_title("... and running requests pause longer (labels: budget)", fontsize=9)
    fig.suptitle(f"Chunked prefill, four-request example with {table['max_num_seqs'].iloc[0]} seats", fontsize=10)
    return fig


# ==== 03 prefix caching =============================================================================

def shared_data_dir() -> Path:
    """The public data folder: $CAPSIM_SHARED_DATA, else ../shared/data next to the repository."""
    env = os.environ.get("CAPSIM_SHARED_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


def mooncake_trace(data_dir: str | Path | None = None) -> Path | None:
    """The Mooncake FAST'25 conversation trace under the data folder, or None when it is absent."""
    p = Path(data_dir or shared_data_dir()) / MOONCAKE_REL
    return p if p.is_file() else None


# The step-time model of benchmarks/bench_sim.py (and prefix_cache_sweep.py): reference section 7's
# Llama-3.1-8B H100 decode fit plus a prefill term at an assumed 60 % MFU. Assumed, not measured.
PREFIX_MODEL, PREFIX_HARDWARE, PREFIX_MFU = "llama-3.1-8b", "h100-sxm", 0.6


def _prefix_step_time() -> dict:
    from sim.modelspec import ModelSpec
    from sim.profile import load_hardware, load_model
    spec = ModelSpec(load_model(PREFIX_MODEL))
    peak = load_hardware(PREFIX_HARDWARE).peak_flops_per_s("bf16")
    return {"kind": "linear", "constant_s": 6.44e-3, "per_kv_token_s": 4.37e-8,
            "per_new_token_s": 2 * spec.active_params / (peak * PREFIX_MFU)}


def prefix_cache_curve(trace: str | Path | None = None, budgets_gib: Sequence[float] = (8, 16, 32, 64, 128, 256),
                       window_s: tuple[float, float] = (0.0, 300.0), rate_scale: float = 0.3,
                       baseline: bool = True, block_tokens: int = 128) -> pd.DataFrame:
    """Prefix hit rate and TTFT against KV-cache size on a window of the Mooncake conversation trace.

    Llama-3.1-8B BF16 on one H100 SXM with the assumed step-time model of benchmarks/bench_sim.py,
    chunked prefill, reserved admission, LRU eviction; the trace's arrivals x `rate_scale` (it is a
    whole cluster's traffic). Blocks of 128 tokens (a 512-token trace block is 4 of them; 16-token
    blocks give the same hit rates on this window to 0.1%, 3x slower). With `baseline`, every budget also runs with prefix
    caching off. Budgets beyond the card's memory are what-ifs (a bigger card or a tier serving hits
    at HBM speed): column `card_fit` says which fit an 80 GB H100.

    Raises FileNotFoundError when the trace is absent (see :func:`mooncake_trace`).
    """
    import pandas as pd
    from sim.config import Scenario
    from sim.simulation import Simulation
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
                       "admission": "reserve", "prefix_caching": caching, "eviction": "lru"},
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
    from sim.memory import kv_budget_from_utilization
    from sim.modelspec import ModelSpec
    from sim.profile import load_hardware, load_model
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
    """Value of keeping a prefix, V_h = p_h (T_r - T_f) - T_m, per byte it occupies (sim.valuation,
    reference section 6): recompute from its FLOPs at `mfu`, fetch and maintenance over each link.
    Prefix A (6144 tokens, 864 MiB) at p_h = 0.5 over PCIe Gen5: 132.7 ms, 0.154 ms per MiB, worth
    keeping above p_h = 4.8%; prefix B (2048 tokens): 40.3 ms, 0.140 ms per MiB."""
    import pandas as pd
    from sim.modelspec import ModelSpec
    from sim.profile import load_hardware, load_model
    from sim.valuation import value_prefix
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


# ==== 04 speculative decoding =======================================================================

def _drafters(pass_s: float, lookup_s: float) -> dict[str, Callable[[int], float]]:
    from sim.speculative import drafting_s
    return {"n-gram lookup": lambda m: lookup_s if m else 0.0,
            "draft model (one pass per draft)": lambda m: drafting_s(m, pass_s),
            "parallel block drafter (one pass)": lambda m: drafting_s(m, pass_s, parallel=True)}


def speculative_tradeoffs(acceptances: Sequence[float] = (0.25, 0.5, 0.75, 0.9), max_drafts: int = 8,
                          model: str = "qwen3-8b", hardware: str = "rtx-pro-6000-bw-ws", step_s: float = PLAIN_STEP_S,
                          context_tokens: int = 2048, mfu: float = CHAPTER_MFU, lookup_s: float = LOOKUP_S,
                          drafter_bytes: float = DRAFTER_BYTES) -> pd.DataFrame:
    """E[N_m] = 1 + sum_j a^j and the per-token latency T(m) / E[N_m] against draft length m, per
    constant acceptance a and draft source (reference section 8, sim.speculative).

    A round's verify costs max(the plain step, its FLOPs at `mfu`); drafting adds `lookup_s` (n-gram),
    m drafter passes (a draft model) or one pass (a parallel block drafter), a pass being the
    drafter's bytes at the plain step's effective bandwidth (2.10 GB at 588 GB/s = 3.57 ms). Four
    drafts: E[N] = 1.33 at a = 1/4, 3.05 at a = 3/4; per token 19.8 and 8.64 ms with the n-gram.
    """
    import pandas as pd
    from sim.modelspec import ModelSpec
    from sim.profile import load_hardware, load_model
    from sim.speculative import drafter_pass_s, expected_outputs_constant, verify_flops, verify_round_s
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
    import numpy as np
    from sim.speculative import best_draft_length
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
    from sim.speculative import draft_time_budget_s, expected_outputs_constant
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
    from sim.config import Scenario
    from sim.profile import load_fitted, profiles_dir
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
    from sim.simulation import Simulation
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


# ==== 05 capacity ===================================================================================

def goodput_vs_rate(rate_scales: Sequence[float] = (0.25, 0.5, 0.75, 1.0, 1.5),
                    scenario: str | Path = "quickstart.yaml", overrides: Sequence[str] = ()) -> pd.DataFrame:
    """The quickstart scenario (Qwen3-8B, one RTX PRO 6000, chunked prefill, the first 600 s of
    Azure's 2023 conversation trace, SLO TTFT <= 2 s, max ITL <= 0.2 s, E2E <= 30 s) with its
    arrivals sped up or slowed down (workload.rate_scale): goodput, throughput, SLO attainment and
    latency percentiles against the offered rate."""
    import pandas as pd
    rows = []
    for rs in rate_scales:
        res = _run(scenario, [*overrides, f"workload.rate_scale={rs}"])
        s, q = res.summary, res.requests
        span = float(q["arrival_s"].max() - q["arrival_s"].min())
        row = {"rate_scale": rs, "offered_rps": (len(q) - 1) / span if span > 0 else None, "requests": s["requests"],
               "completed": s["completed"], "good": s["good"], "request_throughput_rps": s["request_throughput_rps"],
               "goodput_rps": s["goodput_rps"], "slo_attainment": s["slo_attainment"],
               "output_throughput_tok_s": s["output_throughput_tok_s"], "preemptions": s["preemptions"]}
        for key in ("ttft_s", "tpot_s", "e2e_s", "itl_s"):
            for stat in ("median", "p90", "p99"):
                row[f"{key[:-2]}_{'p50' if stat == 'median' else stat}_s"] = s[key][stat]
        rows.append(row)
    return pd.DataFrame(rows)


def plot_goodput_vs_rate(table: pd.DataFrame, target: float = 0.9) -> Figure:
    fig, axes = _new_figure((12, 4.5), 1, 3)
    ax1, ax2, ax3 = axes[0]
    x = table["offered_rps"]
    ax1.plot(x, x, ":", color="0.5", label="offered")
    ax1.plot(x, table["request_throughput_rps"], "o-", color="C0", label="completed / s")
    ax1.plot(x, table["goodput_rps"], "s-", color="C2", label="goodput (met every SLO) / s")
    ax1.set_xlabel("offered arrival rate (req/s)")
    ax1.set_ylabel("requests / s")
    ax1.legend(fontsize=8)
    ax1.set_title("goodput against offered load", fontsize=9)
    ax2.plot(x, table["slo_attainment"], "o-", color="C2")
    ax2.axhline(target, color="C3", ls="--", label=f"attainment target {target:g}")
    ax2.set_ylim(0, 1.05)
    ax2.set_xlabel("offered arrival rate (req/s)")
    ax2.set_ylabel("SLO attainment (good / all)")
    ax2.legend(fontsize=8)
    ax2.set_title("SLO attainment", fontsize=9)
    for key, c in (("ttft", "C1"), ("e2e", "C4"), ("tpot", "C0")):
        ax3.plot(x, table[f"{key}_p50_s"], "o-", color=c, ms=4, label=f"{key.upper()} p50")
        ax3.plot(x, table[f"{key}_p99_s"], "^--", color=c, ms=4, label=f"{key.upper()} p99")
    ax3.set_yscale("log")
    ax3.set_xlabel("offered arrival rate (req/s)")
    ax3.set_ylabel("seconds (log)")
    ax3.legend(fontsize=7, ncol=2)
    ax3.set_title("latency percentiles", fontsize=9)
    for ax in (ax1, ax2, ax3):
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle("Azure 2023 conversation trace (first 600 s) on Qwen3-8B / RTX PRO 6000, chunked prefill; "
                 "SLO TTFT <= 2 s, max ITL <= 0.2 s, E2E <= 30 s", fontsize=10)
    return fig


def replicas_needed(target_rps: float = 20.0, scenario: str | Path = "quickstart.yaml", attainment: float = 0.9,
                    requests: int | None = 1000, replications: int = 1, tol: float = 0.05,
                    overrides: Sequence[str] = ()) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`capsim plan` in-process (sim.plan.run_plan): the goodput capacity per replica by bisection on
    the arrival rate, then the replicas that meet the attainment target at `target_rps` by simulation
    (least-outstanding router), next to the division estimate. Returns (rates, replicas): the
    attainment at every rate tried, and at every cluster size tried, each with the plan's answer in
    its columns (capacity_per_replica_rps; division_replicas, simulated_replicas)."""
    import tempfile

    import pandas as pd
    from sim.plan import run_plan
    with tempfile.TemporaryDirectory() as tmp:
        res = run_plan(_scenario_file(scenario), tmp, target=attainment, target_rps=target_rps, overrides=overrides,
                       replications=replications, requests=requests, tol=tol, workers=1, plots=False)
    d = res.as_dict()
    rates = pd.DataFrame(d["rates"])
    rates["capacity_per_replica_rps"] = d["capacity"]["per_replica_rps"]
    rates["attainment_target"] = attainment
    rep = d["replicas"] or {}
    replicas = pd.DataFrame(rep.get("tried", []))
    for k in ("target_rps", "per_replica_capacity_rps", "division_estimate", "division_replicas", "simulated_replicas"):
        replicas[k] = rep.get(k)
    replicas["attainment_target"] = attainment
    return rates, replicas


def plot_replicas(rates: pd.DataFrame, replicas: pd.DataFrame) -> Figure:
    import pandas as pd
    fig, axes = _new_figure((11, 4.5), 1, 2)
    ax1, ax2 = axes[0]
    target = float(rates["attainment_target"].iloc[0])
    r = rates.sort_values("rate_per_replica_rps")
    ax1.plot(r["rate_per_replica_rps"], r["attainment"], "o-", color="C0", label="attainment at each rate tried")
    ax1.axhline(target, color="C3", ls="--", label=f"target {target:g}")
    cap = rates["capacity_per_replica_rps"].iloc[0]
    if cap is not None and not pd.isna(cap):
        ax1.axvline(cap, color="C2", label=f"goodput capacity {cap:.3g} req/s per replica")
    ax1.set_xlabel("arrival rate per replica (req/s)")
    ax1.set_ylabel("SLO attainment")
    ax1.set_title("capacity of one replica (bisection on the rate)", fontsize=9)
    ax1.legend(fontsize=8)
    ax1.grid(True, alpha=0.3)
    if len(replicas):
        row = replicas.iloc[0]
        ax2.plot(replicas["replicas"], replicas["attainment"], "o-", color="C0", label="simulated attainment")
        ax2.axhline(target, color="C3", ls="--", label=f"target {target:g}")
        ax2.axvline(row["division_estimate"], color="0.5", ls=":",
                    label=f"target / capacity = {row['division_estimate']:.2f} -> {int(row['division_replicas'])}")
        if not pd.isna(row["simulated_replicas"]):
            n = int(row["simulated_replicas"])
            y = float(replicas.loc[replicas["replicas"] == n, "attainment"].iloc[0])
            ax2.plot(n, y, "*", color="C2", ms=15, label=f"simulated: {n} replicas")
        ax2.set_xlabel("replicas (least-outstanding router)")
        ax2.set_ylabel("SLO attainment")
        ax2.set_title(f"replicas for {row['target_rps']:g} req/s", fontsize=9)
        ax2.set_xticks(replicas["replicas"])
        ax2.legend(fontsize=8)
        ax2.grid(True, alpha=0.3)
    fig.suptitle("capsim plan on the Azure conversation trace (quickstart scenario)", fontsize=10)
    return fig


SCHEMES = {"A": "scheme-a", "B": "scheme-b", "C": "scheme-c", "D": "scheme-d"}


def memory_deadline_plane(schemes: dict[str, str] | None = None, variants: Sequence[str] = ("", "-6gib"),
                          deadline_s: float | None = 7.0) -> pd.DataFrame:
    """The chapter's worked comparison (reference section 9, figure 8-35) through sim.plan.plane_rows:
    each scheme at (KV need / KV budget, makespan / deadline). 12 GiB: A 19,008 MiB (out of memory
    and late), B 6048 MiB and 9.01 s (late), C 9.86 GiB and 14.55 s (late), D 9236 MiB and 4.56 s
    (feasible); with 6 GiB ("-6gib") nothing is feasible."""
    import pandas as pd
    from sim.plan import plane_rows
    schemes = SCHEMES if schemes is None else schemes
    rows = []
    for variant in variants:
        for label, stem in schemes.items():
            path = CHAPTER8 / f"{stem}{variant}.yaml"
            if not path.exists():
                continue
            row = plane_rows([path], deadline_s=deadline_s)[0]
            rows.append({"label": label, "variant": variant.lstrip("-") or "12gib", **row})
    return pd.DataFrame(rows)


def plot_memory_deadline_plane(plane: pd.DataFrame) -> Figure:
    import numpy as np
    from sim.plan import QUADRANTS
    fig, axes = _new_figure((8.5, 6.5))
    ax = axes[0][0]
    finite = plane["deadline_ratio"][np.isfinite(plane["deadline_ratio"])]
    xmax = max(1.5, plane["memory_ratio"].max()) * 1.15
    ymax = max(1.5, finite.max() if len(finite) else 1.5) * 1.15
    ax.axvline(1, color="0.3", lw=1)
    ax.axhline(1, color="0.3", lw=1)
    ax.fill_between([0, 1], 0, 1, color="C2", alpha=0.08)
    variants = list(dict.fromkeys(plane["variant"]))
    markers = ["o", "s", "D", "^"]
    where: dict[tuple, tuple[float, float]] = {}
    for row in plane.itertuples(index=False):
        y = row.deadline_ratio if math.isfinite(row.deadline_ratio) else ymax * 0.97
        where[(row.label, row.variant)] = (row.memory_ratio, y)
        _, color = QUADRANTS[(row.memory_ratio > 1, y > 1)]
        main = row.variant == variants[0]
        mk = markers[variants.index(row.variant) % len(markers)]
        ax.plot(row.memory_ratio, y, mk, color=color, ms=10 if main else 7, mfc=color if row.feasible else "white",
                mew=2, zorder=3)
        if main:
            text = f"{row.label}: {row.kv_need_bytes / MiB:,.0f} MiB, {row.makespan_s:.2f} s"
            ax.annotate(text, (row.memory_ratio, y), textcoords="offset points", xytext=(8, 5), fontsize=8)
        else:
            ax.annotate(f"{row.label} @ {row.variant.replace('gib', ' GiB')}", (row.memory_ratio, y),
                        textcoords="offset points", xytext=(7, -12), fontsize=7, color="0.3")
    for label, variant in where:   # what a smaller budget does to each scheme
        if variant != variants[0] and (label, variants[0]) in where:
            ax.annotate("", where[(label, variant)], where[(label, variants[0])],
                        arrowprops={"arrowstyle": "->", "color": "0.6", "lw": 0.8, "shrinkA": 6, "shrinkB": 6})
    for (oom, late), (name, color) in QUADRANTS.items():
        ax.text(1 + 0.02 * xmax if oom else 0.02 * xmax, ymax * 0.97 if late else 0.03 * ymax, name, color=color,
                fontsize=9, va="top" if late else "bottom")
    for i, v in enumerate(variants):
        ax.plot([], [], markers[i % len(markers)], color="0.3", label=f"KV budget {v.replace('gib', ' GiB')}")
    ax.plot([], [], "o", color="0.3", mfc="white", mew=2, label="infeasible (hollow)")
    ax.legend(fontsize=8, loc="center right")
    ax.set_xlim(0, xmax)
    ax.set_ylim(0, ymax)
    ax.set_xlabel("KV need / KV budget")
    dl = plane["deadline_s"].iloc[0]
    ax.set_ylabel(f"makespan / deadline ({dl:g} s)")
    ax.set_title("16 long requests, schemes A-D on the memory / deadline plane (reference section 9, figure 8-35)",
                 fontsize=9)
    ax.grid(True, alpha=0.3)
    return fig


# ==== all figures: capsim figures ==================================================================

@dataclass(frozen=True)
class FigureSpec:
    """One figure of `capsim figures`: its notebook, what it shows, and how to build it."""

    name: str
    notebook: str
    title: str
    build: Callable[[Path | None], tuple]   # data_dir -> (Figure, {suffix: DataFrame})
    needs_shared_data: bool = False


def _b_memory_fit(_):
    t = memory_fit_table()
    return plot_memory_fit(t), {"": t}


def _b_reads(_):
    t = reads_per_token()
    return plot_reads_per_token(t), {"": t}


def _b_gantt(_):
    g = scheduler_gantt(POLICIES)
    iv = output_intervals()
    return plot_scheduler_gantt(g, iv), {"": g, "-r0-intervals": iv}


def _b_budget(_):
    t = token_budget_tradeoff()
    return plot_token_budget(t), {"": t}


def _b_prefix_cache(data_dir):
    trace = mooncake_trace(data_dir)
    if trace is None:
        raise FileNotFoundError(f"the Mooncake conversation trace is not under {data_dir or shared_data_dir()} "
                                f"({MOONCAKE_REL})")
    t = prefix_cache_curve(trace)
    return plot_prefix_cache(t), {"": t}


def _b_prefix_value(_):
    t = prefix_value_per_byte()
    return plot_prefix_value(t), {"": t}


def _b_spec(_):
    t = speculative_tradeoffs()
    return plot_speculative_tradeoffs(t), {"": t}


def _b_draft_budget(_):
    t = draft_time_budget()
    return plot_draft_time_budget(t), {"": t}


def _b_spec_conc(_):
    t = speculation_vs_concurrency()
    return plot_speculation_vs_concurrency(t), {"": t, "-crossover": speculation_crossover(t)}


def _b_goodput(_):
    t = goodput_vs_rate()
    return plot_goodput_vs_rate(t), {"": t}


def _b_replicas(_):
    rates, reps = replicas_needed()
    return plot_replicas(rates, reps), {"-rates": rates, "": reps}


def _b_plane(_):
    t = memory_deadline_plane()
    return plot_memory_deadline_plane(t), {"": t}


FIGURES: dict[str, FigureSpec] = {f.name: f for f in (
    FigureSpec("memory-fit", "01-memory-fit", "KV per token and requests that fit 12 GiB, every shipped model", _b_memory_fit),
    FigureSpec("reads-per-token", "01-memory-fit", "reads per output token against batch size, b_KV (figure 8-3)", _b_reads),
    FigureSpec("scheduler-gantt", "02-schedulers", "the four-request example: fixed, continuous, chunked", _b_gantt),
    FigureSpec("token-budget", "02-schedulers", "token budget: late arrivals' TTFT vs the longest interval", _b_budget),
    FigureSpec("prefix-cache", "03-prefix-caching", "hit rate and TTFT against KV size, Mooncake trace",
               _b_prefix_cache, needs_shared_data=True),
    FigureSpec("prefix-value", "03-prefix-caching", "value per byte of long vs short prefixes (section 6)", _b_prefix_value),
    FigureSpec("speculative-tradeoffs", "04-speculative", "E[N] and per-token latency vs draft length, acceptance", _b_spec),
    FigureSpec("draft-budget", "04-speculative", "the draft-time budget crossover (figure 8-32)", _b_draft_budget),
    FigureSpec("speculation-concurrency", "04-speculative", "speculation vs plain decode as concurrency rises", _b_spec_conc),
    FigureSpec("goodput-vs-rate", "05-capacity-plan", "goodput and latency percentiles vs arrival rate, Azure trace", _b_goodput),
    FigureSpec("replicas", "05-capacity-plan", "capacity per replica and replicas for 20 req/s (capsim plan)", _b_replicas),
    FigureSpec("memory-deadline-plane", "05-capacity-plan", "schemes A-D on the memory / deadline plane (figure 8-35)", _b_plane),
)}


def build_figure(name: str, data_dir: str | Path | None = None):
    """(Figure, {suffix: DataFrame}) of one figure of :data:`FIGURES`."""
    if name not in FIGURES:
        raise KeyError(f"unknown figure {name!r}; known: {', '.join(FIGURES)}")
    return FIGURES[name].build(Path(data_dir) if data_dir else None)


def write_figures(out_dir: str | Path, only: Iterable[str] | None = None, data_dir: str | Path | None = None,
                  log: Callable[[str], None] | None = None, dpi: int = 110) -> tuple[list[Path], dict[str, str]]:
    """Write `<name>.png` and its data `<name>[suffix].csv` for each figure (all, or `only`).

    A figure that needs the public data folder is skipped when the data is absent, unless it was
    asked for by name in `only` (then FileNotFoundError). Returns (files written, {skipped: reason}).
    """
    names = list(only) if only else list(FIGURES)
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        raise KeyError(f"unknown figure(s) {', '.join(unknown)}; known: {', '.join(FIGURES)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    skipped: dict[str, str] = {}
    for name in names:
        spec = FIGURES[name]
        try:
            fig, tables = build_figure(name, data_dir)
        except FileNotFoundError as exc:
            if not spec.needs_shared_data or only:
                raise
            skipped[name] = str(exc)
            if log:
                log(f"skipped {name}: {exc}")
            continue
        png = out / f"{name}.png"
        fig.savefig(png, dpi=dpi)
        files.append(png)
        for suffix, table in tables.items():
            csv = out / f"{name}{suffix}.csv"
            table.to_csv(csv, index=False)
            files.append(csv)
        if log:
            log(f"{name}: {spec.title} -> {png}")
    return files, skipped


__all__ = [
    "FIGURES", "FigureSpec", "build_figure", "write_figures", "shared_data_dir", "mooncake_trace",
    "memory_fit_table", "plot_memory_fit", "reads_per_token", "plot_reads_per_token",
    "iteration_membership", "output_times", "scheduler_gantt", "output_intervals", "plot_scheduler_gantt",
    "token_budget_tradeoff", "plot_token_budget",
    "prefix_cache_curve", "plot_prefix_cache", "prefix_value_per_byte", "plot_prefix_value",
    "speculative_tradeoffs", "plot_speculative_tradeoffs", "draft_time_budget", "plot_draft_time_budget",
    "speculation_vs_concurrency", "speculation_crossover", "plot_speculation_vs_concurrency",
    "goodput_vs_rate", "plot_goodput_vs_rate", "replicas_needed", "plot_replicas",
    "memory_deadline_plane", "plot_memory_deadline_plane",
]
