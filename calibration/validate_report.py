"""What `capsim validate` prints and draws: headlines, the report, a point's plots, error against load."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from calibration.validate_errors import LATENCIES, PER_REQUEST
from sim.api import Result


def label_text(label: dict) -> str:
    """A load point's label as text, e.g. "rate_rps 1"."""
    return ", ".join(f"{k} {v:g}" for k, v in label.items() if v is not None)


def headline(point: dict) -> str:
    """One line with the median errors of a point."""
    m = point["metrics"]
    parts = [f"{k[:-2].upper()} median {_pct(m[k]['median']['rel_error'])}" for k in LATENCIES]
    parts.append(f"makespan {_pct(m['makespan_s']['rel_error'])}")
    return "errors (sim - real) / real: " + ", ".join(parts)


def _share(x) -> str:
    return "-" if x is None else f"{x:.0%}"


def _pct(x) -> str:
    return "-" if x is None else f"{x:+.1%}"


# ---------------------------------------------------------------------------------------------
# Plots (matplotlib, Agg)


def _ecdf(ax, values, label, **kw):
    v = np.sort(np.asarray(values, dtype=float))
    v = v[np.isfinite(v)]
    if len(v):
        ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", label=label, **kw)


def _save(fig, path: Path) -> Path:
    """Lay out, write and close a pyplot figure."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_point(measured: Result, simulated: Result, detail: pd.DataFrame, predicted: list[float], out: Path,
               title: str, other_replays: list[Result] = ()) -> list[Path]:
    """A point's figures: latency CDFs measured against simulated, and predicted against measured step times."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    fin_m = measured.requests[measured.requests["status"] == "finished"]
    fin_s = simulated.requests[simulated.requests["status"] == "finished"]
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    for ax, key in zip(axes, ("ttft_s", "tpot_s", "e2e_s")):
        for k, other in enumerate(other_replays):
            fin_o = other.requests[other.requests["status"] == "finished"]
            _ecdf(ax, fin_o[key], "other replays" if k == 0 else None, color="gray", linewidth=0.8, alpha=0.7)
        _ecdf(ax, fin_m[key], "measured (replay)", color="black")
        _ecdf(ax, fin_s[key], "simulated", color="tab:blue", linestyle="--")
        ax.set_xlabel(f"{key[:-2].upper()} (s)")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    ax = axes[3]
    _ecdf(ax, detail["duration_s"], "measured iteration", color="black")
    if predicted:
        _ecdf(ax, predicted, "profile on the same plans", color="tab:orange", linestyle="--")
    ax.set_xlabel("iteration time (s)")
    ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    ax.legend(fontsize=8)
    fig.suptitle(f"CDFs, simulated vs measured: {title}")
    files.append(_save(fig, out / "cdf.png"))

    j = fin_m.merge(fin_s, on="id", suffixes=("_real", "_sim"))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, key in zip(axes, PER_REQUEST):
        x, y = j[f"{key}_real"].to_numpy(float), j[f"{key}_sim"].to_numpy(float)
        ok = np.isfinite(x) & np.isfinite(y)
        ax.scatter(x[ok], y[ok], s=14, alpha=0.75)
        if ok.any():
            lo, hi = min(x[ok].min(), y[ok].min()), max(x[ok].max(), y[ok].max())
            ax.plot([lo, hi], [lo, hi], color="gray", linewidth=1)
        ax.set_xlabel(f"measured {key[:-2].upper()} (s)")
        ax.set_ylabel(f"simulated {key[:-2].upper()} (s)")
        ax.grid(alpha=0.3)
    fig.suptitle(f"Per request (paired by id): {title}")
    files.append(_save(fig, out / "scatter.png"))
    return files


def plot_error_vs_load(points: list[dict], path: Path, xkey: str) -> None:
    """Relative error of each latency's median against load, with the prediction's intervals moved onto
    the same scale: thick bars the model interval, thin bars the workload interval (clipped to the axes)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401

    xs = np.array([p[xkey] for p in points], dtype=float)
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    span = 0.0
    n = len(LATENCIES)
    for j, (key, color) in enumerate(zip(LATENCIES, ("tab:red", "tab:green", "tab:purple", "tab:blue"))):
        shift = xs * (1 + 0.035 * (j - (n - 1) / 2))   # side by side on the log axis
        ys = np.array([np.nan if p["metrics"][key]["median"]["rel_error"] is None else
                       100 * p["metrics"][key]["median"]["rel_error"] for p in points])
        span = max(span, np.nanmax(np.abs(ys)) if np.isfinite(ys).any() else 0.0)
        for name, width, alpha in (("workload", 0.8, 0.45), ("model", 2.5, 0.9)):
            for x, p, y in zip(shift, points, ys):
                iv = p["uncertainty"]["metrics"][f"{key}.median"]
                band, meas = iv[f"{name}_interval"], iv["measured"]
                if band is None or not meas or not np.isfinite(y):
                    continue
                ax.plot([x, x], [100 * (band[0] / meas - 1), 100 * (band[1] / meas - 1)], color=color,
                        linewidth=width, alpha=alpha)
        ax.plot(shift, ys, marker="o", color=color, label=f"{key[:-2].upper()} median")
    lim = max(30.0, 1.6 * span)
    ax.set_ylim(-lim, lim)
    ax.axhline(0, color="gray", linewidth=1)
    ax.set_xscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{x:g}" for x in xs])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("arrival rate (req/s)" if xkey == "rate_rps" else "trace rate scale")
    ax.set_ylabel("(simulated - measured) / measured (%)")
    ax.set_title("Error against load; bars: model (thick) and workload (thin) intervals", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_report(report: dict, file=None) -> None:
    """The validation report as text on `file` (stdout by default)."""
    file = file or sys.stdout
    print(f"{report['scenario']}: {report['device_name']}, {report['dtype']}, clock {report['clock']}, "
          f"profile {Path(report['profile']).name} ({report['use']})", file=file)
    head = f"{'point':<14}{'TTFT med':>10}{'TPOT med':>10}{'ITL med':>10}{'E2E med':>10}{'E2E p90':>10}" \
           f"{'makespan':>10}{'tput':>9}  {'dominant':<9}{'widest':<12}{'core':>6}{'plans':>6}"
    print(head, file=file)
    for p in report["points"]:
        m = p["metrics"]
        label = label_text({k: p.get(k) for k in ("rate_rps", "rate_scale")}) or "-"
        row = (f"{label:<14}" + "".join(f"{_pct(m[k]['median']['rel_error']):>10}" for k in LATENCIES)
               + f"{_pct(m['e2e_s']['p90']['rel_error']):>10}{_pct(m['makespan_s']['rel_error']):>10}"
               + f"{_pct(m['output_throughput_tok_s']['rel_error']):>9}  {str(p['uncertainty']['dominant']):<9}"
               + f"{str(p['uncertainty'].get('widest', '-')):<12}"
               + f"{_share(p['step_time'].get('forward_cpu_share') if report['device'] == 'cpu' else None):>6}"
               + f"{'same' if p['replay_consistency'].get('identical') else 'DIFF':>6}")
        print(row, file=file)
