"""The report's figures, drawn with matplotlib (Agg) and returned as deterministic SVG bytes.

Every function returns `bytes` of one SVG document: the same data gives the same bytes (a fixed
hash salt for clip-path ids, no creation date), so a report is reproducible like the run it shows.
"""

from __future__ import annotations

import io
import math
import re

import numpy as np

SVG_RC = {"svg.hashsalt": "capsim-report", "savefig.format": "svg", "font.size": 9}
LATENCY_PANELS = (("ttft_s", "TTFT", "ttft_s"), ("tpot_s", "TPOT", None), ("max_itl_s", "largest ITL of a request",
                                                                         "itl_s"), ("e2e_s", "E2E", "e2e_s"))
MAX_CDF_POINTS = 800
MAX_RAW_ITERATIONS = 3000
TIME_BINS = 600


def _svg(fig) -> bytes:
    """Serialise a Figure to SVG without the (time-stamped) metadata block."""
    import matplotlib
    buf = io.BytesIO()
    with matplotlib.rc_context(SVG_RC):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": "capsim report (matplotlib)"})
    return re.sub(rb"<metadata>.*?</metadata>\s*", b"", buf.getvalue(), flags=re.S)


def _figure(width: float, height: float, rows: int = 1, cols: int = 1, **kw):
    from matplotlib import rc_context
    from matplotlib.figure import Figure
    with rc_context(SVG_RC):
        fig = Figure(figsize=(width, height), layout="constrained")
        axes = fig.subplots(rows, cols, squeeze=False, **kw)
    return fig, axes


def _legend(ax, **kw) -> None:
    """A legend, only when the axes hold something labelled (a run where nothing finished draws no curve,
    and matplotlib warns on an empty legend)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kw)


def ecdf_points(values, max_points: int = MAX_CDF_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """(x, F(x)) of the empirical CDF of the finite values; thinned to at most `max_points` steps (the
    order statistics at evenly spaced ranks, always keeping the smallest and the largest)."""
    v = np.sort(np.asarray(values, dtype=float))
    v = v[np.isfinite(v)]
    n = len(v)
    if n == 0:
        return v, v
    ranks = np.arange(1, n + 1)
    if n > max_points:
        idx = np.unique(np.linspace(0, n - 1, max_points).round().astype(int))
        return v[idx], ranks[idx] / n
    return v, ranks / n


def _log_if_wide(ax, values) -> None:
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    if len(v) and v.max() / v.min() > 100:
        ax.set_xscale("log")


def latency_cdfs(series: dict[str, object], slo: dict[str, float | None], title: str = "") -> bytes:
    """CDFs of TTFT, TPOT, each request's largest ITL and E2E (ms). `series` maps a legend label to a
    requests table (finished rows are used); dashed verticals mark the SLO bounds given in `slo`; an axis
    turns logarithmic when its values (bound included) span more than 100x."""
    fig, axes = _figure(10, 6.2, 2, 2)
    styles = [dict(color="C0"), dict(color="black", linestyle="--"), dict(color="C1", linestyle=":")]
    for ax, (col, name, slo_key) in zip(axes.flat, LATENCY_PANELS):
        everything, drawn = [], False
        for (label, req), style in zip(series.items(), styles):
            fin = req.loc[req["status"] == "finished", col].to_numpy(dtype=float) * 1e3
            x, y = ecdf_points(fin)
            everything.extend(x)
            if len(x):
                drawn = True
                ax.step(x, y, where="post", label=f"{label} ({int(np.isfinite(fin).sum())} requests)", **style)
        bound = slo.get(slo_key) if slo_key else None
        if bound:
            ax.axvline(bound * 1e3, color="C3", linestyle="--", linewidth=1, label=f"SLO {bound * 1e3:g} ms")
            everything.append(bound * 1e3)   # a bound far from the data calls for a log axis too
        _log_if_wide(ax, everything)
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of finished requests")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
        if not drawn:
            ax.text(0.5, 0.5, "no finished request has a value", transform=ax.transAxes, ha="center", va="center")
        _legend(ax, fontsize=7, loc="lower right")
    if title:
        fig.suptitle(title)
    return _svg(fig)


def _binned(t0: np.ndarray, dur: np.ndarray, v: np.ndarray, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per time bin (by iteration start): the duration-weighted mean of v over busy time, and its max."""
    idx = np.clip(np.searchsorted(edges, t0, side="right") - 1, 0, len(edges) - 2)
    w = np.bincount(idx, dur, len(edges) - 1)
    s = np.bincount(idx, dur * v, len(edges) - 1)
    mx = np.full(len(edges) - 1, np.nan)
    np.fmax.at(mx, idx, v)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(w > 0, s / w, np.nan)
    return mean, mx


