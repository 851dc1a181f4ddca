"""Closed-loop clients: N users, each sending its next request when its previous one leaves."""

import numpy as np
import pytest
import yaml

from sim.io.config import load_scenario
from sim.io.errors import ConfigError
from sim.core.simulation import Simulation
from sim.workloads.closed_loop import think_times
from tests.sim.helpers import run, scenario


def closed(users=4, n=40, think=0.0, dist="fixed", prompt=300, output=20, ramp=0.0, phases=None, **extra):
    wl = {"kind": "closed_loop", "users": users, "num_requests": n, "think_time_s": think, "ramp_up_s": ramp,
          "think_distribution": dist, "prompt_tokens": {"kind": "fixed", "value": prompt},
          "output_tokens": {"kind": "fixed", "value": output}, **({"ramp_phases": phases} if phases else {})}
    return scenario(workload=wl, **extra)


def in_system(req, t):
    """Requests sent at or before t that have not left by t."""
    return int(((req["arrival_s"] <= t) & (req["finish_s"] > t)).sum())


def test_never_more_than_n_users_and_the_first_wave_starts_together():
    res = run(closed(users=4, n=40))
    req = res.requests
    assert res.summary["completed"] == 40
    assert (req["arrival_s"].nsmallest(4) == 0.0).all()
    assert (req["arrival_s"] > 0).sum() == 36
    events = np.concatenate([req["arrival_s"].to_numpy(), req["finish_s"].to_numpy()])
    assert max(in_system(req, t) for t in events) == 4
    # while requests remain to be sent, every user always has one in the system
    last_send = req["arrival_s"].max()
    assert all(in_system(req, t) == 4 for t in req["finish_s"] if t < last_send)


def test_each_request_is_sent_when_an_earlier_one_leaves_plus_think_time():
    for think in (0.0, 0.25):
        req = run(closed(users=3, n=30, think=think)).requests.sort_values("arrival_s", kind="stable")
        finishes = np.sort(req["finish_s"].to_numpy())
        later = req["arrival_s"].to_numpy()[3:]
        # the k-th send after the first wave follows the k-th departure by the think time
        assert later == pytest.approx(finishes[:len(later)] + think, abs=1e-12)


def test_exponential_think_time_is_seeded_and_has_its_mean():
    sim_a = Simulation(closed(users=2, n=400, think=0.5, dist="exponential", output=5), ".")
    a = sim_a.run()
    assert a.digest() == run(closed(users=2, n=400, think=0.5, dist="exponential", output=5)).digest()
    req = a.requests.sort_values("id")
    # request i >= users is claimed by the (i - users)-th departure and sent its think time later
    gaps = req["arrival_s"].to_numpy()[2:] - np.sort(req["finish_s"].to_numpy())[:398]
    assert gaps == pytest.approx(sim_a.workload.think_s[2:], abs=1e-9)
    assert gaps.min() > 0
    many = think_times(40000, 10, 0.5, "exponential", np.random.default_rng(1))
    assert (many[:10] == 0).all() and many[10:].mean() == pytest.approx(0.5, rel=0.02)
    assert (think_times(50, 10, 0.5, "fixed", np.random.default_rng(1))[10:] == 0.5).all()


def test_ramp_up_spreads_the_first_wave_and_the_loop_keeps_n_users():
    req = run(closed(users=4, n=40, ramp=2.0)).requests.sort_values("id")
    assert req["arrival_s"].to_numpy()[:4].tolist() == [0.0, 0.5, 1.0, 1.5]
    events = np.concatenate([req["arrival_s"].to_numpy(), req["finish_s"].to_numpy()])
    assert max(in_system(req, t) for t in events) == 4


