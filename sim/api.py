"""The public API: load a scenario, run it, get a Result; and the names other packages may use.

Everything outside `sim` (the calibration harness, the command line, notebooks, benchmarks) reaches the
simulator through this module. Names are resolved lazily (PEP 562), so `from sim.api import ModelSpec`
imports the model arithmetic only, never SimPy or the engine: `capsim calibrate` stays light.

The figures of the notebooks are not here: they live in :mod:`sim.figures` (one module per notebook).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.core.simulation import Result
    from sim.io.config import Scenario

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    # running scenarios
    "Scenario": "sim.io.config", "StepTimeConfig": "sim.io.config", "load_scenario": "sim.io.config",
    "Simulation": "sim.core.simulation", "Result": "sim.core.simulation",
    "resolve_profile_path": "sim.core.step_time_builder", "build_step_time": "sim.core.step_time_builder",
    # the engine's parts, for drivers other than SimPy's clock (calibration's real replay)
    "Request": "sim.core.request", "Status": "sim.core.request", "StepPlan": "sim.core.step",
    "Recorder": "sim.core.metrics", "Speculator": "sim.core.schedulers.speculation",
    "NgramDraft": "sim.core.schedulers.speculation", "prefix_stream": "sim.workloads.workload",
    "ModelledExecutor": "sim.core.engine", "StepExecutor": "sim.core.engine",
    # inputs: errors, schema helpers, profiles
    "ConfigError": "sim.io.errors", "validate_mapping": "sim.io.schema", "dump_yaml": "sim.io.schema",
    "check_out_file": "sim.io.outputs",
    "check_out_dir": "sim.io.outputs", "staged_output": "sim.io.outputs",
    "profiles_dir": "sim.io.profiles", "known_names": "sim.io.profiles", "load_hardware": "sim.io.profiles",
    "load_model": "sim.io.profiles", "load_fitted": "sim.io.profiles", "HardwareProfile": "sim.io.profiles",
    "ModelProfile": "sim.io.profiles", "FittedProfile": "sim.io.profiles", "LinearStepTime": "sim.io.profiles",
    "EfficiencyStepTime": "sim.io.profiles", "TablePoint": "sim.io.profiles", "MFUPoint": "sim.io.profiles",
    "PrefillOverride": "sim.io.profiles", "ValidRange": "sim.io.profiles", "FitSummary": "sim.io.profiles",
    "Provenance": "sim.io.profiles", "ShapeCache": "sim.io.profiles",
    # model arithmetic and step-time models
    "ModelSpec": "sim.models.spec", "causal_pairs": "sim.models.roofline", "forward_flops": "sim.models.roofline",
    "sequence_flops": "sim.models.roofline", "iteration_bytes": "sim.models.roofline", "mfu": "sim.models.roofline",
    "mbu": "sim.models.roofline", "LinearModel": "sim.models.step_time", "EfficiencyModel": "sim.models.step_time",
    "RangeChecked": "sim.models.step_time", "ExtrapolationError": "sim.models.step_time",
}

__all__ = ["run_scenario", "run", *_EXPORTS]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sim.api' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


def run_scenario(path: str | Path, overrides: list[str] | None = None, progress=None) -> Result:
    """Load `path` (with `--set`-style overrides) and simulate it."""
    from sim.core.simulation import Simulation
    from sim.io.config import load_scenario
    from sim.io.errors import ConfigError
    scenario, base = load_scenario(path, overrides)
    try:
        return Simulation(scenario, base, progress=progress).run()
    except ConfigError as exc:  # raised deep inside (`kv.budget: ...`): name the scenario file
        raise exc.in_file(path) from None


def run(scenario: Scenario, base_dir: str | Path = ".", progress=None) -> Result:
    """Simulate an already validated scenario whose relative paths resolve against `base_dir`."""
    from sim.core.simulation import Simulation
    return Simulation(scenario, base_dir, progress=progress).run()
