"""capsim plan --gpus: deployments of a GPU budget, ranked by goodput per GPU (sim.planning.layouts)."""

import json
import math
from pathlib import Path

import pytest

from sim.io.errors import ConfigError
from sim.planning.layouts import Layout, enumerate_deployments, rank, run_layout_plan

TP1, TP2 = Layout(1), Layout(2)

# One request at a time per replica, 1000-token prompts and 2-token outputs, step = 10 ms + 0.1 ms per
# new token: a prefill takes 110 ms, a decode 10.1 ms, so (links at 50 GB/s add 3 ms of transfer,
# overlapped with the next prefill) per replica and pool, by hand:
#   aggregated: 1 / 0.1201 s = 8.33 req/s  -> 3 replicas: 24.98 req/s
#   prefill pool: 1 / 0.110 s = 9.09 req/s; decode pool: 1 / 0.0101 s = 99 req/s
#   2 prefill : 1 decode -> min(18.18, 99) = 18.18 req/s;  1 : 2 -> min(9.09, 198) = 9.09 req/s
CASE = """name: plan-case
seed: 1
model: qwen3-8b
hardware: h100-sxm
kv: {block_tokens: 16, budget: 8GiB}
scheduler: {kind: continuous, max_num_seqs: 1, max_num_batched_tokens: 2048}
step_time:
  model: {kind: linear, constant_s: 0.010, per_new_token_s: 0.0001, per_pair_s: 0.0}
workload:
  kind: synthetic
  num_requests: 200
  arrival: {kind: constant, rate_rps: 5}
  prompt_tokens: {kind: fixed, value: 1000}
  output_tokens: {kind: fixed, value: 2}
slo: {e2e_s: 0.3}
"""


def test_deployments_of_four_gpus_are_the_hand_enumerated_ones():
    labels = [d.label for d in enumerate_deployments(4, [TP1, TP2])]
    assert labels == ["agg 4xtp1", "agg 2xtp2",
                      "disagg 1xtp1 : 3xtp1", "disagg 2xtp1 : 2xtp1", "disagg 3xtp1 : 1xtp1",
                      "disagg 2xtp1 : 1xtp2",   # 1xtp1 : 1xtp2 would leave a GPU for another prefill replica
                      "disagg 1xtp2 : 2xtp1", "disagg 1xtp2 : 1xtp2"]
    assert all(d.gpus == 4 for d in enumerate_deployments(4, [TP1, TP2]))
    assert [d.label for d in enumerate_deployments(3, [TP2], ("agg",))] == ["agg 1xtp2"]


def test_attention_data_parallel_layouts_are_searched_and_counted():
    from sim.planning.layouts import candidate_layouts, scenario_gpus
    lays = candidate_layouts(8, [1, 2], [1], [1, 4, 8], True, dp=[1, 4])
    # ep divides dp x tp, dp x tp x pp within 8 GPUs
    assert [x.describe() for x in lays] == ["tp1", "tp2", "dp4tp1", "dp4tp1ep4", "dp4tp2", "dp4tp2ep4", "dp4tp2ep8"]
    assert Layout(2, 1, 8, 4).as_dict() == {"tp": 2, "pp": 1, "ep": 8, "attention_dp": 4}
    assert [d.label for d in enumerate_deployments(8, [Layout(2, 1, 8, 4)], ("agg",))] == ["agg 1xdp4tp2ep8"]

    class Par:  # a scenario's parallel block
        tp, pp, attention_dp, gpus = 2, 1, 4, 8

    class Sc:
        disaggregation = None
        parallel = Par()

        class cluster:
            replicas = 2
    assert scenario_gpus(Sc()) == 16


def test_rank_by_goodput_per_gpu_or_per_dollar():
    rows = [{"deployment": "a", "gpus": 4, "capacity_rps": 10.0}, {"deployment": "b", "gpus": 2, "capacity_rps": 6.0},
            {"deployment": "c", "gpus": 2, "capacity_rps": None}]
    ranked = rank([dict(r) for r in rows], None)
    assert [r["deployment"] for r in ranked] == ["b", "a", "c"]
    assert ranked[0]["goodput_per_gpu_rps"] == 3.0 and ranked[1]["goodput_per_gpu_rps"] == 2.5
    priced = rank([dict(r) for r in rows], 2.0)
    assert priced[0]["requests_per_dollar"] == pytest.approx(6.0 * 3600 / (2 * 2.0))


