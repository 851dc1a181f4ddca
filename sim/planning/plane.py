"""The memory / deadline plane (reference section 9, figure 8-35): each configuration placed by its
KV need over its budget and its completion over its deadline; only the lower-left quadrant is feasible.

    capsim plan-plane FILES... [--deadline S] --out DIR
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Iterable

from sim.io.errors import ConfigError
from sim.planning.sweep import write_tables


QUADRANTS = {(False, False): ("feasible", "C2"), (True, False): ("out of memory", "C3"),
             (False, True): ("late", "C1"), (True, True): ("out of memory and late", "C4")}


def quadrant(memory_ratio: float, deadline_ratio: float | None) -> str:
    """Which quadrant of the memory / deadline plane a configuration falls in (feasible, out of memory, late, both)."""
    late = deadline_ratio is not None and deadline_ratio > 1
    return QUADRANTS[(memory_ratio > 1, late)][0]


def plane_marks(pts: list[dict], ymax: float) -> tuple[dict[tuple, list[str]], dict[tuple, bool]]:
    """Marker spots of the plane: the labels at each (x, y) and whether its marker is filled (feasible).
    A filled marker lies in the feasible quadrant only: a configuration that meets its SLO target while
    its KV need exceeds the budget (requests queue for KV) is labelled so, never filled as OOM."""
    spots: dict[tuple, list[str]] = {}  # configurations at the same spot share one marker and label
    feasible: dict[tuple, bool] = {}
    for p in pts:
        y = p["deadline_ratio"] if math.isfinite(p["deadline_ratio"]) else ymax * 0.97
        label = p["label"] + ("" if math.isfinite(p["deadline_ratio"]) else " (never)")
        spot = (round(p["memory_ratio"], 4), round(y, 4))
        # filled only inside the feasible quadrant: a configuration that meets its SLO target while its
        # KV need exceeds the budget (requests queue for KV) is no "feasible" mark in the OOM quadrant
        inside = p["memory_ratio"] <= 1 and y <= 1
        if p.get("feasible") and not inside:
            label += (" (meets the SLO target: requests queue for KV)" if p["memory_ratio"] > 1
                      else " (meets the SLO target; completion past the deadline)")
        spots.setdefault(spot, []).append(label)
        feasible[spot] = feasible.get(spot, False) or bool(p.get("feasible") and inside)
    return spots, feasible


def plot_plane(points: list[dict], path: Path, y_label: str = "completion / deadline",
               title: str = "memory / deadline plane (reference section 9, figure 8-35)") -> Path:
    """Each configuration at (KV need / KV budget, completion / deadline); the feasible region is
    the lower-left quadrant of the lines at 1."""
    from matplotlib.figure import Figure
    pts = [p for p in points if p.get("deadline_ratio") is not None]
    finite = [p["deadline_ratio"] for p in pts if math.isfinite(p["deadline_ratio"])]
    ymax = max([1.5, *finite]) * 1.15
    xmax = max([1.5, *(p["memory_ratio"] for p in pts)]) * 1.15
    fig = Figure(figsize=(8, 6), layout="constrained")
    ax = fig.subplots()
    ax.axvline(1, color="0.3", lw=1)
    ax.axhline(1, color="0.3", lw=1)
    ax.axvspan(0, 1, ymin=0, ymax=1 / ymax, color="C2", alpha=0.08)
    spots, feasible = plane_marks(pts, ymax)
    for i, ((x, y), labels) in enumerate(sorted(spots.items())):
        name, color = QUADRANTS[(x > 1, y > 1)]
        ax.plot(x, y, "o", color=color, ms=8, markerfacecolor=color if feasible[(x, y)] else "white", mew=2)
        ax.annotate("\n".join(labels), (x, y), textcoords="offset points", xytext=(6, 5 if i % 2 == 0 else -12),
                    fontsize=7, va="bottom" if i % 2 == 0 else "top")
    for (oom, late), (name, color) in QUADRANTS.items():
        ax.text(1 + 0.02 * xmax if oom else 0.02 * xmax, ymax * 0.97 if late else 0.03 * ymax, name, color=color,
                fontsize=9, va="top" if late else "bottom")
    ax.plot([], [], "o", color="0.3", label="feasible (filled)")
    ax.plot([], [], "o", color="0.3", markerfacecolor="white", mew=2, label="infeasible (hollow)")
    ax.legend(fontsize=8, loc="center right")
    ax.set_xlim(0, xmax)
    ax.set_ylim(0, ymax)
    ax.set_xlabel("KV need / KV budget")
    ax.set_ylabel(y_label)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    fig.savefig(path, dpi=110)
    return path


# ---- the plane of given scenario files --------------------------------------------------------

def plane_rows(paths: Iterable[str | Path], overrides: Iterable[str] = (), deadline_s: float | None = None) -> list[dict]:
    """Each scenario placed by KV need against its budget and completion (makespan: first arrival to
    last completion) against the deadline (--deadline, else the scenario's slo.e2e_s)."""
    from sim.api import run_scenario
    from sim.io.config import load_scenario
    rows = []
    for path in paths:
        sc, _ = load_scenario(path, list(overrides))
        deadline = deadline_s if deadline_s is not None else sc.slo.e2e_s
        if deadline is None:
            raise ConfigError(f"{path}: no deadline: give --deadline or set slo.e2e_s in the scenario")
        s = run_scenario(path, list(overrides)).summary
        mem = s["kv_need_bytes"] / s["kv_budget_bytes"]
        done = s["completed"] == s["requests"]
        late = s["makespan_s"] / deadline if done else float("inf")
        on_time = late <= 1
        rows.append({"scenario": s["scenario"], "file": str(path), "kv_need_bytes": s["kv_need_bytes"],
                     "kv_budget_bytes": s["kv_budget_bytes"], "memory_ratio": mem, "makespan_s": s["makespan_s"],
                     "deadline_s": deadline, "deadline_ratio": late, "memory_fit": s["memory_fit"],
                     "on_time": on_time, "feasible": bool(s["memory_fit"] and on_time),
                     "quadrant": quadrant(mem, late), "good": s["good"], "requests": s["requests"],
                     "gpu_seconds_per_good": s["gpu_seconds_per_good"], "energy_j_per_good": s["energy_j_per_good"]})
    return rows


def run_plane(paths: Iterable[str | Path], out_dir: str | Path, overrides: Iterable[str] = (),
              deadline_s: float | None = None, plots: bool = True) -> tuple[list[dict], list[Path]]:
    """`capsim plan-plane`: simulate each scenario, place it on the plane, write plane.csv and the figure."""
    import pandas as pd
    rows = plane_rows(paths, overrides, deadline_s)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = write_tables(pd.DataFrame(rows), out, "plane")
    if plots:
        pts = [{"label": r["scenario"], "memory_ratio": r["memory_ratio"], "deadline_ratio": r["deadline_ratio"],
                "feasible": r["feasible"]} for r in rows]
        files.append(plot_plane(pts, out / "memory_deadline_plane.png", y_label="makespan / deadline"))
    return rows, files


def print_plane(rows: list[dict], file=None) -> None:
    """The plane's rows as a text table on `file` (stdout by default)."""
    file = file or sys.stdout
    print(f"{'scenario':<22}{'KV need':>12}{'budget':>12}{'need/budget':>12}{'makespan':>10}{'deadline':>9}"
          f"{'/deadline':>10}  {'quadrant':<24}", file=file)
    for r in rows:
        print(f"{r['scenario']:<22}{r['kv_need_bytes'] / 2**20:>8.0f} MiB{r['kv_budget_bytes'] / 2**20:>8.0f} MiB"
              f"{r['memory_ratio']:>12.3f}{r['makespan_s']:>9.2f}s{r['deadline_s']:>8.2f}s{r['deadline_ratio']:>10.3f}"
              f"  {r['quadrant']:<24}", file=file)
