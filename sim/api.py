"""The public API: load a scenario, run it, get a Result (summary dict + per-request/iteration tables)."""

from __future__ import annotations

from pathlib import Path

from sim.config import Scenario, load_scenario
from sim.simulation import Result, Simulation


def run_scenario(path: str | Path, overrides: list[str] | None = None, progress=None) -> Result:
    """Load `path` (with `--set`-style overrides) and simulate it."""
    scenario, base = load_scenario(path, overrides)
    return Simulation(scenario, base, progress=progress).run()


def run(scenario: Scenario, base_dir: str | Path = ".", progress=None) -> Result:
    return Simulation(scenario, base_dir, progress=progress).run()


# The what-if figures of the notebooks (notebooks/*.ipynb, `capsim figures`): data as DataFrames, plots as
# matplotlib Figures. sim.figures imports numpy, pandas and matplotlib only where a function uses them.
from sim import figures  # noqa: E402
from sim.figures import *  # noqa: E402,F401,F403

__all__ = ["Scenario", "Result", "Simulation", "load_scenario", "run_scenario", "run", "figures",
           *figures.__all__]