def test_the_search_ranks_a_hand_checkable_case(tmp_path: Path):
    path = tmp_path / "case.yaml"
    path.write_text(CASE)
    res = run_layout_plan(path, tmp_path / "out", gpus=3, tp=[1], workers=1, tol=0.02)
    got = {r["deployment"]: r for r in res.rows}
    assert [r["deployment"] for r in res.rows] == ["agg 3xtp1", "disagg 2xtp1 : 1xtp1", "disagg 1xtp1 : 2xtp1"]
    for label, hand in (("agg 3xtp1", 3 / 0.1201), ("disagg 2xtp1 : 1xtp1", 2 / 0.110),
                        ("disagg 1xtp1 : 2xtp1", 1 / 0.110)):
        # within the bisection's 2% bracket and the finite run's slack (an E2E bound 0.18 s above the
        # service time, 200 requests): measured 24.84, 18.05 and 9.02 req/s
        assert got[label]["capacity_rps"] == pytest.approx(hand, rel=0.03)
        assert got[label]["goodput_per_gpu_rps"] == pytest.approx(got[label]["capacity_rps"] / 3)
    assert (tmp_path / "out" / "layouts.json").exists() and (tmp_path / "out" / "layouts.csv").exists()
    # the case's KV budget is in bytes: every layout gets 8 GiB, and the plan says so
    warned = json.loads((tmp_path / "out" / "layouts.json").read_text())["warnings"]
    assert warned == res.warnings and len(warned) == 1
    assert warned[0].startswith("kv.budget is given in bytes (8 GiB), so every layout's replica gets that much KV")


def test_layout_warnings_name_what_does_not_follow_the_layouts(tmp_path: Path, capsys):
    """A KV budget in bytes and a pool's own kv_budget are named; a utilization budget is not."""
    from sim.planning.layouts import LayoutPlan, layout_warnings, print_layout_plan
    from sim.planning.sweep import Base
    repo = Path(__file__).resolve().parents[2]
    dis = Base.load(repo / "scenarios/disagg-llama-3.1-70b-h100.yaml", ["disaggregation.decode.kv_budget=100GiB"])
    assert layout_warnings(dis.scenario()) == [
        "disaggregation.decode.kv_budget (100 GiB) is not carried to the searched layouts: each of their pools takes "
        "kv.budget"]
    assert layout_warnings(Base.load(repo / "scenarios/parallel/llama-3.1-70b-tp4-h100.yaml").scenario()) == []
    print_layout_plan(LayoutPlan("s.yaml", 4, "h100-sxm", None, [], [], None, ["one thing"]))
    assert "warning: one thing" in capsys.readouterr().out


def test_bad_budgets_and_modes_are_refused(tmp_path: Path):
    path = tmp_path / "case.yaml"
    path.write_text(CASE)
    with pytest.raises(ConfigError, match="--gpus"):
        run_layout_plan(path, tmp_path / "o", gpus=0)
    with pytest.raises(ConfigError, match="--modes"):
        run_layout_plan(path, tmp_path / "o", gpus=2, modes=("both",))
    for price in (-1.0, 0.0, math.nan, math.inf):  # (inf had ranked every deployment at 0 req/$, JSON Infinity)
        with pytest.raises(ConfigError, match="--price-per-gpu-hour: expected a finite positive price"):
            run_layout_plan(path, tmp_path / "o", gpus=2, price_per_gpu_hour=price)
    # no layout within the budget: say why (a replica larger than the budget, or ep not dividing)
    with pytest.raises(ConfigError, match=r"no layout fits 8 GPUs \(the smallest replica asked for takes 16 GPUs\)"):
        run_layout_plan(path, tmp_path / "o", gpus=8, tp=[16])


