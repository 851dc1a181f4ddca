"""A request's largest decode gap is found in batches (Timeline.resolve_gaps) and its row written after
(Recorder._flush): the outputs are those of finding it at once, whatever the batch sizes."""

import random
from array import array

import pytest

import sim.core.metrics as metrics
from sim.core.engine import ModelledExecutor
from sim.core.metrics import Recorder, Timeline
from sim.core.request import Request
from sim.core.simulation import Simulation
from sim.io.config import SLOConfig
from tests.sim.test_fast_forward import CASES, light_scenario

DEFERRED_CASES = dict(CASES)
DEFERRED_CASES["max-itl-slo"] = {"slo": {"ttft_s": 1.0, "itl_s": 0.05, "itl_stat": "max"}}
DEFERRED_CASES["preempting"] = {"kv": {"block_tokens": 16, "format": "bf16", "budget": "300MiB",
                                       "admission": "on_demand"},
                                "scheduler": {"kind": "continuous", "max_num_seqs": 64,
                                              "max_num_batched_tokens": 8192}}


def _digest(sc) -> tuple:
    sim = Simulation(sc, ".")
    res = sim.run(executor=ModelledExecutor(sim.step_time))
    return res.summary, res.digest()


@pytest.mark.parametrize("case", list(DEFERRED_CASES))
def test_batch_sizes_change_no_byte(case, monkeypatch):
    sc = light_scenario(DEFERRED_CASES[case])
    at_the_end = _digest(sc)  # (a few hundred requests: everything waits for the end of the run)
    monkeypatch.setattr(metrics, "PENDING_ROWS", 1)
    monkeypatch.setattr(metrics, "PENDING_SPANS", 1)
    at_once = _digest(sc)     # each span resolved as it is recorded, each row written as its request leaves
    monkeypatch.setattr(metrics, "PENDING_ROWS", 7)
    monkeypatch.setattr(metrics, "PENDING_SPANS", 5)
    in_batches = _digest(sc)
    assert at_the_end == at_once == in_batches


def test_the_preempting_case_preempts():
    """(So the case above covers requests with several decode-set spans.)"""
    res = Simulation(light_scenario(DEFERRED_CASES["preempting"]), ".").run()
    assert res.summary["preemptions"] > 0


def test_resolve_gaps_is_the_largest_duration_of_each_span():
    rng = random.Random(3)
    tl = Timeline(Recorder(SLOConfig(), track_request_gaps=False))
    durations = [rng.choice([0.01, 0.02, 0.015]) * rng.random() for _ in range(500)]
    tl.durations = array("d", durations)
    reqs = [Request(i, 0.0, 10, 10, 0.0) for i in range(60)]
    want = {}
    for req in reqs:
        for _ in range(rng.randint(1, 3)):  # several spans per request, overlapping others, in any order
            first = rng.randrange(500)
            last = rng.choice([first, min(499, first + rng.randint(0, 80)), 499])
            tl.decode_gaps(req, first, last)
            want[req.rid] = max(want.get(req.rid, 0.0), max(durations[first:last + 1]))
    reqs[0].max_itl_s = 1.0  # an explicit gap larger than any span's stays
    want[0] = 1.0
    tl.resolve_gaps()
    assert {r.rid: r.max_itl_s for r in reqs} == want
    tl.resolve_gaps()  # nothing pending: nothing changes
    assert {r.rid: r.max_itl_s for r in reqs} == want
