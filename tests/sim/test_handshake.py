"""When an engine takes new requests (scheduler.recv_interval) and a decode replica that must take a request before
its prefill starts (disaggregation.decode_preallocation): sim.core.engine.RecvGate, sim.core.handoff."""

import pytest

from sim.io.errors import ConfigError
from tests.sim.helpers import run, scenario
from tests.sim.test_disaggregation import _load, disagg, requests


def _decode_ends(its, replica):
    """End times of `replica`'s decode-only iterations, in order."""
    mine = its[(its["replica"] == replica) & (its["prefill_tokens"] == 0)]
    return list(mine["start_s"] + mine["duration_s"])


@pytest.mark.parametrize("every", [1, 4])
def test_a_request_arriving_while_the_engine_decodes_waits_for_the_pass_that_takes_arrivals(every):
    """A prefills, then decodes; B arrives during A's first decode iteration. The pass after A's prefill takes
    arrivals (an extend counts `every`); each decode pass counts 1, so B is taken after A's `every`-th decode."""
    first = run(scenario(workload=requests((0.0, 500, 40))))
    a_prefill_end = float(first.iterations["start_s"].iloc[0] + first.iterations["duration_s"].iloc[0])
    wl = requests((0.0, 500, 40), (a_prefill_end + 0.001, 300, 5))
    res = run(scenario(workload=wl, scheduler={"kind": "continuous", "max_num_seqs": 32,
                                               "max_num_batched_tokens": 8192, "recv_interval": every}))
    b = res.requests.iloc[1]
    ends = _decode_ends(res.iterations, 0)
    assert b["admitted_s"] == ends[every - 1]
    assert (res.requests["status"] == "finished").all()


def test_an_idle_engine_takes_a_request_at_once_whatever_its_interval():
    res = run(scenario(workload=requests((0.0, 500, 3), (5.0, 300, 3)),
                       scheduler={"kind": "continuous", "max_num_seqs": 32, "max_num_batched_tokens": 8192,
                                  "recv_interval": 50}))
    assert list(res.requests["admitted_s"]) == [0.0, 5.0]


def test_a_receive_interval_of_zero_is_refused_naming_the_field():
    base = scenario().model_dump(mode="python")
    base["scheduler"]["recv_interval"] = 0
    with pytest.raises(ConfigError) as err:
        _load(base)
    assert "scheduler.recv_interval" in str(err.value)


def _prealloc(every=1, first=None):
    """Two requests on one prefill and one decode replica: A (long output) keeps the decode replica busy; B arrives
    while it decodes."""
    cfg = {**disagg(latency_s=0.001), "decode_preallocation": True}
    cfg["decode"] = {"replicas": 1, "scheduler": {"kind": "continuous", "max_num_seqs": 32,
                                                  "max_num_batched_tokens": 8192, "recv_interval": every}}
    one = run(scenario(workload=requests((0.0, 800, 60)), disaggregation=disagg(latency_s=0.001)))
    arrive_b = float(one.requests.loc[0, "decode_admitted_s"]) + 0.05
    wl = requests((0.0, 800, 60), (arrive_b, 800, 5))
    plain = run(scenario(workload=wl, disaggregation=disagg(latency_s=0.001)))
    return plain, run(scenario(workload=wl, disaggregation=cfg)), arrive_b


@pytest.mark.parametrize("every", [1, 3])
def test_the_prefill_waits_for_the_decode_replica_to_take_the_request(every):
    """B's prefill starts when the busy decode replica takes B (pre-allocates): at the end of its decode iteration
    running at B's arrival (every pass takes arrivals), or at the end of the iteration whose pass count reaches 3 since
    the replica took A out of idle. A found the decode replica idle: it was taken at once."""
    plain, res, arrive_b = _prealloc(every)
    pre = res.iterations[res.iterations["replica"] == 0].reset_index(drop=True)
    assert pre.loc[0, "start_s"] == 0.0 == plain.iterations.loc[0, "start_s"]  # A: the decode replica was idle
    ends = _decode_ends(res.iterations, 1)
    after = [t for t in ends if t > arrive_b]
    if every == 1:
        taken = after[0]
    else:  # the passes that take arrivals end the 3rd, 6th, ... decode iteration since A was taken
        taken = next(t for k, t in enumerate(ends, start=1) if k % every == 0 and t > arrive_b)
    assert pre.loc[1, "start_s"] == taken > arrive_b
    plain_pre = plain.iterations[plain.iterations["replica"] == 0].reset_index(drop=True)
    assert plain_pre.loc[1, "start_s"] == arrive_b  # without it, B's prefill starts when B arrives
    b = res.requests.iloc[1]
    assert b["ttft_s"] == pytest.approx(plain.requests.loc[1, "ttft_s"] + taken - arrive_b)
    assert b["replica"] == 1 and (res.requests["status"] == "finished").all()


