"""Shared pieces of the what-if figures: paths, the chapter's inputs, scenario runs and axes helpers."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # numpy, pandas and the simulator are imported where used: `capsim --help` stays fast
    from sim.core.simulation import Result

REPO = Path(__file__).resolve().parents[2]
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
    from sim.io.config import load_scenario
    from sim.core.simulation import Simulation
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
