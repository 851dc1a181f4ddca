"""Warnings and notes on stderr, said once.

A model says each of its extrapolations and fallbacks once, the first time it happens (docs/scenarios.md). A sweep
or a plan builds a fresh model for every run of the same scenario, hundreds in one process (or in each Dask worker);
inside `once_per_process(scenario)` each such line is said by that scenario's first run in the process only, keyed
by what it is about (not its numbers, which differ run to run).
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

_scope: str | None = None            # the scenario whose runs are under way, inside once_per_process
_said: set[tuple[str, str]] = set()  # (scenario, key) already said in this process
_said_ever: set = set()              # say_once's keys


def say(key: str, text: str, stream=None) -> None:
    """Print `text` on `stream` (stderr by default), unless a run of the same sweep's or plan's scenario already
    said `key` in this process."""
    if _scope is not None:
        if (_scope, key) in _said:
            return
        _said.add((_scope, key))
    print(text, file=stream or sys.stderr)


@contextmanager
def once_per_process(scenario: str):
    """Runs of `scenario` (a sweep's or a plan's) within it say each key once in this process, not once per run."""
    global _scope
    outer = _scope
    _scope = scenario
    try:
        yield
    finally:
        _scope = outer


def say_once(key, text: str, stream=None) -> None:
    """Print `text` the first time `key` comes in this process, whatever runs (a note about a model's setup)."""
    if key not in _said_ever:
        _said_ever.add(key)
        print(text, file=stream or sys.stderr)