def timeline(iterations, block_bytes: float, kv_capacity_bytes: float) -> tuple[bytes, str]:
    """Batch size, tokens per iteration and KV in use against simulated time, per replica (at most four
    drawn; more are summed into the cluster's total). Returns the SVG and a sentence saying how the
    series were drawn (every iteration, or binned)."""
    its = iterations
    reps = sorted(its["replica"].unique()) if len(its) else []
    fig, axes = _figure(10, 7.2, 3, 1, sharex=True)
    panels = (("batch_size", "batch size (sequences)", 1.0), ("new_tokens", "tokens per iteration", 1.0),
              ("kv_blocks_in_use", "KV in use (GiB)", block_bytes / 2**30))
    raw = len(its) <= MAX_RAW_ITERATIONS
    groups = [(f"replica {r}", its[its["replica"] == r]) for r in reps] if len(reps) <= 4 else [("all replicas", its)]
    t_end = float((its["start_s"] + its["duration_s"]).max()) if len(its) else 1.0
    edges = np.linspace(float(its["start_s"].min()) if len(its) else 0.0, t_end, TIME_BINS + 1)
    for k, (label, g) in enumerate(groups):
        t, d = g["start_s"].to_numpy(float), g["duration_s"].to_numpy(float)
        for ax, (col, ylabel, scale) in zip(axes[:, 0], panels):
            v = g[col].to_numpy(float) * scale
            if raw:
                ax.step(t, v, where="post", color=f"C{k}", linewidth=0.8, label=label)
            else:
                mean, mx = _binned(t, d, v, edges)
                mid = 0.5 * (edges[1:] + edges[:-1])
                ax.plot(mid, mx, color=f"C{k}", linewidth=0.5, alpha=0.35)
                ax.plot(mid, mean, color=f"C{k}", linewidth=1.0, label=f"{label}: mean")
            ax.set_ylabel(ylabel)
    kv_ax = axes[2, 0]
    kv_ax.axhline(kv_capacity_bytes / 2**30, color="C3", linestyle="--", linewidth=1,
                  label=f"KV capacity {kv_capacity_bytes / 2**30:.2f} GiB")
    for ax in axes[:, 0]:
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    if not len(its):
        axes[0, 0].text(0.5, 0.5, "no iterations ran", transform=axes[0, 0].transAxes, ha="center", va="center")
    _legend(axes[0, 0], fontsize=7, loc="upper right")
    _legend(kv_ax, fontsize=7, loc="lower right")
    kv_ax.set_xlabel("simulated time (s)")
    how = ("every iteration drawn as a step" if raw else
           f"{len(its):,} iterations in {TIME_BINS} time bins of {(edges[1] - edges[0]):.3g} s: thick line the "
           "duration-weighted mean over busy time, thin line the largest iteration in the bin")
    if len(reps) > 4:
        how += f"; {len(reps)} replicas pooled"
    return _svg(fig), how


