"""Byte-identity: every shipped scenario's outputs and the figures' data hash to the recorded goldens.

The digests in tests/golden/outputs.json were recorded on 507ae7a, before the package layout moved
(issue [architecture]); a change meant to alter outputs re-records them in its own commit
(`python -m tests.golden.outputs --write`) and says why.
"""

from __future__ import annotations

import json

import pytest

from tests.golden import outputs

GOLDEN = json.loads(outputs.GOLDEN.read_text())


def test_every_shipped_scenario_has_a_golden():
    shipped = {str(p.relative_to(outputs.REPO)) for p in outputs.shipped_scenarios()}
    assert shipped == set(GOLDEN["scenarios"]), "record goldens for new scenarios: python -m tests.golden.outputs --write"


@pytest.mark.parametrize("scenario", sorted(GOLDEN["scenarios"]))
def test_scenario_outputs_are_byte_identical(scenario):
    got = outputs.scenario_digests(outputs.REPO / scenario)
    assert got == GOLDEN["scenarios"][scenario]


@pytest.mark.slow
def test_figure_data_is_byte_identical():
    from sim.figures import FIGURES, mooncake_trace
    got = outputs.figure_digests()
    want = dict(GOLDEN["figures"])
    if mooncake_trace() is None:   # the public data folder is not beside this checkout: that figure is skipped
        for name, spec in FIGURES.items():
            if spec.needs_shared_data:
                want = {k: v for k, v in want.items() if not k.startswith(name)}
    assert got == want