def test_layout_flags_without_gpus_an_unknown_card_and_a_bad_dask_address_are_refused(tmp_path: Path, capsys):
    """Flags plan would otherwise ignore, a card no layout can use, an address Dask cannot parse: usage errors before
    any run, never a plan that silently did something else or a traceback."""
    from capsim.cli import main
    path = tmp_path / "case.yaml"
    path.write_text(CASE)
    assert main(["plan", str(path), "--tp", "2", "--card", "h100-sxm", "--out", str(tmp_path / "a")]) == 2
    assert "error: --card, --tp: only with --gpus N" in capsys.readouterr().err
    assert main(["plan", str(path), "--gpus", "2", "--card", "nope", "--out", str(tmp_path / "b")]) == 2
    assert "error: --card: unknown hardware 'nope'; known: " in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    for gpus in ("0", "1025", "1000000000"):  # a budget past the largest searched would run for hours
        assert main(["plan", str(path), "--gpus", gpus, "--out", str(tmp_path / "e")]) == 2
        assert f"error: --gpus: expected a GPU count in 1..1,024 (the search ranks every deployment of the budget), " \
               f"got {gpus}" in capsys.readouterr().err
    for argv in (["plan", str(path), "--out", str(tmp_path / "c")],
                 ["sweep", str(path), "--grid", "scheduler.max_num_seqs=2", "--out", str(tmp_path / "d")]):
        with pytest.raises(SystemExit) as stop:
            main(argv + ["--dask", "notanaddress"])
        assert stop.value.code == 2
        assert "--dask: expected tcp://HOST:PORT (e.g. tcp://10.0.0.5:8786), got 'notanaddress'" in capsys.readouterr().err


def test_target_rps_on_a_disaggregated_scenario_points_to_gpus(tmp_path: Path):
    from sim.planning.capacity import run_plan
    path = tmp_path / "d.yaml"
    path.write_text(CASE + "disaggregation: {prefill: {replicas: 1}, decode: {replicas: 1}, link: {bandwidth_gbs: 50}}\n")
    with pytest.raises(ConfigError, match="--gpus"):
        run_plan(path, tmp_path / "o", target_rps=5.0)


def test_a_capacity_from_a_run_shorter_than_its_latency_is_flagged():
    from sim.planning.layouts import _flag_short_run
    row = {"capacity_rps": 100.0, "requests_per_run": 50, "e2e_p99_at_capacity_s": 1.0, "note": ""}
    _flag_short_run(row)
    assert row["arrival_window_s"] == 0.5 and "raise --requests" in row["note"]
    row = {"capacity_rps": 10.0, "requests_per_run": 500, "e2e_p99_at_capacity_s": 1.0, "note": ""}
    _flag_short_run(row)
    assert row["arrival_window_s"] == 50.0 and row["note"] == ""


def test_a_layout_the_cards_tables_cannot_time_is_a_problem_not_a_crash(tmp_path: Path):
    """GB200's NCCL table measures the 2 and 4 GPUs of one tray, its rack's NVLink reaches 72 and an HGX H100's
    network joins boards of 8 (sim.models.collectives); L40S states no fabric, so TP16 on it is reported with why
    (capsim plan --gpus 16 --tp 8,16 ranks the others instead of stopping at it)."""
    from sim.io.config import load_scenario
    from sim.planning.layouts import fit_problem
    path = tmp_path / "case.yaml"
    text = CASE.replace("model: {kind: linear, constant_s: 0.010, per_new_token_s: 0.0001, per_pair_s: 0.0}",
                        "model: {kind: ops}")
    refused = ("l40s/nccl.csv has no all_reduce measurement on 16 GPUs (measured: [2, 4, 8]), and l40s's hardware "
               "profile states no scale_up_gpus")
    for card, tp, want in (("gb200", 4, None), ("gb200", 8, None), ("h100-sxm", 16, None), ("l40s", 8, None),
                           ("l40s", 16, refused)):
        path.write_text(text.replace("hardware: h100-sxm", f"hardware: {card}") + f"parallel: {{tp: {tp}}}\n")
        sc, base = load_scenario(path)
        problem = fit_problem(sc, base)
        assert problem == want if want is None else want in problem