def goodput_vs_rate(rates: list[dict], target: float, capacity_per_replica: float | None, title: str) -> bytes:
    """Plan: SLO attainment (mean and seed range) and request goodput per replica against the offered
    rate per replica, with the attainment target and the capacity found."""
    fig, axes = _figure(10, 4.2, 1, 2)
    rows = sorted(rates, key=lambda r: r["rate_per_replica_rps"])
    x = [r["rate_per_replica_rps"] for r in rows]
    ax = axes[0, 0]
    ax.fill_between(x, [r["attainment_min"] for r in rows], [r["attainment_max"] for r in rows], color="C0",
                    alpha=0.15, label="range over seeds")
    ax.plot(x, [r["attainment"] for r in rows], "o-", color="C0", label="mean attainment")
    ax.axhline(target, color="C3", linestyle="--", label=f"target {target:g}")
    ax.set_ylabel("SLO attainment (fraction of requests)")
    ax = axes[0, 1]
    ax.plot(x, [r["request_goodput_rps_per_replica"] for r in rows], "o-", color="C2", label="request goodput")
    ax.plot(x, x, color="0.6", linewidth=1, label="offered rate (all good)")
    ax.set_ylabel("goodput per replica (req/s)")
    for ax in axes[0]:
        if capacity_per_replica:
            ax.axvline(capacity_per_replica, color="C2", linewidth=1,
                       label=f"capacity {capacity_per_replica:.4g} req/s")
        ax.set_xlabel("offered rate per replica (req/s)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    return _svg(fig)


def replicas_figure(tried: list[dict], target: float, target_rps: float) -> bytes:
    """Plan: attainment against the cluster size at the target rate (mean and seed range)."""
    fig, axes = _figure(7, 3.6)
    ax = axes[0, 0]
    rows = sorted(tried, key=lambda r: r["replicas"])
    n = [r["replicas"] for r in rows]
    ax.errorbar(n, [r["attainment"] for r in rows],
                yerr=[[r["attainment"] - r["attainment_min"] for r in rows],
                      [r["attainment_max"] - r["attainment"] for r in rows]], fmt="o-", color="C0", capsize=3,
                label="mean attainment (bars: seeds)")
    ax.axhline(target, color="C3", linestyle="--", label=f"target {target:g}")
    ax.set_xticks(n)
    ax.set_xlabel(f"replicas serving {target_rps:g} req/s")
    ax.set_ylabel("SLO attainment")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return _svg(fig)


def plane_figure(points: list[dict], y_label: str) -> bytes:
    """The memory / deadline plane, drawn by the capacity planner's own plot (one look across commands)."""
    import matplotlib
    from sim.planning.plane import plot_plane
    buf = io.BytesIO()
    with matplotlib.rc_context(SVG_RC):
        plot_plane(points, buf, y_label=y_label)
    return re.sub(rb"<metadata>.*?</metadata>\s*", b"", buf.getvalue(), flags=re.S)


def per_request_scatter(measured, simulated) -> bytes:
    """Validation: each request's simulated against measured TTFT, TPOT and E2E (paired by id), ms."""
    fig, axes = _figure(10.5, 3.6, 1, 3)
    fm = measured[measured["status"] == "finished"]
    fs = simulated[simulated["status"] == "finished"]
    j = fm.merge(fs, on="id", suffixes=("_real", "_sim"))
    for ax, key in zip(axes[0], ("ttft_s", "tpot_s", "e2e_s")):
        x, y = j[f"{key}_real"].to_numpy(float) * 1e3, j[f"{key}_sim"].to_numpy(float) * 1e3
        ok = np.isfinite(x) & np.isfinite(y)
        ax.scatter(x[ok], y[ok], s=10, alpha=0.7)
        if ok.any():
            lo, hi = min(x[ok].min(), y[ok].min()), max(x[ok].max(), y[ok].max())
            ax.plot([lo, hi], [lo, hi], color="0.5", linewidth=1, label="simulated = measured")
            ax.legend(fontsize=7)
        name = key[:-2].upper()
        ax.set_xlabel(f"measured {name} (ms)")
        ax.set_ylabel(f"simulated {name} (ms)")
        ax.grid(True, alpha=0.3)
    return _svg(fig)


def finite(x) -> bool:
    """A real, finite number."""
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def layouts_figure(rows: list[dict], per_dollar: bool) -> bytes:
    """Layout plan: each deployment with a capacity, its goodput per GPU (or requests per dollar), best on top."""
    key = "requests_per_dollar" if per_dollar else "goodput_per_gpu_rps"
    shown = [r for r in rows if r.get("capacity_rps") and r.get(key)]
    fig, axes = _figure(7, 0.6 + 0.28 * max(len(shown), 1))
    ax = axes[0, 0]
    y = list(range(len(shown)))[::-1]
    colours = ["C0" if r["mode"] == "agg" else "C1" for r in shown]
    ax.barh(y, [r[key] for r in shown], color=colours)
    ax.set_yticks(y, [r["deployment"] for r in shown], fontsize=7)
    ax.set_xlabel("requests per dollar at capacity" if per_dollar else "goodput capacity per GPU (req/s)")
    from matplotlib.patches import Patch
    handles = [Patch(color=c, label=label) for mode, c, label in (("agg", "C0", "aggregated replicas"),
                                                                    ("disagg", "C1", "disaggregated pools"))
               if any(r["mode"] == mode for r in shown)]
    if handles:
        fig.legend(handles=handles, fontsize=7, loc="outside upper right", ncol=len(handles), frameon=False)
    ax.grid(True, axis="x", alpha=0.3)
    return _svg(fig)
