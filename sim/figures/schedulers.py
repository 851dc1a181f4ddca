"""Notebook 02: fixed, continuous and chunked scheduling as iteration timelines; the token budget trade-off."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure
    from sim.core.simulation import Result

from sim.figures.common import CHAPTER8, _log2_batches, _new_figure, _run


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
    """Late arrivals' TTFT and the running request's longest interval against the token budget."""
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