@pytest.mark.parametrize("text", ["1,,2", "1,", ",2", "1,x", "0,2"])
def test_degree_lists_refuse_empty_items_and_non_positive_values(text):
    from sim.io.errors import ConfigError
    from sim.planning.layouts import parse_degrees
    with pytest.raises(ConfigError, match=f"--tp: expected positive integers separated by commas, got '{text}'"):
        parse_degrees(text, "--tp", [1])
    assert parse_degrees("4, 2,2", "--tp", [1]) == [2, 4]


def test_a_plan_where_no_deployment_has_a_capacity_says_so(tmp_path: Path, capsys):
    """--tp 3 on a model of 32 heads: every deployment is listed with its reason, and a note says none has a
    capacity (an answer, "none", as plan without --gpus gives: exit 0)."""
    from capsim.cli import main
    path = tmp_path / "case.yaml"
    path.write_text(CASE)
    assert main(["plan", str(path), "--gpus", "3", "--tp", "3", "--modes", "agg", "--workers", "1", "--quiet",
                 "--out", str(tmp_path / "o")]) == 0
    captured = capsys.readouterr()
    assert "parallel.tp: 3 does not divide qwen3-8b's 32 attention heads" in captured.out
    assert captured.out.splitlines()[1] == ("step-time model linear: fit error unknown (the coefficients are typed "
                                            "into the scenario, not fitted)")
    saved = json.loads((tmp_path / "o" / "layouts.json").read_text())["step_time_fit"]
    assert saved["kind"] == "linear" and saved["mape"] is None
    assert "note: none of the 1 deployment(s) of 3 x h100-sxm has a capacity (each row's note says why)" \
        in captured.err
    assert (tmp_path / "o" / "layouts.json").exists()


@pytest.mark.parametrize("extra, flag", [(["--target-rps", "5"], "--target-rps"), (["--max-replicas", "64"], "--max-replicas"),
                                         (["--search", "scheduler.max_num_seqs=1,2"], "--search"),
                                         (["--start-rps", "3"], "--start-rps"),
                                         (["--step-time-error", "0.1"], "--step-time-error")])
