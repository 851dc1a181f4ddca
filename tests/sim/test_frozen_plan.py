"""A StepPlan is read only once its scheduler hands it out (issue [architecture])."""

from __future__ import annotations

import dataclasses

import pytest

from sim.core.kv import BlockManager
from sim.core.request import Request
from sim.core.schedulers.fixed import FixedBatching, FixedConfig
from sim.core.step import FrozenStepPlan


def _plan():
    sched = FixedBatching(FixedConfig(max_num_seqs=4), BlockManager(100, 16, 1.0), "reserve", None)
    sched.admit(Request(0, 0.0, 100, 10, 0.0), 0.0)
    return sched.plan(0.0)


def test_the_scheduler_hands_out_a_frozen_plan():
    plan = _plan()
    assert isinstance(plan, FrozenStepPlan) and plan.new_tokens == 100
    with pytest.raises(AttributeError, match="frozen"):
        plan.new_tokens = 1
    assert isinstance(plan.items, tuple) and isinstance(plan.adapters, frozenset)


def test_replacing_fields_gives_another_frozen_plan():
    plan = _plan()
    padded = dataclasses.replace(plan, new_tokens=128)
    assert isinstance(padded, FrozenStepPlan) and padded.new_tokens == 128 and plan.new_tokens == 100
