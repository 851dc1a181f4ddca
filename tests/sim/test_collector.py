"""While a run simulates the cyclic collector runs rarely (sim.core.simulation.fewer_collections); the process's
own settings come back afterwards, also when the run fails."""

import gc

import pytest

from sim.core.engine import ModelledExecutor
from sim.core.simulation import GC_YOUNG_THRESHOLD, Simulation
from tests.sim.helpers import scenario

SMALL = {"kind": "synthetic", "num_requests": 30, "arrival": {"kind": "poisson", "rate_rps": 5.0},
         "prompt_tokens": {"kind": "fixed", "value": 200}, "output_tokens": {"kind": "fixed", "value": 20}}


class Watching(ModelledExecutor):
    """The modelled executor, noting the collector's settings at every iteration (and failing at `fail_at`)."""

    def __init__(self, step_time, fail_at=None):
        super().__init__(step_time)
        self.seen, self.fail_at = set(), fail_at

    def execute(self, plan, start_s):
        self.seen.add((gc.get_threshold()[0], gc.get_freeze_count() > 0))
        if self.fail_at is not None and len(self.seen) and start_s >= self.fail_at:
            raise RuntimeError("a failing step")
        return super().execute(plan, start_s)


def test_a_run_collects_rarely_and_restores_the_settings():
    before = gc.get_threshold()
    sim = Simulation(scenario(workload=SMALL), ".")
    ex = Watching(sim.step_time)
    sim.run(executor=ex)
    assert ex.seen == {(GC_YOUNG_THRESHOLD, True)}
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_a_failing_run_restores_the_settings_too():
    before = gc.get_threshold()
    sim = Simulation(scenario(workload=SMALL), ".")
    with pytest.raises(RuntimeError, match="a failing step"):
        sim.run(executor=Watching(sim.step_time, fail_at=1.0))
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_objects_the_process_froze_stay_frozen():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        sim = Simulation(scenario(workload=SMALL), ".")
        ex = Watching(sim.step_time)
        sim.run(executor=ex)
        assert {t for t, _ in ex.seen} == {GC_YOUNG_THRESHOLD}
        assert gc.get_freeze_count() > frozen // 2  # still frozen (a few may have been freed since)
    finally:
        gc.unfreeze()


def test_nested_runs_restore_the_settings_when_the_outer_one_ends():
    from sim.core.simulation import fewer_collections
    before = gc.get_threshold()
    with fewer_collections():
        sim = Simulation(scenario(workload=SMALL), ".")
        sim.run()
        assert gc.get_threshold()[0] == GC_YOUNG_THRESHOLD  # still inside the outer one
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