def test_random_ramp_phases_are_seeded_within_the_ramp_and_leave_think_times_alone():
    def first_wave(seed, dist="fixed", users=6, n=30):
        return Simulation(closed(users=users, n=n, ramp=3.0, think=0.2, dist=dist, phases="random", seed=seed), ".")
    a, b, c = first_wave(1), first_wave(1), first_wave(2)
    starts = a.workload.arrival_s[:6]
    assert (0.0 <= starts).all() and (starts < 3.0).all() and (np.diff(starts) >= 0).all()
    assert starts.tolist() != [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]        # not the even spread
    assert starts.tolist() == b.workload.arrival_s[:6].tolist()      # the same seed, the same phases
    assert starts.tolist() != c.workload.arrival_s[:6].tolist()      # another seed, others
    assert a.run().digest() == b.run().digest()
    # the phases are drawn after the think times: an exponential think time draws the same values as with even phases
    even = Simulation(closed(users=6, n=30, ramp=3.0, think=0.2, dist="exponential", seed=1), ".")
    assert (first_wave(1, "exponential").workload.think_s == even.workload.think_s).all()
    # fewer requests than users: each request is a first one, all within the ramp
    few = first_wave(1, users=6, n=3).workload.arrival_s
    assert len(few) == 3 and ((0.0 <= few) & (few < 3.0)).all()


def test_one_user_is_sequential_and_more_users_than_requests_all_start_at_once():
    req = run(closed(users=1, n=5)).requests.sort_values("arrival_s")
    assert (req["arrival_s"].to_numpy()[1:] == req["finish_s"].to_numpy()[:-1]).all()
    req = run(closed(users=10, n=3)).requests
    assert (req["arrival_s"] == 0).all()


def test_rejected_requests_free_their_user():
    # prompts over the continuous scheduler's token budget are refused at the door: the loop goes on
    res = run(closed(users=2, n=6, prompt=9000))
    assert res.summary["rejected"] == 6


def test_closed_loop_config_errors(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(closed().model_dump(mode="json") | {
        "workload": {"kind": "closed_loop", "users": 0, "num_requests": 5, "think_distribution": "gamma",
                     "prompt_tokens": {"kind": "fixed", "value": 5}, "output_tokens": {"kind": "fixed", "value": 5}}}))
    with pytest.raises(ConfigError) as err:
        load_scenario(path)
    assert any("workload" in line and "users" in line for line in err.value.lines)
    assert any("think_distribution" in line and "gamma" in line for line in err.value.lines)


def test_frontend_latency_counts_in_latency_and_delays_the_engine():
    """cluster.frontend_latency_s: a request reaches the engine that long after its send; its TTFT and E2E count
    from the send. One closed-loop user: every request waits it once more, so the run is n x 50 ms longer and
    the engine's own times are unchanged (nothing else shares the engine)."""
    base = run(closed(users=1, n=10))
    late = run(closed(users=1, n=10, cluster={"frontend_latency_s": 0.05}))
    b, lt = base.requests.sort_values("id"), late.requests.sort_values("id")
    assert np.allclose(lt["ttft_s"] - b["ttft_s"], 0.05, atol=1e-9)
    assert np.allclose(lt["e2e_s"] - b["e2e_s"], 0.05, atol=1e-9)
    assert late.summary["makespan_s"] == pytest.approx(base.summary["makespan_s"] + 10 * 0.05, abs=1e-9)
    assert np.allclose(lt["admitted_s"] - lt["arrival_s"], 0.05, atol=1e-9)   # the engine admits on receipt
    # open loop (sparse Poisson arrivals, so requests do not meet): the same requests, each 50 ms later
    open_base = run(scenario(workload__num_requests=30, workload__arrival={"kind": "poisson", "rate_rps": 0.2}))
    open_late = run(scenario(workload__num_requests=30, workload__arrival={"kind": "poisson", "rate_rps": 0.2},
                             cluster={"frontend_latency_s": 0.05}))
    ob, ol = open_base.requests.sort_values("id"), open_late.requests.sort_values("id")
    assert (ob["arrival_s"].to_numpy() == ol["arrival_s"].to_numpy()).all()
    assert np.allclose(ol["ttft_s"] - ob["ttft_s"], 0.05, atol=1e-9)
    with pytest.raises(Exception, match="frontend_latency_s"):
        closed(cluster={"frontend_latency_s": -0.01})
