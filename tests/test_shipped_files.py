"""Every shipped scenario validates and runs; every profile loads (a YAML no test loads rots)."""

from pathlib import Path

import pytest

from sim.api import run_scenario
from capsim.cli import main

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = sorted((REPO / "scenarios").rglob("*.yaml"))


def test_there_are_scenarios():
    assert len(SCENARIOS) >= 5


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: str(p.relative_to(REPO / "scenarios")))
def test_shipped_scenario_runs(path):
    res = run_scenario(path)
    s = res.summary
    assert s["requests"] == len(res.requests) > 0
    assert s["completed"] + s["rejected"] + s["cancelled"] == s["requests"]


def test_validate_all_shipped(capsys):
    assert main(["validate-scenario", *map(str, SCENARIOS)]) == 0
