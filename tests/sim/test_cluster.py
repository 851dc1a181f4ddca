"""Replicas behind a router: routing policies, prefix affinity, faults and health checks."""

import pytest

from tests.sim.helpers import run, scenario

WL = {"kind": "synthetic", "num_requests": 400, "arrival": {"kind": "poisson", "rate_rps": 8.0},
      "prompt_tokens": {"kind": "lognormal", "median": 600, "sigma": 0.7, "max": 4000},
      "output_tokens": {"kind": "lognormal", "median": 60, "sigma": 0.7, "max": 400}}


def cluster(n, router="least_outstanding", **kw):
    return {"replicas": n, "router": {"kind": router}, **kw}


def test_round_robin_alternates():
    reqs = [{"arrival_s": 0.1 * i, "prompt_tokens": 100, "output_tokens": 5} for i in range(6)]
    res = run(scenario(cluster=cluster(3, "round_robin"), workload={"kind": "requests", "requests": reqs}))
    assert res.requests["replica"].tolist() == [0, 1, 2, 0, 1, 2]
    assert sorted(res.iterations["replica"].unique().tolist()) == [0, 1, 2]


def test_least_outstanding_picks_the_emptier_replica_first_on_ties():
    reqs = [{"arrival_s": 0.0, "prompt_tokens": 2000, "output_tokens": 200},
            {"arrival_s": 0.0, "prompt_tokens": 2000, "output_tokens": 200},
            {"arrival_s": 0.0, "prompt_tokens": 100, "output_tokens": 5}]
    res = run(scenario(cluster=cluster(2), workload={"kind": "requests", "requests": reqs}))
    assert res.requests["replica"].tolist() == [0, 1, 0]


def test_two_replicas_double_the_capacity_of_one():
    heavy = {**WL, "arrival": {"kind": "poisson", "rate_rps": 30.0}}
    one = run(scenario(workload=heavy)).summary
    two = run(scenario(workload=heavy, cluster=cluster(2))).summary
    assert two["request_throughput_rps"] > 1.6 * one["request_throughput_rps"]
    assert two["gpu_seconds"] == pytest.approx(2 * two["makespan_s"])


def test_affinity_raises_the_prefix_hit_rate():
    wl = {**WL, "shared_prefix": {"tokens": 2048, "groups": 4}}
    kv = {"block_tokens": 16, "format": "bf16", "budget": "1500MiB"}  # room for ~2 prefixes and the running
    rr = run(scenario(workload=wl, kv=kv, cluster=cluster(2, "round_robin"))).summary
    aff = run(scenario(workload=wl, kv=kv, cluster=cluster(2, "affinity"))).summary
    assert aff["prefix_hit_rate"] > rr["prefix_hit_rate"] + 0.05


@pytest.mark.parametrize("on_failure", ["fail", "retry"])
def test_replica_fault_fails_or_retries_in_flight_requests(on_failure):
    faults = [{"replica": 0, "start_s": 10.0, "end_s": 30.0}]
    res = run(scenario(workload=WL, cluster=cluster(2, faults=faults, on_failure=on_failure)))
    s, req = res.summary, res.requests
    assert s["requests"] == 400
    if on_failure == "fail":
        assert s["failed"] > 0 and s["fault_retries"] == 0
        assert (req[req["status"] == "failed"]["replica"] != 1).all()
    else:
        assert s["failed"] == 0 and s["fault_retries"] > 0 and s["completed"] == 400
    # while replica 0 is down and known to be down, it receives nothing
    its = res.iterations
    assert its[(its["replica"] == 0) & (its["start_s"] > 10.0) & (its["start_s"] < 30.0)].empty
    arrived_in_outage = req[(req["arrival_s"] > 10.0 + 5.0 + 2.0) & (req["arrival_s"] < 30.0)]
    assert (arrived_in_outage["replica"] == 1).all()
    # it comes back: work again after the outage
    assert not its[(its["replica"] == 0) & (its["start_s"] > 35.0)].empty


def test_cluster_run_is_deterministic():
    sc = scenario(workload={**WL, "shared_prefix": {"tokens": 512, "groups": 3}},
                  cluster=cluster(3, "affinity", faults=[{"replica": 2, "start_s": 5.0, "end_s": 8.0}]))
    a, b = run(sc), run(sc)
    assert a.summary == b.summary and a.requests.equals(b.requests) and a.iterations.equals(b.iterations)
