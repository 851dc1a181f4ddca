"""While a run simulates the cyclic collector runs rarely (sim.core.simulation.fewer_collections); the process's
own settings come back afterwards (also when the run fails, when runs nest or overlap in threads), a process's own
choice to collect rarely or never is kept, and runs one after another do not pile up what they leave behind."""

import gc
import threading
import weakref

import pytest

from sim.core.engine import ModelledExecutor
from sim.core.metrics import Timeline
from sim.core.simulation import GC_YOUNG_THRESHOLD, Simulation, fewer_collections
from tests.sim.helpers import scenario

SMALL = {"kind": "synthetic", "num_requests": 30, "arrival": {"kind": "poisson", "rate_rps": 5.0},
         "prompt_tokens": {"kind": "fixed", "value": 200}, "output_tokens": {"kind": "fixed", "value": 20}}


class Watching(ModelledExecutor):
    """The modelled executor, noting the collector's young threshold at every iteration (and failing from
    `fail_at` seconds on)."""

    def __init__(self, step_time, fail_at=None):
        super().__init__(step_time)
        self.seen, self.fail_at = set(), fail_at

    def execute(self, plan, start_s):
        self.seen.add(gc.get_threshold()[0])
        if self.fail_at is not None and start_s >= self.fail_at:
            raise RuntimeError("a failing step")
        return super().execute(plan, start_s)


def _watched_run(**kw) -> set:
    sim = Simulation(scenario(workload=SMALL), ".")
    ex = Watching(sim.step_time, **kw)
    sim.run(executor=ex)
    return ex.seen


@pytest.fixture
def threshold():
    """The test's process settings, restored whatever the test does."""
    before = gc.get_threshold()
    yield before
    gc.set_threshold(*before)


def test_a_run_collects_rarely_and_restores_the_settings(threshold):
    assert _watched_run() == {GC_YOUNG_THRESHOLD}
    assert gc.get_threshold() == threshold
    assert gc.get_freeze_count() == 0  # nothing is frozen


def test_a_failing_run_restores_the_settings_too(threshold):
    with pytest.raises(RuntimeError, match="a failing step"):
        _watched_run(fail_at=1.0)
    assert gc.get_threshold() == threshold


def test_a_process_that_collects_rarely_or_never_keeps_its_choice(threshold):
    gc.set_threshold(0)  # automatic collection off
    assert _watched_run() == {0}
    assert gc.get_threshold()[0] == 0
    gc.set_threshold(10 * GC_YOUNG_THRESHOLD, 5, 5)
    assert _watched_run() == {10 * GC_YOUNG_THRESHOLD}
    assert gc.get_threshold() == (10 * GC_YOUNG_THRESHOLD, 5, 5)


def test_nested_runs_restore_the_settings_when_the_outer_one_ends(threshold):
    with fewer_collections():
        assert _watched_run() == {GC_YOUNG_THRESHOLD}
        assert gc.get_threshold()[0] == GC_YOUNG_THRESHOLD  # still inside the outer one
    assert gc.get_threshold() == threshold


def test_overlapping_runs_in_threads_restore_the_settings_when_the_last_one_ends(threshold):
    inside, leave = threading.Event(), threading.Event()

    def long_run():
        with fewer_collections():
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=long_run)
    t.start()
    inside.wait(10)
    assert _watched_run() == {GC_YOUNG_THRESHOLD}  # starts after the thread's run, ends before it
    assert gc.get_threshold()[0] == GC_YOUNG_THRESHOLD  # the thread's run goes on
    leave.set()
    t.join(10)
    assert gc.get_threshold() == threshold


LONGER = {**SMALL, "num_requests": 2000, "arrival": {"kind": "poisson", "rate_rps": 20.0}}


def test_runs_one_after_another_do_not_pile_up_what_they_leave(threshold):
    # a run's replicas, timelines and recorder hold one another in cycles; a run long enough that they reach the
    # oldest generation while it lasts would leave them to a full collection, rare while runs follow each other
    def timelines() -> int:
        return sum(1 for o in gc.get_objects() if type(o) is Timeline)

    gc.collect()
    before = timelines()  # other tests' results may still hold theirs
    alive = []
    for _ in range(8):
        Simulation(scenario(workload=LONGER), ".").run()  # the result dropped at once
        alive.append(timelines() - before)
    assert max(alive) <= 3, alive


def test_a_dropped_result_takes_its_run_with_it_without_the_collector():
    # (sim.core.simulation.unlink_finished: the replicas' waiting loops end, the timelines let go of the recorder;
    # runs with faults or closed-loop users keep other processes in cycles, left to the collector)
    sim = Simulation(scenario(workload=SMALL), ".")
    res = sim.run()
    timelines = [weakref.ref(t) for t in res._iterations.timelines]
    gc.disable()
    try:
        del res, sim
        assert [t() for t in timelines] == [None] * len(timelines)  # freed by reference counting alone
    finally:
        gc.enable()
