"""A lone engine loop releasing the arrivals itself (engine.ArrivalFeed) changes no output byte.

Each case runs with the feed and with `arrivals` as its own SimPy process (Simulation(arrival_feed=False)) and
compares summaries and digests. The tie cases make arrivals land exactly on iteration ends (step times and arrival
times in sixteenths of a second, exact in floats), where SimPy's order of same-time events decides which iteration
a request joins; two wrong tie rules are shown to change the outputs, so the cases do test the order.
"""

import numpy as np
import pytest

from sim.core import engine
from sim.core.engine import ArrivalFeed, ModelledExecutor
from sim.core.simulation import Simulation
from tests.sim.helpers import scenario

QUARTERS = {"kind": "linear", "constant_s": 0.25, "per_new_token_s": 0.0, "per_pair_s": 0.0, "per_kv_token_s": 0.0}
SIXTEENTHS = {**QUARTERS, "per_new_token_s": 0.0625}


def _ties(n: int, seed: int, gaps=(0, 1, 1, 2, 3), grid_s: float = 0.25) -> dict:
    """n requests arriving on a grid of `grid_s` (gaps of `gaps` grid steps, 0: at the same instant), short
    prompts and outputs: with iterations of whole grid steps, arrival times meet iteration ends exactly."""
    rng = np.random.default_rng(seed)
    ticks = np.cumsum(rng.choice(gaps, n))
    return {"kind": "requests", "requests": [
        {"arrival_s": float(t) * grid_s, "prompt_tokens": int(rng.integers(1, 6)),
         "output_tokens": int(rng.integers(2, 9))} for t in ticks]}


TIES = {"workload": _ties(160, 1, gaps=(0, 1, 2, 3, 4, 4, 5, 8), grid_s=0.0625), "step_time": {"model": QUARTERS}}
CASES = {
    "poisson": {},
    "chunked": {"scheduler": {"kind": "chunked", "max_num_seqs": 16, "max_num_batched_tokens": 512,
                              "chunk_tokens": 128}},
    "fixed": {"scheduler": {"kind": "fixed", "max_num_seqs": 8}},
    "vllm-v1-on-demand": {"scheduler": {"kind": "vllm_v1", "max_num_seqs": 16, "max_num_batched_tokens": 1024},
                          "kv": {"block_tokens": 16, "format": "bf16", "budget": "300MiB", "admission": "on_demand"}},
    "async-scheduling": {"scheduler": {"kind": "continuous", "max_num_seqs": 32, "max_num_batched_tokens": 8192,
                                       "async_scheduling": True}},
    "frontend-latency": {"cluster": {"frontend_latency_s": 0.013}},
    "speculative": {"scheduler": {"kind": "continuous", "max_num_seqs": 32, "max_num_batched_tokens": 8192,
                                  "speculative": {"draft": {"kind": "ngram"}, "num_draft_tokens": 3,
                                                  "acceptance": {"kind": "constant", "a": 0.7}}}},
    "retries-and-late-rejection": {"accuracy": {"p_correct": 0.7, "max_retries": 2},
                                   "admission_control": {"reject_late": True}, "slo": {"e2e_s": 4.0}},
    "ties": TIES,
    "ties-chunked": {**TIES, "scheduler": {"kind": "chunked", "max_num_seqs": 4, "max_num_batched_tokens": 8,
                                           "chunk_tokens": 4}},
    "ties-async": {**TIES, "scheduler": {"kind": "continuous", "max_num_seqs": 6, "max_num_batched_tokens": 64,
                                         "async_scheduling": True}},
    "ties-sixteenths": {"workload": _ties(150, 2, gaps=(0, 1, 2, 3, 5, 6), grid_s=0.0625),
                        "step_time": {"model": SIXTEENTHS}},
}


def _run(sc, feed: bool, executor=None):
    sim = Simulation(sc, ".", arrival_feed=feed)
    res = sim.run(executor=executor(sim.step_time) if executor else None)
    return res.summary, res.digest()


def _released(monkeypatch) -> list:
    """Count the groups the feed releases (to see it was used)."""
    calls = []
    release = ArrivalFeed.release

    def counted(self):
        calls.append(self.next_fire)
        release(self)
    monkeypatch.setattr(ArrivalFeed, "release", counted)
    return calls


@pytest.mark.parametrize("case", list(CASES))
def test_the_feed_gives_the_same_outputs_as_the_arrivals_process(case, monkeypatch):
    sc = scenario(**CASES[case])
    calls = _released(monkeypatch)
    fed = _run(sc, True)
    assert calls, "the feed was not used"
    calls.clear()
    processed = _run(sc, False)
    assert not calls
    assert fed[0] == processed[0]
    assert fed[1] == processed[1]


def test_the_tie_cases_meet_iteration_ends_and_a_wrong_tie_rule_shows():
    """The tie workload puts arrivals exactly on iteration ends, both ways round (the group scheduled before the
    iteration and after it), and releasing every tied group before the iteration's end (or every one after it)
    gives other outputs than SimPy's order, which the feed keeps."""
    sc = scenario(**TIES)
    ties = {"before": 0, "after": 0}
    release_until = ArrivalFeed.release_until

    def seen(self, end_s, seq):
        release_until(self, end_s, seq)
        if self.next_fire == end_s:  # left for after the loop resumes: scheduled after the iteration
            ties["after"] += 1

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ArrivalFeed, "release_until", seen)
        fed = _run(sc, True)

    def counted(self, end_s, seq):
        while self.next_fire < end_s or (self.next_fire == end_s and self.next_seq < seq):
            ties["before"] += self.next_fire == end_s
            self.release()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ArrivalFeed, "release_until", counted)
        assert _run(sc, True) == fed
    assert ties["before"] >= 5 and ties["after"] >= 5, ties
    truth = _run(sc, False)[1]
    assert fed[1] == truth

    def first(self, end_s, seq):
        while self.next_fire <= end_s:
            self.release()

    def last(self, end_s, seq):
        while self.next_fire < end_s:
            self.release()

    for wrong in (first, last):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ArrivalFeed, "release_until", wrong)
            assert _run(sc, True)[1] != truth, wrong.__name__


def test_the_feed_is_not_used_where_other_processes_run(monkeypatch):
    """Two replicas, closed-loop users, cancellations, faults and any executor but the model's own keep `arrivals` as a
    process (the feed assumes nothing else is scheduled)."""
    calls = _released(monkeypatch)

    class Replay(ModelledExecutor):  # an executor that lines up a clock of its own when the loop wakes
        def begin(self, now_s):
            pass

    class Watching(ModelledExecutor):  # one that only looks at the plans (it could schedule events of its own)
        def execute(self, plan, start_s):
            return super().execute(plan, start_s)

    others = [
        scenario(cluster={"replicas": 2}),
        scenario(workload={"kind": "closed_loop", "users": 4, "num_requests": 40, "think_time_s": 0.5,
                           "prompt_tokens": {"kind": "fixed", "value": 300},
                           "output_tokens": {"kind": "fixed", "value": 30}}),
        scenario(workload={"kind": "requests", "requests": [
            {"arrival_s": 0.1 * i, "prompt_tokens": 200, "output_tokens": 40,
             **({"cancel_at_s": 0.1 * i + 0.3} if i == 3 else {})} for i in range(10)]}),
        scenario(cluster={"replicas": 1, "faults": [{"replica": 0, "start_s": 5.0, "end_s": 6.0}]}),
    ]
    for sc in others:
        _run(sc, True)
    _run(scenario(), True, executor=Replay)
    _run(scenario(), True, executor=Watching)
    assert not calls
    assert engine.arrivals  # (the process they keep)
