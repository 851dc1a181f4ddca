"""Warnings a calibration or validation run gives about its own trustworthiness: a loaded machine
(noisy wall-clock times) and a huge held-out error, each with what to do about it. No torch here."""

from __future__ import annotations

import os

HELDOUT_WARN = 0.25
"""A held-out error above this (25%) is no fit of the device but of the noise around it."""


def loaded_machine_warning(device: str, clock: str) -> str | None:
    """A warning line when other processes load the CPU (load average > half the cores) on a CPU run:
    wall-clock times are then noisy, and `--clock thread --threads 1` times the work itself."""
    try:
        load = os.getloadavg()
    except (AttributeError, OSError):
        return None
    if device != "cpu" or load[0] <= 0.5 * (os.cpu_count() or 1):
        return None
    advice = ("times will be noisy; --clock thread --threads 1 times the torch thread's own CPU time instead"
              if clock == "wall" else "the thread clock counts only this run's CPU time, but caches are shared")
    return (f"warning: load average {' '.join(f'{x:.2f}' for x in load)} on {os.cpu_count()} cores: other "
            f"processes are using the CPU; {advice}")


def heldout_warning(mape: float | None, clock: str) -> str | None:
    """A warning line when the fit's held-out error is huge (noisy timings), with what to do about it."""
    if mape is None or mape <= HELDOUT_WARN:
        return None
    hint = ("rerun with --clock thread --threads 1 on a shared CPU, or on an idle machine" if clock == "wall"
            else "rerun on an idle machine, with more --repeats")
    return (f"warning: held-out error {mape:.1%} (> {HELDOUT_WARN:.0%}): the timings are too noisy for this profile "
            f"to predict anything; {hint}")