def test_flags_of_one_deployment_are_refused_with_gpus_not_ignored(tmp_path: Path, capsys, monkeypatch, extra, flag):
    """--target-rps, --max-replicas, --search, --start-rps and --step-time-error size or search one deployment: the
    layout search used none of them and printed the same table either way. Refused before any run, naming the flag
    and what to do instead (--max-replicas even at its default value: given is given). (--report is taken: the
    layout plan's own report, tests/report/test_layouts_report.py.)"""
    from capsim.cli import main
    import sim.planning.layouts as layouts

    def no_run(*a, **k):
        raise AssertionError("a simulation ran")
    monkeypatch.setattr(layouts, "search_layouts", no_run)
    path = tmp_path / "case.yaml"
    path.write_text(CASE)
    assert main(["plan", str(path), "--gpus", "2", *extra, "--workers", "1", "--quiet",
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"error: {flag}: only without --gpus (" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_all_refused_flags_are_named_at_once_and_plain_plan_keeps_them(tmp_path: Path, capsys):
    from capsim.cli import main
    path = tmp_path / "case.yaml"
    path.write_text(CASE)
    assert main(["plan", str(path), "--gpus", "2", "--target-rps", "5", "--start-rps", "2", "--report",
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert [line.split(":")[1] for line in err] == [" --target-rps", " --start-rps"]
    # without --gpus, --max-replicas still defaults to 64 (None in the parser only so --gpus can tell it was given)
    assert main(["plan", str(path), "--target-rps", "10", "--start-rps", "5", "--replications", "1", "--tol", "0.1",
                 "--workers", "1", "--quiet", "--out", str(tmp_path / "p")]) == 0
    plan = json.loads((tmp_path / "p" / "plan.json").read_text())
    assert plan["replicas"]["max_replicas"] == 64 and plan["rates"][0]["rate_rps"] == 5.0
    capsys.readouterr()
    assert main(["plan", str(path), "--target-rps", "30", "--max-replicas", "2", "--replications", "1", "--tol", "0.1",
                 "--workers", "1", "--quiet", "--json", "--out", str(tmp_path / "q")]) == 0
    assert json.loads(capsys.readouterr().out)["replicas"]["max_replicas"] == 2


def test_gpus_refuses_an_out_folder_in_use_without_force_before_any_run(tmp_path: Path, capsys, monkeypatch):
    """plan --gpus had overwritten OUT's files without --force; now, as plan does, it refuses a folder that holds
    files before any simulation, and with --force writes all or nothing."""
    from capsim.cli import main
    import sim.planning.layouts as layouts
    path = tmp_path / "case.yaml"
    path.write_text(CASE)
    out = tmp_path / "o"
    out.mkdir()
    (out / "layouts.json").write_text("mine\n")
    search = layouts.search_layouts
    monkeypatch.setattr(layouts, "search_layouts", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran")))
    argv = ["plan", str(path), "--gpus", "2", "--tp", "1", "--modes", "agg", "--workers", "1", "--quiet",
            "--out", str(out)]
    assert main(argv) == 2
    assert f"error: --out {out}: already holds layouts.json; pass --force to overwrite" in capsys.readouterr().err
    assert (out / "layouts.json").read_text() == "mine\n" and sorted(p.name for p in out.iterdir()) == ["layouts.json"]
    assert not list(tmp_path.glob(".o.partial-*"))  # the staging folder is gone too
    monkeypatch.setattr(layouts, "search_layouts", search)
    assert main([*argv, "--force"]) == 0
    assert "wrote " + str(out / "layouts.json") in capsys.readouterr().out
    assert json.loads((out / "layouts.json").read_text())["gpu_budget"] == 2
    assert sorted(p.name for p in out.iterdir()) == ["layouts.csv", "layouts.json"]
    assert not list(tmp_path.glob(".o.partial-*"))


_LINEAR = "model: {kind: linear, constant_s: 0.010, per_new_token_s: 0.0001, per_pair_s: 0.0}"


def test_a_scenario_giving_tp_the_older_way_is_searched_as_with_parallel(tmp_path: Path):
    """`step_time.model: {kind: ops, tp: 2}` (no `parallel`) is the same replica as `parallel: {tp: 2}`: the layout
    search counts its GPUs from it (requests scaled per GPU as for the other form) and clears it where a layout is
    set (tp 4 had failed with 'step_time.model.tp: 2 differs from parallel.tp (4)')."""
    from sim.io.config import load_scenario
    from sim.planning.layouts import scenario_gpus
    new, old = tmp_path / "new.yaml", tmp_path / "old.yaml"
    new.write_text(CASE.replace(_LINEAR, "model: {kind: ops}") + "parallel: {tp: 2}\n")
    old.write_text(CASE.replace(_LINEAR, "model: {kind: ops, tp: 2}"))
    assert scenario_gpus(load_scenario(old)[0]) == scenario_gpus(load_scenario(new)[0]) == 2
    rows = {}
    for name, path in (("new", new), ("old", old)):
        res = run_layout_plan(path, tmp_path / name, gpus=4, tp=[2, 4], modes=("agg", "disagg"), workers=1, tol=0.1,
                              requests=20)
        rows[name] = [{k: r[k] for k in ("deployment", "capacity_rps", "requests_per_run", "problem")}
                      for r in res.rows]
    assert rows["old"] == rows["new"]
    assert all(r["problem"] is None and r["capacity_rps"] for r in rows["old"])
    assert {r["deployment"]: r["requests_per_run"] for r in rows["old"]}["agg 1xtp4"] == 40  # 20 on 2 GPUs -> 4


def test_a_planned_layout_keeps_what_the_base_states_beside_the_degrees():
    """plan --gpus sets each candidate's tp / pp / ep / attention_dp and keeps the base scenario's expert imbalance,
    routing skew, experts' communication and micro-batches (the pool's own, else the base's, on a disaggregated
    candidate) where the layout can take them: all-to-all needs ep > 1, micro-batches pp > 1; and a disaggregated
    base's first_token and wait_for_prefill_response."""
    from sim.planning.layouts import Deployment
    from sim.planning.sweep import Base
    repo = Path(__file__).resolve().parents[2]
    base = Base.load(repo / "scenarios/parallel/qwen3-235b-a22b-ep8-h200.yaml",
                     ["parallel.expert_imbalance=1.3", "parallel.routing_skew=0.5"])
    sc = base.scenario()
    for dep, want in ((Deployment("agg", Layout(8, 1, 8), 1), "all_to_all"),
                      (Deployment("agg", Layout(8, 1, 1), 1), "all_reduce")):
        par = base.scenario(dep.overrides(sc, True)).parallel
        assert (par.tp, par.ep, par.expert_imbalance, par.routing_skew, par.ep_communication) == (8, dep.layout.ep, 1.3,
                                                                                                 0.5, want)
    dis = base.scenario(Deployment("disagg", Layout(4, 1, 4), 1, Layout(4, 1, 1), 1).overrides(sc, True)).disaggregation
    assert (dis.prefill.parallel.ep_communication, dis.prefill.parallel.expert_imbalance) == ("all_to_all", 1.3)
    assert (dis.decode.parallel.ep_communication, dis.decode.parallel.routing_skew) == ("all_reduce", 0.5)
    # a disaggregated base's client settings reach every disaggregated candidate
    two = Base.load(repo / "scenarios/disagg-llama-3.1-70b-h100.yaml",
                    ["disaggregation.first_token=decode_step", "disaggregation.wait_for_prefill_response=true"])
    got = two.scenario(Deployment("disagg", Layout(4), 2, Layout(8), 1).overrides(two.scenario(), True)).disaggregation
    assert (got.first_token, got.wait_for_prefill_response) == ("decode_step", True)
    piped = Layout(4, 2, 1).mapping(base.scenario([("parallel", {"tp": 4, "pp": 2, "micro_batches": 4})]).parallel)
    assert piped == {"tp": 4, "pp": 2, "ep": 1, "micro_batches": 4}
    assert "micro_batches" not in Layout(8).mapping(base.scenario([("parallel", {"tp": 4, "pp": 2,
                                                                                 "micro_batches": 4})]).parallel)


def test_a_planned_layout_keeps_the_ranks_routing_where_it_has_ranks():
    """A base's parallel.attention_dp_routing reaches the candidates with attention_dp > 1 and is left out of those
    with one rank (where the scenario would refuse it)."""
    from sim.planning.sweep import Base
    repo = Path(__file__).resolve().parents[2]
    base = Base.load(repo / "scenarios/parallel/qwen3-235b-a22b-ep8-h200.yaml")
    stated = base.scenario([("parallel", {"tp": 1, "ep": 8, "attention_dp": 8,
                                          "attention_dp_routing": "random"})]).parallel
    assert Layout(1, 1, 8, 8).mapping(stated)["attention_dp_routing"] == "random"
    assert "attention_dp_routing" not in Layout(8, 1, 8).mapping(stated)


def test_a_deployment_that_never_misses_has_no_capacity_and_ranks_after_those_that_do():
    """A search that met the target at every rate it tried (a run too short to load the deployment: gpt-oss on
    4 x H100 TP1 with 120 requests met the SLOs up to 1.3e8 req/s) found a lower bound, not a capacity: the row says
    so and ranks after the deployments with one, instead of first."""
    from sim.planning.layouts import Bisection, _finish, rank
    never = {"deployment": "agg 4xtp1", "gpus": 4, "capacity_rps": None, "note": "", "requests_per_run": 240,
             "e2e_p99_at_capacity_s": 12.8}
    b = Bisection(rate=2.7e8, lo=1.342e8, hi=None, steps=24, note="stopped after 24 rates")
    _finish(never, b)
    assert never["capacity_rps"] is None and never["bracket_rps"] == [1.342e8, None]
    assert never["note"].startswith("no capacity found: the target is met at every rate tried, up to 1.342e+08 req/s "
                                    "(stopped after 24 rates; short run: 240 requests arrive within")
    found = {"deployment": "agg 2xtp2", "gpus": 4, "capacity_rps": None, "note": "", "requests_per_run": 2000,
             "e2e_p99_at_capacity_s": 1.0}
    _finish(found, Bisection(rate=800, lo=800, hi=832, steps=9))
    assert found["capacity_rps"] == 800 and found["note"] == ""
    assert [r["deployment"] for r in rank([never, found], None)] == ["agg 2xtp2", "agg 4xtp1"]
