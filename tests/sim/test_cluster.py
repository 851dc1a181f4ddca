"""Replicas behind a router: routing policies, prefix affinity, faults and health checks."""

import pytest

from sim.core.cluster import ClusterConfig, RouterConfig
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


def _outage(n):
    return {"replicas": n, "router": {"kind": "round_robin", "health_check_interval_s": 5.0}, "on_failure": "fail",
            "faults": [{"replica": 0, "start_s": 0.1 if n > 1 else 0.3, "end_s": 1.0}]}


def test_a_request_failed_with_its_replica_is_not_cancelled_later():
    """Its cancel_at_s fires after the replica came back as a fresh incarnation: that one never held it
    (found in review: it was recorded a second time, as cancelled, and could free the dead pool's blocks)."""
    res = run(scenario(cluster=_outage(1), workload={"kind": "requests", "requests": [
        {"arrival_s": 0.0, "prompt_tokens": 200, "output_tokens": 300, "cancel_at_s": 2.0},
        {"arrival_s": 1.5, "prompt_tokens": 200, "output_tokens": 300}]}))
    assert res.requests[["id", "status"]].values.tolist() == [[0, "failed"], [1, "finished"]]


def test_branches_of_a_failed_leader_go_on_their_own():
    """A parallel-sampling leader that fails as it arrives never prefills: its branches are routed on
    their own instead of waiting for it (found in review: the run never ended)."""
    import threading
    sc = scenario(cluster=_outage(2), workload={"kind": "requests", "requests": [
        {"arrival_s": 0.5, "prompt_tokens": 30, "output_tokens": 10, "n": 3}]})
    out = []
    t = threading.Thread(target=lambda: out.append(run(sc)), daemon=True)  # a hang fails the test, not CI
    t.start()
    t.join(60)
    assert out, "the run did not end"
    req = out[0].requests
    assert len(req) == 3 and req.loc[req["id"] == 0, "status"].item() == "failed"
    assert (req["status"] == "finished").sum() >= 1


def test_a_fault_at_time_zero_loses_no_request():
    """A request handed to the idle loop in the instant its replica fails is failed (or retried) with the others;
    it had been lost, and the health checks ran on forever waiting for it."""
    wl = {"kind": "requests", "requests": [{"arrival_s": 0.0, "prompt_tokens": 100, "output_tokens": 4},
                                           {"arrival_s": 6.0, "prompt_tokens": 100, "output_tokens": 4}]}
    res = run(scenario(workload=wl, cluster=cluster(1, faults=[{"replica": 0, "start_s": 0.0, "end_s": 5.0}],
                                                    on_failure="fail")))
    assert res.summary["requests"] == 2 and res.summary["failed"] == 1 and res.summary["completed"] == 1


@pytest.mark.parametrize("second, ok", [((2.0, 9.0), False), ((3.0, 9.0), False), ((3.5, 9.0), True)])
def test_overlapping_faults_of_one_replica_are_refused(second, ok):
    """A second fault that starts while the replica is still down did nothing: refused, naming both."""
    faults = [{"replica": 0, "start_s": 1.0, "end_s": 3.0}, {"replica": 0, "start_s": second[0], "end_s": second[1]}]
    if ok:
        ClusterConfig(replicas=1, faults=faults)
        return
    with pytest.raises(ValueError, match=r"faults.1 \(replica 0, start_s .*\) starts before faults.0 of the same"):
        ClusterConfig(replicas=1, faults=faults)


def test_health_checks_have_a_floor():
    with pytest.raises(ValueError, match="greater than or equal to 0.001"):
        RouterConfig(health_check_interval_s=1e-9)