def test_preallocation_is_deterministic_and_keeps_every_request():
    from sim.core.simulation import Simulation
    from tests.sim.test_disaggregation import _busy
    sc = _busy()
    cfg = sc.disaggregation.model_copy(update={"decode_preallocation": True})
    sc = sc.model_copy(update={"disaggregation": cfg})
    a, b = Simulation(sc, ".").run(), Simulation(sc, ".").run()
    assert a.digest() == b.digest()
    assert (a.requests["status"] == "finished").all()
    plain = Simulation(sc.model_copy(update={"disaggregation": cfg.model_copy(
        update={"decode_preallocation": False})}), ".").run()
    assert (a.requests["prefill_done_s"] >= plain.requests["prefill_done_s"] - 1e-9).mean() > 0.9


def test_a_pass_that_takes_transferred_requests_lets_the_next_pass_take_arrivals():
    """SGLang 0.5.x takes transferred requests in a prebuilt pass without a forward, which counts like an extend, so
    the pass right after it receives: A decodes on a replica that takes new requests every 10th pass; C's KV lands
    during A's decodes; B, announced while C was in flight, is taken when C is, not at the 10th pass."""
    cfg = {**disagg(latency_s=0.001), "decode_preallocation": True}
    cfg["decode"] = {"replicas": 1, "scheduler": {"kind": "continuous", "max_num_seqs": 32,
                                                  "max_num_batched_tokens": 8192, "recv_interval": 10}}
    one = run(scenario(workload=requests((0.0, 800, 60)), disaggregation=cfg))
    arrive_b = float(one.requests.loc[0, "decode_admitted_s"]) + 0.005
    res = run(scenario(workload=requests((0.0, 800, 60), (0.001, 800, 60), (arrive_b, 300, 5)), disaggregation=cfg))
    a, c, b = (res.requests.iloc[i] for i in range(3))
    assert a["decode_admitted_s"] < arrive_b < c["decode_admitted_s"]
    dec = res.iterations[res.iterations["replica"] == 1].reset_index(drop=True)
    tenth = float(dec.loc[9, "start_s"] + dec.loc[9, "duration_s"])
    pre = res.iterations[res.iterations["replica"] == 0].reset_index(drop=True)
    assert pre.loc[2, "start_s"] == c["decode_admitted_s"] < tenth


def test_a_request_cancelled_before_its_decode_replica_takes_it_leaves_at_once():
    """B waits for the busy decode replica (interval 10) and is cancelled meanwhile: it leaves then, never
    prefilled."""
    cfg = {**disagg(latency_s=0.001), "decode_preallocation": True}
    cfg["decode"] = {"replicas": 1, "scheduler": {"kind": "continuous", "max_num_seqs": 32,
                                                  "max_num_batched_tokens": 8192, "recv_interval": 10}}
    one = run(scenario(workload=requests((0.0, 800, 60)), disaggregation=cfg))
    arrive_b = float(one.requests.loc[0, "decode_admitted_s"]) + 0.005
    wl = {"kind": "requests", "requests": [
        {"arrival_s": 0.0, "prompt_tokens": 800, "output_tokens": 60},
        {"arrival_s": arrive_b, "prompt_tokens": 300, "output_tokens": 5, "cancel_at_s": arrive_b + 0.01}]}
    res = run(scenario(workload=wl, disaggregation=cfg))
    b = res.requests.iloc[1]
    assert b["status"] == "cancelled" and b["finish_s"] == pytest.approx(arrive_b + 0.01)
    assert b["output_tokens"] == 0 and b["prefill_done_s"] != b["prefill_done_s"]  # (NaN: never prefilled)
    assert len(res.iterations[res.iterations["replica"] == 0]) == 1  # the prefill replica ran A's prompt only
    assert res.requests.iloc[0]["status"] == "finished"
