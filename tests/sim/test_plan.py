"""capsim plan: goodput capacity against queueing theory, replicas by simulation, the search ranking,
and the memory / deadline plane of the chapter's schemes A-D."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy.optimize import brentq

from capsim.cli import main
from capsim.commands.run import compare_rows
from sim.io.errors import ConfigError
from sim.planning.capacity import run_plan
from sim.planning.plane import plane_rows
from sim.planning.slo import SLO, attainment, parse_slo
from tests.sim.helpers import REPO_SCENARIOS

# One server, one request at a time, every request exactly 1 s of service (a single 1-token
# iteration of a constant 1.0 s step): a D/D/1 or M/D/1 queue, depending on the arrivals.
SERVER = {
    "name": "one-second-server", "seed": 0, "model": "qwen3-8b", "hardware": "rtx-pro-6000-bw-ws",
    "kv": {"block_tokens": 16, "format": "bf16", "budget": "12GiB"},
    "scheduler": {"kind": "fixed", "max_num_seqs": 1},
    "step_time": {"model": {"kind": "linear", "constant_s": 1.0, "per_new_token_s": 0.0, "per_pair_s": 0.0}},
    "workload": {"kind": "synthetic", "num_requests": 200, "arrival": {"kind": "constant", "rate_rps": 0.3},
                 "prompt_tokens": {"kind": "fixed", "value": 16}, "output_tokens": {"kind": "fixed", "value": 1}},
}


def write(tmp_path, name="server.yaml", **changes):
    data = json.loads(json.dumps(SERVER))
    data.update(changes)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def dd1_capacity(n: int, slack: float, target: float) -> float:
    """Constant arrivals 1/r apart, 1 s service: request i waits i (1 - 1/r), so it meets
    e2e <= 1 + slack while i (1 - 1/r) <= slack; the target needs the first ceil(target n) to."""
    last = math.ceil(target * n) - 1
    return 1.0 / (1.0 - slack / last)


# ---- SLO parsing and attainment -------------------------------------------------------------------

def test_an_slo_given_twice_is_refused():
    from sim.io.errors import ConfigError
    with pytest.raises(ConfigError, match="--slo 'ttft=1,ttft=2': ttft given twice"):
        parse_slo("ttft=1,ttft=2")
    with pytest.raises(ConfigError, match="tpot_s given twice"):
        parse_slo("tpot=1,tpot_s=2")


def test_parse_slo():
    assert parse_slo("ttft=2,tpot=100ms,e2e=30") == SLO(ttft_s=2.0, tpot_s=0.1, e2e_s=30.0)
    assert parse_slo("e2e_s=7s, itl=0.2") == SLO(e2e_s=7.0, itl_s=0.2)
    for bad, msg in (("ttft", "name=seconds"), ("lat=2", "unknown SLO 'lat'"), ("ttft=fast", "expected seconds"),
                     ("e2e=-1", "positive")):
        with pytest.raises(ConfigError, match=msg):
            parse_slo(bad)


def test_attainment_counts_failed_and_rejected_requests_as_missed():
    nan = float("nan")
    req = pd.DataFrame({
        "status": ["finished", "finished", "finished", "rejected", "failed", "finished"],
        "correct": [1.0, 1.0, 1.0, nan, nan, 0.0],
        "ttft_s": [0.5, 2.5, 0.4, nan, nan, 0.1],
        "tpot_s": [0.05, 0.05, nan, nan, nan, 0.01],   # nan: a one-token answer has no TPOT
        "e2e_s": [3.0, 4.0, 0.4, nan, nan, 1.0],
        "max_itl_s": [0.1, 0.1, nan, nan, nan, 0.02],
    })
    a = attainment(req, SLO(ttft_s=2.0, tpot_s=0.06, e2e_s=3.5), target=0.5)
    assert a["good"] == 2 and a["attainment"] == pytest.approx(2 / 6)      # rows 0 and 2; row 5 is wrong
    assert a["attainment_ttft"] == pytest.approx(2 / 6)     # row 1 is slow, row 5 wrong
    assert a["attainment_tpot"] == pytest.approx(3 / 6)
    assert a["attainment_e2e"] == pytest.approx(2 / 6)
    assert a["e2e_at_target_s"] == 3.0      # 3rd of [0.4, 1.0, 3.0, 4.0, inf, inf]


# ---- goodput capacity ---------------------------------------------------------------------------

def test_capacity_of_a_deterministic_queue_is_found_within_the_interval(tmp_path):
    res = run_plan(write(tmp_path), tmp_path / "out", slo=SLO(e2e_s=1.5), target=0.99, replications=1,
                   workers=1, plots=False)
    exact = dd1_capacity(200, 0.5, 0.99)                       # 1.00254 req/s
    lo, hi = res.bracket
    assert lo <= exact <= hi and hi - lo <= 0.02 * hi
    assert res.interval[0] <= exact <= res.interval[1]
    assert res.capacity_rps == lo and 0.98 * exact <= res.capacity_rps <= exact
    # every rate tried is in the table, with the vLLM-style goodput next to the attainment
    rates = pd.read_csv(tmp_path / "out" / "rates.csv")
    assert {"rate_rps", "attainment", "attainment_e2e", "request_goodput_rps", "seed_offset"} <= set(rates.columns)
    below = rates[rates["rate_rps"] <= 1.0]
    assert (below["attainment"] == 1.0).all()
    assert np.allclose(below["request_goodput_rps"], 200 / (199 / below["rate_rps"] + 1.0))


def test_step_time_error_bands_the_capacity_with_faster_and_slower_steps(tmp_path, capsys):
    """--step-time-error 0.1: the D/D/1 server's capacity again with 0.9 s and 1.1 s of service (step_time.scale):
    request i meets e2e <= 1.5 while f + i (f - 1/r) <= 1.5, so with 100 requests (an override the bands keep)
    the capacity is 1 / (f - (1.5 - f) / 98)."""
    res = run_plan(write(tmp_path), tmp_path / "out", slo=SLO(e2e_s=1.5), target=0.99, replications=1,
                   workers=1, plots=False, step_time_error=0.1, overrides=["workload.num_requests=100"])
    faster, slower = res.sensitivity["cases"]
    assert (faster["steps"], slower["steps"]) == ("faster", "slower") and res.sensitivity["step_time_error"] == 0.1
    for case, f in ((faster, 0.9), (slower, 1.1), ({"scale": 1.0, "bracket_rps": res.bracket}, 1.0)):
        exact = 1.0 / (f - (1.5 - f) / 98)
        lo, hi = case["bracket_rps"]
        assert case["scale"] == pytest.approx(f) and lo <= exact <= hi and hi - lo <= 0.02 * hi
    assert faster["capacity_rps"] > res.capacity_rps > slower["capacity_rps"]
    assert json.loads((tmp_path / "out" / "plan.json").read_text())["sensitivity"] == res.sensitivity
    from sim.planning.plan_text import print_plan
    print_plan(res)
    assert (f"if every step were 10% faster / as modelled / 10% slower: capacity {faster['per_replica_rps']:.4g} / "
            f"{res.capacity_rps:.4g} / {slower['per_replica_rps']:.4g} req/s per replica") in capsys.readouterr().out


def test_step_time_error_bands_the_replicas_for_a_target_rate(tmp_path, capsys):
    """At 2 req/s the 1 s server needs 2 replicas (capacity 1.0025 each); with 1.1 s of service (0.911 each) 3."""
    assert main(["plan", str(write(tmp_path)), "--slo", "e2e=1.5", "--attainment", "0.99", "--target-rps", "2.0",
                 "--replications", "1", "--workers", "1", "--quiet", "--step-time-error", "0.1",
                 "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    plan = json.loads((tmp_path / "o" / "plan.json").read_text())
    assert plan["replicas"]["simulated_replicas"] == 2
    assert [c["simulated_replicas"] for c in plan["sensitivity"]["cases"]] == [2, 3]
    assert "  replicas for 2 req/s: 2 / 2 / 3" in out.splitlines()


@pytest.mark.parametrize("extra, message", [(["--step-time-error", "1.5"], "--step-time-error: expected a fraction"),
                                            (["--step-time-error", "0.1", "--set", "step_time.scale=1.2"],
                                             "already sets step_time.scale: 1.2"),
                                            (["--step-time-error", "0.1", "--gpus", "2"], "only without --gpus")])
def test_step_time_error_is_refused_where_it_cannot_apply(tmp_path, capsys, extra, message):
    code = None
    try:
        code = main(["plan", str(write(tmp_path)), "--slo", "e2e=1.5", "--workers", "1", "--quiet",
                     "--out", str(tmp_path / "o"), *extra])
    except SystemExit as exc:
        code = exc.code
    assert code == 2 and message in capsys.readouterr().err


def test_capacity_of_an_md1_queue_matches_erlang_within_the_interval(tmp_path):
    """M/D/1 with D = 1 s: P(wait <= t) = (1 - rho) e^(lambda t) for t < D (Erlang), so with
    e2e <= 1.5 s the highest rate at 80 % attainment solves (1 - l) e^(l / 2) = 0.8."""
    theory = brentq(lambda lam: (1 - lam) * math.exp(0.5 * lam) - 0.8, 1e-6, 0.999)    # 0.3174 req/s
    wl = {**SERVER["workload"], "arrival": {"kind": "poisson", "rate_rps": 0.3}}
    res = run_plan(write(tmp_path, workload=wl), tmp_path / "out", slo=SLO(e2e_s=1.5), target=0.8, replications=3,
                   requests=2000, workers=1, plots=False)
    assert res.interval[0] <= theory <= res.interval[1]
    assert res.capacity_rps == pytest.approx(theory, rel=0.05)
    assert res.interval[1] - res.interval[0] < 0.15 * theory


def test_capacity_is_per_replica(tmp_path):
    two = {"replicas": 2, "router": {"kind": "least_outstanding"}}
    res = run_plan(write(tmp_path, cluster=two), tmp_path / "out", slo=SLO(e2e_s=1.5), target=0.99,
                   replications=1, workers=1, plots=False)
    # least outstanding alternates: each replica sees every other request, 100 each
    exact = dd1_capacity(100, 0.5, 0.99)
    per = res.as_dict()["capacity"]
    assert per["bracket_per_replica_rps"][0] <= exact <= per["bracket_per_replica_rps"][1]
    assert per["rate_rps"] == pytest.approx(2 * per["per_replica_rps"])


def test_a_target_tighter_than_the_service_time_has_no_capacity(tmp_path, capsys):
    path = write(tmp_path)
    assert main(["plan", str(path), "--slo", "e2e=0.5", "--replications", "1", "--workers", "1", "--quiet",
                 "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "goodput capacity: none" in out and "tighter than a lone request's service" in out
    # how far to trust the plan: the step-time model's fit error, as `capsim run` states it
    assert out.splitlines()[1] == ("step-time model linear: fit error unknown (the coefficients are typed into the "
                                   "scenario, not fitted)")


# ---- replicas and search ------------------------------------------------------------------------

def test_replicas_for_a_target_rate_are_checked_by_simulation(tmp_path):
    res = run_plan(write(tmp_path), tmp_path / "out", slo=SLO(e2e_s=1.5), target=0.99, target_rps=3.5,
                   replications=1, workers=1, search=["scheduler.max_num_seqs=1,2"], plots=True)
    r = res.replicas
    assert r["division_estimate"] == pytest.approx(3.5 / res.capacity_rps)
    assert r["division_replicas"] == 4 and r["simulated_replicas"] == 4
    tried = {t["replicas"]: t["attainment"] for t in r["tried"]}
    assert tried[4] >= 0.99 > tried[3]            # 3 replicas would each see 1.17 req/s > 1 / service
    # the search runs on the cluster the check settled on; two at a time halves the service per request
    assert [row["replicas"] for row in res.search] == [4, 4]
    assert all(row["feasible"] for row in res.search)
    assert (tmp_path / "out" / "memory_deadline_plane.png").exists()
    assert (tmp_path / "out" / "attainment.png").exists()


def test_search_ranks_feasible_configurations_by_gpu_hours_per_million_good(tmp_path):
    res = run_plan(write(tmp_path), tmp_path / "out", slo=SLO(e2e_s=1.5), target=0.99, target_rps=1.5,
                   replications=2, workers=1, search=["cluster.replicas=1,2,4"], plots=False)
    ranked = [(row["replicas"], row["feasible"]) for row in res.search]
    assert ranked == [(2, True), (4, True), (1, False)]
    best = res.search[0]
    assert best["gpu_hours_per_million_good"] == pytest.approx(best["gpu_seconds"] / best["good"] * 1e6 / 3600)
    assert best["good"] == 2 * 400           # 2 seeds x 200 requests per replica
    assert best["energy_j_per_good"] > 0 and best["rank"] == 1
    table = pd.read_csv(tmp_path / "out" / "search.csv")
    assert table["rank"].tolist() == [1, 2, 3] and table["cluster.replicas"].tolist() == [2, 4, 1]


def test_trace_workloads_are_planned_through_rate_scale(tmp_path):
    (tmp_path / "trace.csv").write_text("arrival_s,prompt_tokens,output_tokens\n"
                                        + "".join(f"{2.0 * i},16,1\n" for i in range(200)))
    path = write(tmp_path, workload={"kind": "trace", "path": "trace.csv", "format": "csv"})
    res = run_plan(path, tmp_path / "out", slo=SLO(e2e_s=1.5), target=0.99, replications=1, workers=1, plots=False)
    assert res.rate_kind == "trace"
    exact = dd1_capacity(200, 0.5, 0.99)
    assert res.bracket[0] <= exact <= res.bracket[1]


@pytest.mark.parametrize("workload", [
    {"kind": "requests", "requests": [{"arrival_s": 0.0, "prompt_tokens": 16, "output_tokens": 1}]},
    {**SERVER["workload"], "arrival": {"kind": "all_at_once"}},
])
def test_workloads_without_a_rate_are_refused_with_the_supported_kinds(tmp_path, capsys, workload):
    path = write(tmp_path, workload=workload)
    assert main(["plan", str(path), "--slo", "e2e=2", "--workers", "1", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "synthetic with poisson, gamma or constant arrivals (workload.arrival.rate_rps) or a trace " \
           "(workload.rate_scale)" in err


@pytest.mark.parametrize("extra", [[], ["--gpus", "1"]])
def test_an_empty_slo_is_refused_not_read_as_none_given(tmp_path, capsys, extra):
    path = write(tmp_path)
    assert main(["plan", str(path), "--slo", "", *extra, "--workers", "1", "--out", str(tmp_path / "o")]) == 2
    assert "--slo '': give at least one of ttft, tpot, e2e, itl" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("extra", [[], ["--gpus", "1"]])
def test_a_target_missed_at_every_rate_stops_at_the_slowest_rate_a_scenario_takes(tmp_path, capsys, extra):
    """Halving the rate from 0.01 req/s would pass below rate_rps's floor (1e-6): the search stops there and says
    the target is missed, instead of failing on a rate it made up."""
    wl = {**SERVER["workload"], "arrival": {"kind": "poisson", "rate_rps": 0.01}, "num_requests": 20}
    path = write(tmp_path, workload=wl)
    code = main(["plan", str(path), "--slo", "ttft=0.0001", "--workers", "1", "--replications", "1", "--quiet",
                 *extra, "--out", str(tmp_path / "o")])
    captured = capsys.readouterr()
    assert "Input should be greater than or equal to" not in captured.err
    assert code == 0  # "none" is the plan's answer
    assert ("missed at every rate tried" if extra else "rate") in captured.out


def test_plan_on_dask_workers_equals_the_serial_plan(tmp_path):
    wl = {**SERVER["workload"], "arrival": {"kind": "poisson", "rate_rps": 0.3}, "num_requests": 300}
    path = write(tmp_path, workload=wl)
    kw = dict(slo=SLO(e2e_s=1.5), target=0.8, replications=2, plots=False)
    a = run_plan(path, tmp_path / "a", workers=1, **kw).as_dict()
    b = run_plan(path, tmp_path / "b", workers=2, **kw).as_dict()
    assert a["capacity"] == b["capacity"] and a["rates"] == b["rates"]


def test_cli_plan_json(tmp_path, capsys):
    path = write(tmp_path)
    assert main(["plan", str(path), "--slo", "e2e=1.5", "--attainment", "0.99", "--target-rps", "2.5",
                 "--replications", "1", "--workers", "1", "--quiet", "--json", "--out", str(tmp_path / "o")]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["slo"] == {"e2e_s": 1.5} and d["attainment_target"] == 0.99
    assert d["step_time_fit"]["kind"] == "linear" and d["step_time_fit"]["mape"] is None
    assert d["replicas"]["simulated_replicas"] == 3
    assert {p.name for p in (tmp_path / "o").iterdir()} >= {"plan.json", "rates.csv", "replicas.csv",
                                                           "attainment.png", "memory_deadline_plane.png"}


def test_a_capacity_from_a_run_too_short_to_build_a_queue_is_warned_about(tmp_path, capsys):
    """The 1 s server with 2 requests: the second, arriving 1/r after the first, leaves at 2 s, so it meets
    e2e <= 1.5 up to r = 2 req/s: a "capacity" of twice the 1 req/s the server sustains (200 requests: 1.0025), because
    both requests arrive (within 1/r = 0.5 s) before the first leaves and no queue can build. plan had printed it
    without a word; now the text and plan.json's warnings say so, as plan --gpus's rows do."""
    path = write(tmp_path)
    assert main(["plan", str(path), "--slo", "e2e=1.5", "--attainment", "0.99", "--requests", "2", "--replications",
                 "1", "--workers", "1", "--quiet", "--out", str(tmp_path / "short")]) == 0
    out = capsys.readouterr().out
    plan = json.loads((tmp_path / "short" / "plan.json").read_text())
    assert 1.9 <= plan["capacity"]["rate_rps"] <= 2.0
    (warning,) = plan["warnings"]
    assert warning.startswith("short run: the goodput capacity rests on runs whose 2 requests arrive within 1.0")
    assert "less than their p99 E2E (1.4" in warning and "raise --requests" in warning
    assert f"warning: {warning}" in out.splitlines()
    # the replicas for a target rate, checked on as short a run, are flagged too
    assert main(["plan", str(path), "--slo", "e2e=1.5", "--attainment", "0.99", "--requests", "2", "--target-rps", "1.9",
                 "--replications", "1", "--workers", "1", "--quiet", "--json", "--out", str(tmp_path / "short2")]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["replicas"]["simulated_replicas"] == 1
    assert [w.split(" rests on")[0] for w in plan["warnings"]] == ["short run: the goodput capacity",
                                                                     "short run: the replica count (1)"]
    assert "likely too few" in plan["warnings"][1]
    # a long enough run: no warning (and the key is there, empty)
    res = run_plan(path, tmp_path / "long", slo=SLO(e2e_s=1.5), target=0.99, replications=1, workers=1, plots=False)
    assert res.capacity_rps < 1.01 and res.warnings == [] and res.as_dict()["warnings"] == []


def test_the_qa_short_run_of_a_70b_replica_is_warned_about(tmp_path, capsys):
    """QA's case: 150 requests of Llama-3.1-70B TP4 put the capacity at 12.5 req/s (1,500 requests: 6.25) while the
    goodput column (good requests over a run's makespan, drain included) showed 4.2: the 150 requests arrive within
    12 s, all are admitted at once (256 sequences), so TTFT stays within 2 s though the E2E p99 is 29 s."""
    assert main(["plan", str(REPO_SCENARIOS / "parallel" / "llama-3.1-70b-tp4-h100.yaml"), "--target-rps", "10",
                 "--requests", "150", "--replications", "1", "--tol", "0.1", "--workers", "1", "--quiet",
                 "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    plan = json.loads((tmp_path / "o" / "plan.json").read_text())
    assert plan["warnings"] and all(w.startswith("short run: ") for w in plan["warnings"])
    assert "warning: short run: the goodput capacity rests on runs whose 150 requests arrive" in out


# ---- the memory / deadline plane ------------------------------------------------------------------

def test_chapter_schemes_on_the_memory_deadline_plane_match_compare(tmp_path, capsys):
    files = [str(REPO_SCENARIOS / "chapter8" / f"scheme-{s}.yaml") for s in "abcd"]
    assert main(["plan-plane", *files, "--deadline", "7", "--json", "--out", str(tmp_path / "plane")]) == 0
    rows = json.loads(capsys.readouterr().out)
    ref = compare_rows(files, [])
    assert [r["scenario"] for r in rows] == [r["scenario"] for r in ref] == ["scheme-a", "scheme-b", "scheme-c",
                                                                               "scheme-d"]
    for r, c in zip(rows, ref):
        assert r["kv_need_bytes"] == c["kv_need_bytes"] and r["kv_budget_bytes"] == c["kv_budget_bytes"]
        assert r["makespan_s"] == c["makespan_s"] and r["memory_fit"] == c["memory_fit"]
        assert r["feasible"] == c["feasible"] and r["on_time"] == c["deadline_met"]
        assert r["memory_ratio"] == pytest.approx(c["kv_need_bytes"] / c["kv_budget_bytes"])
        assert r["deadline_ratio"] == pytest.approx(c["makespan_s"] / 7.0)
    assert [r["quadrant"] for r in rows] == ["out of memory and late", "late", "late", "feasible"]
    # the chapter's numbers: A needs 19,008 MiB of 12 GiB, B ends at 9.01 s, D at 4.56 s
    assert rows[0]["kv_need_bytes"] == 19008 * 2**20 and rows[1]["makespan_s"] == pytest.approx(9.01, abs=0.01)
    assert rows[3]["makespan_s"] == pytest.approx(4.56, abs=0.01)
    csv = pd.read_csv(tmp_path / "plane" / "plane.csv")
    assert csv["quadrant"].tolist() == [r["quadrant"] for r in rows]
    assert (tmp_path / "plane" / "memory_deadline_plane.png").stat().st_size > 10_000


def test_plane_deadline_defaults_to_the_scenario_slo():
    files = [REPO_SCENARIOS / "chapter8" / "scheme-d.yaml"]
    assert plane_rows(files)[0]["deadline_s"] == 7.0
    with pytest.raises(ConfigError, match="no deadline"):
        plane_rows([REPO_SCENARIOS / "chapter8" / "four-requests-chunked.yaml"])


def test_bad_search_values_are_refused_before_any_simulation(tmp_path, monkeypatch):
    """A --search value the scenario cannot take (a wrong type, a layout the model refuses) is refused naming its
    configuration before the capacity search runs: with few requests that search had answered first ('the target
    still holds at 2.7e9 req/s'), hiding the bad value."""
    import sim.planning.capacity as capacity
    ran = []
    monkeypatch.setattr(capacity.Planner, "capacity", lambda *a, **k: ran.append(1) or (None, None, None, None))
    scenario = REPO_SCENARIOS / "parallel" / "llama-3.1-70b-tp4-h100.yaml"
    for value, expected in (("x", "--search configuration 0 (tp=x): "),
                            ("4,3", "--search configuration 1 (tp=3): parallel.tp: 3 does not divide")):
        with pytest.raises(ConfigError) as err:
            run_plan(scenario, tmp_path / "o", search=[f"parallel.tp={value}"], requests=20, workers=1)
        assert expected in str(err.value)
    assert not ran
