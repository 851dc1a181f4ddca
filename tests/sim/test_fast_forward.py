"""Fast-forwarding steady decode stretches changes no output byte, and the KV pool costs nothing up front."""

import time

import pytest

from sim.core.engine import ModelledExecutor
from sim.core.kv import BlockManager
from sim.core.request import Request
from sim.core.simulation import Simulation
from tests.sim.helpers import scenario

SLOW_PREFILL = {"kind": "linear", "constant_s": 0.01, "per_new_token_s": 2e-5, "per_pair_s": 0.0,
                "per_kv_token_s": 3e-8}
LIGHT = {"kind": "synthetic", "num_requests": 200, "arrival": {"kind": "poisson", "rate_rps": 2.0},
         "prompt_tokens": {"kind": "lognormal", "median": 400, "sigma": 0.7, "max": 3000},
         "output_tokens": {"kind": "lognormal", "median": 120, "sigma": 0.7, "max": 600}}
CASES = {
    "continuous": {},
    "chunked": {"scheduler": {"kind": "chunked", "max_num_seqs": 32, "max_num_batched_tokens": 1024,
                              "chunk_tokens": 256}},
    "fixed": {"scheduler": {"kind": "fixed", "max_num_seqs": 8}},
    "on-demand": {"kv": {"block_tokens": 16, "format": "bf16", "budget": "900MiB", "admission": "on_demand"}},
    "two-replicas-fault": {"cluster": {"replicas": 2, "router": {"kind": "round_robin"},
                                       "faults": [{"replica": 0, "start_s": 20.0, "end_s": 35.0}]}},
    "p99-itl-slo-cancel": {"slo": {"ttft_s": 1.0, "itl_s": 0.05, "itl_stat": "p99"},
                           "workload": {"kind": "requests", "requests": [
                               {"arrival_s": 0.4 * i, "prompt_tokens": 300 + 37 * i, "output_tokens": 60 + 7 * i,
                                **({"cancel_at_s": 0.4 * i + 1.5} if i % 3 == 0 else {})} for i in range(40)]}},
    "closed-loop": {"workload": {"kind": "closed_loop", "users": 6, "num_requests": 120, "think_time_s": 0.5,
                                 "think_distribution": "exponential",
                                 "prompt_tokens": {"kind": "fixed", "value": 700},
                                 "output_tokens": {"kind": "fixed", "value": 90}}},
}


def _digest(sc, fast_forward: bool):
    sim = Simulation(sc, ".")
    res = sim.run(executor=ModelledExecutor(sim.step_time, fast_forward=fast_forward))
    return res.summary, res.digest()


def light_scenario(overrides: dict):
    """A case's scenario: its overrides on the light workload and the slow-prefill step time unless it sets its own."""
    return scenario(**{"workload": LIGHT, "step_time": {"model": SLOW_PREFILL}, **overrides})


@pytest.mark.parametrize("case", list(CASES))
def test_fast_forward_is_byte_identical(case):
    sc = light_scenario(CASES[case])
    skipped, stepped = _digest(sc, True), _digest(sc, False)
    assert skipped[0] == stepped[0]
    assert skipped[1] == stepped[1]


def test_a_step_after_a_stretch_ends_exactly_where_stepping_ends_it():
    """After a fast-forwarded stretch the next step ends at start + step, which no float delay from the
    clock (still at the stretch's start) may reach exactly: a timeout then lands one unit in the last
    place off, as it did before the clock was passed without an event. Passed directly, it lands on
    start + step, where stepping every iteration lands (these arrival times hit the case; found in
    review: at aa22e40 the fast-forwarded runs of k = 0-2, 8-12 and 17-19 differed from the stepped ones)."""
    fit = {"kind": "linear", "constant_s": 0.02622, "per_new_token_s": 30.4e-6, "per_pair_s": 3.0e-9}
    for k in range(20):
        sc = scenario(model="qwen3-8b", hardware="rtx-pro-6000-bw-ws", step_time={"model": fit},
                      workload={"kind": "requests", "requests": [
                          {"arrival_s": 1.0 + k * 0.0137, "prompt_tokens": 100, "output_tokens": 90}]})
        assert _digest(sc, True)[1] == _digest(sc, False)[1], k


def test_fast_forward_skips_most_events_of_a_light_load():
    """The point of it: a light load is mostly steady decoding, so most iterations need no event."""
    sc = scenario(workload=LIGHT, step_time={"model": SLOW_PREFILL})
    sim = Simulation(sc, ".")
    calls = {"n": 0}

    class Counting(ModelledExecutor):
        def execute(self, plan, start_s):
            calls["n"] += 1
            return super().execute(plan, start_s)

    res = sim.run(executor=Counting(sim.step_time))
    assert calls["n"] < 0.5 * res.summary["iterations"]


def test_a_huge_kv_pool_costs_nothing_up_front():
    t = time.process_time()
    kv = BlockManager(10 ** 24, 16, 1.0)
    req = Request(0, 0.0, 100, 10, 0.0)
    assert kv.can_allocate(req, 109)
    kv.allocate(req, 109)
    assert req.block_table == list(range(7)) and kv.free_blocks == 10 ** 24 - 7
    kv.free(req)
    assert kv.free_blocks == 10 ** 24 and kv.free_list == [6, 5, 4, 3, 2, 1, 0]
    assert time.process_time() - t < 1.0


def test_output_rows_spilled_to_disk_are_read_back_in_order(monkeypatch):
    """The recorder and the timelines move their rows to temporary files during a run; a run that
    spills every few rows writes exactly what a run that keeps them in memory writes."""
    import sim.core.metrics as metrics
    sc = scenario(workload=LIGHT, step_time={"model": SLOW_PREFILL})
    kept = _digest(sc, True)
    monkeypatch.setattr(metrics, "SPILL_VALUES", 97)
    assert _digest(sc, True) == kept


def test_a_step_turning_negative_mid_stretch_is_refused_as_stepping_refuses_it():
    """A fitted linear model with a negative coefficient can go below zero far from its fit: the fast-forwarded
    stretch stops before that iteration and the model's own error (same message, same counters) follows."""
    from sim.io.errors import ConfigError
    sc = scenario(step_time={"model": {"kind": "linear", "constant_s": 0.01, "per_new_token_s": 0.0,
                                       "per_pair_s": 0.0, "per_kv_token_s": -2e-5}},
                  workload={"kind": "requests", "requests": [{"arrival_s": 0.0, "prompt_tokens": 100,
                                                              "output_tokens": 450}]})
    messages = []
    for ff in (True, False):
        with pytest.raises(ConfigError) as err:
            _digest(sc, ff)
        messages.append(str(err.value))
    assert "negative step time" in messages[0] and "501 KV tokens read" in messages[0] and messages[0] == messages[1]
