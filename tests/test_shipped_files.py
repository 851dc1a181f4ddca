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


DOCS = REPO / "docs"


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    nxt = text.find("\n## ", start + len(heading))
    return text[start:] if nxt < 0 else text[start:nxt]


def test_documented_scenario_validates(tmp_path, capsys):
    """docs/scenarios.md's full scenario (its first YAML block, every field with its default or an example) is a
    scenario the schema accepts: the reference of the format cannot drift from it unnoticed."""
    import re
    block = re.findall(r"```yaml\n(.*?)```", (DOCS / "scenarios.md").read_text(), re.S)[0]
    p = tmp_path / "documented.yaml"
    p.write_text(block)
    assert main(["validate-scenario", str(p)]) == 0, capsys.readouterr().err


def test_documented_columns_are_the_written_ones():
    """Every column requests.csv and iterations.csv have is defined in docs/metrics.md (and no other)."""
    import re
    from sim.core.metrics import ITERATION_COLUMNS, REQUEST_COLUMNS
    text = (DOCS / "metrics.md").read_text()
    per_request = _section(text, "## Per request")
    named = {n for row in per_request.splitlines() if row.startswith("| `")
             for n in re.findall(r"`([a-z0-9_]+)`", row.split("|")[1])}
    assert named == set(REQUEST_COLUMNS)
    per_iteration = _section(text, "## Per iteration")
    assert {c for c in ITERATION_COLUMNS if f"`{c}`" not in per_iteration} == set()
