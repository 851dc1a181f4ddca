"""Notebook 05: goodput against rate, replicas for a target rate, the memory / deadline plane."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

from sim.figures.common import CHAPTER8, REPO, MiB, _new_figure, _run, _scenario_file


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
    """Goodput, SLO attainment and latency percentiles against the offered rate (goodput_vs_rate's table)."""
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
    """`capsim plan` in-process (sim.planning.capacity.run_plan): the goodput capacity per replica by bisection on
    the arrival rate, then the replicas that meet the attainment target at `target_rps` by simulation
    (least-outstanding router), next to the division estimate. Returns (rates, replicas): the
    attainment at every rate tried, and at every cluster size tried, each with the plan's answer in
    its columns (capacity_per_replica_rps; division_replicas, simulated_replicas)."""
    import tempfile

    import pandas as pd
    from sim.planning.capacity import run_plan
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
    """Capacity per replica and the replicas a target rate needs, by division and by simulation."""
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
    """The chapter's worked comparison (reference section 9, figure 8-35) through sim.planning.plane.plane_rows:
    each scheme at (KV need / KV budget, makespan / deadline). 12 GiB: A 19,008 MiB (out of memory
    and late), B 6048 MiB and 9.01 s (late), C 9.86 GiB and 14.55 s (late), D 9236 MiB and 4.56 s
    (feasible); with 6 GiB ("-6gib") nothing is feasible."""
    import pandas as pd
    from sim.planning.plane import plane_rows
    schemes = SCHEMES if schemes is None else schemes
    rows = []
    for variant in variants:
        for label, stem in schemes.items():
            path = CHAPTER8 / f"{stem}{variant}.yaml"
            if not path.exists():
                continue
            row = plane_rows([path], deadline_s=deadline_s)[0]
            # relative to the repository, so the table is the same wherever it is checked out
            row["file"] = path.resolve().relative_to(REPO).as_posix()
            rows.append({"label": label, "variant": variant.lstrip("-") or "12gib", **row})
    return pd.DataFrame(rows)


def plot_memory_deadline_plane(plane: pd.DataFrame) -> Figure:
    """Schemes on the memory / deadline plane, with the feasible quadrant shaded (figure 8-35)."""
    import numpy as np
    from sim.planning.plane import QUADRANTS
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
