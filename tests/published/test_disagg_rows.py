"""validate-published on disaggregated rows: the pools read from the prefill_* / decode_* columns, the
concurrency from silicon_data_source, and the replay as two pools (sim.published.disagg).

Fixture: tests/published/silicon_sample_disagg_3rows.csv holds lines 546 and 1481 (with the header)
of ../shared/data/benchmarks/aiconfigurator_silicon_sample.csv, unchanged: a DeepSeek-V3 FP8 row on
B200 (1 prefill x TP8/EP8, 4 decode x TP8/EP8, concurrency 64) and a Qwen3-32B FP8 row on H100
(8 prefill x TP1, 2 decode x TP4) whose source text states no concurrency.
"""

import csv
import dataclasses
from pathlib import Path

import pytest

from sim.io.errors import ConfigError
from sim.published.disagg import concurrency_from_source
from sim.published.engines import ENGINES
from sim.published.predict import build_case, simulate_case
from sim.published.rows import read_published

FIXTURE = Path(__file__).with_name("silicon_sample_disagg_3rows.csv")


def test_pools_and_concurrency_are_read_from_their_columns():
    ds, qwen = read_published(FIXTURE)
    assert ds.mode == "disagg" and ds.concurrency == 64
    assert (ds.prefill.workers, ds.prefill.tp, ds.prefill.moe_ep, ds.prefill.attention_dp) == (1, 8, 8, 1)
    assert (ds.decode.workers, ds.decode.tp, ds.decode.moe_ep) == (4, 8, 8)
    assert qwen.concurrency == 0  # not stated
    assert (qwen.prefill.workers, qwen.prefill.tp, qwen.decode.workers, qwen.decode.tp) == (8, 1, 2, 4)


def test_a_row_without_concurrency_is_skipped_with_the_reason():
    _, qwen = read_published(FIXTURE)
    assert "concurrency" in build_case(qwen).skipped


def test_a_bad_concurrency_names_the_column():
    with pytest.raises(ConfigError, match="silicon_data_source"):
        concurrency_from_source("x; silicon_concurrency=abc; y", "f.csv: line 3")
    assert concurrency_from_source("db; silicon_concurrency=12; m", "w") == 12


@pytest.mark.parametrize("column", ["prefill_num_workers", "decode_num_workers", "decode_tp_size"])
def test_a_zero_worker_count_or_tp_names_the_column(tmp_path, column):
    """The file leaves these empty when it does not state them (a skip with the reason); a 0 is a broken row, refused
    as an agg row's tp_size of 0 is (it had been skipped as 'not stated')."""
    with open(FIXTURE, newline="") as fh:
        rows = list(csv.DictReader(fh))
    rows[0][column] = "0.0"
    bad = tmp_path / "bad.csv"
    with open(bad, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with pytest.raises(ConfigError, match=rf"bad.csv: line 2, column {column}: expected an integer >= 1, got '0.0'"):
        read_published(bad)


def test_an_expressible_row_runs_as_two_pools():
    # the Qwen3-32B row with a concurrency of 4 given here (the file states none): exercises the replay,
    # not a validation (no error is reported from it)
    _, qwen = read_published(FIXTURE)
    row = dataclasses.replace(qwen, concurrency=4)
    case = build_case(row, per_user=3)
    d = case.scenario["disaggregation"]
    assert (d["prefill"]["replicas"], d["prefill"]["parallel"]["tp"]) == (8, 1)
    assert (d["decode"]["replicas"], d["decode"]["parallel"]["tp"]) == (2, 4)
    assert d["prefill"]["kv_budget"] > 0 and d["decode"]["kv_budget"] > d["prefill"]["kv_budget"]
    out = simulate_case(None, case)
    assert "skipped" not in out, out.get("skipped")
    assert out["ttft_ms"] > 0 and out["tpot_ms"] > 0


def test_the_pools_mix_prefill_batches_unless_asked(monkeypatch):
    """An engine that keeps prefill batches apart on agg rows (scheduler.prefill_batches: separate) does not in its
    disaggregated pools (a prefill pool runs no decodes, a decode pool no prompts) unless asked."""
    _, qwen = read_published(FIXTURE)
    row = dataclasses.replace(qwen, concurrency=4)
    monkeypatch.setitem(ENGINES, row.backend, dataclasses.replace(ENGINES[row.backend], prefill_batches="separate"))
    for how, want in (("engine", None), ("separate", "separate")):
        pools = build_case(row, per_user=3, prefill_batches=how).scenario["disaggregation"]
        if pools["prefill"]["scheduler"]["kind"] == "chunked":
            assert [pools[p]["scheduler"].get("prefill_batches") for p in ("prefill", "decode")] == [want, want]


def test_every_disagg_row_of_the_fixture_gets_a_reason_or_a_prediction():
    for row in read_published(FIXTURE):
        case = build_case(row)
        assert case.scenario is not None or case.skipped


def test_each_pool_schedules_with_its_own_attention_dp_limits():
    # TensorRT-LLM's disaggregated rows often prefill on one attention-DP worker (tp 1, dp 8) and decode on tp 8:
    # each DP rank schedules its own token budget, so the prefill pool takes 8 x the engine's budget per
    # iteration, the decode pool 1 x (before, both pools ran the decode pool's scheduler: one 8,192-token
    # prompt per prefill iteration on eight GPUs)
    from sim.published.disagg import PoolShape
    ds, _ = read_published(FIXTURE)
    row = dataclasses.replace(ds, concurrency=2, prefill=PoolShape(1, 1, 1, 8, 1, 8))
    case = build_case(row, per_user=2, pool_batch="defaults")  # the launch limits, per rank
    d = case.scenario["disaggregation"]
    assert d["prefill"]["parallel"]["attention_dp"] == 8 and "attention_dp" not in d["decode"]["parallel"]
    pre, dec = d["prefill"]["scheduler"], d["decode"]["scheduler"]
    assert pre["max_num_batched_tokens"] == 8 * dec["max_num_batched_tokens"]
    assert pre["max_num_seqs"] == 8 * dec["max_num_seqs"]
    assert case.scenario["step_time"]["allow_extrapolation"] is True  # the DP pool's MoE beyond the tables
    out = simulate_case(None, case)
    assert "skipped" not in out, out.get("skipped")


def test_sglangs_attention_dp_pools_dispatch_their_experts_as_its_recipes_do():
    """SGLang's wide-EP recipes set moe-a2a-backend deepep on their FP8 attention-DP workers and FP4 decode workers,
    not on FP4 prefill workers (sim.published.disagg.RECIPE_EP_COMMUNICATION): those pools' experts meet all-to-all;
    TensorRT-LLM's attention-DP pools always do (its NVLink kernels, below); a pool without attention DP, and vLLM's
    pools, keep the all-reduce of gathered tokens."""
    from sim.published.disagg import PoolShape
    ds, _ = read_published(FIXTURE)
    assert ds.precision == "fp8"
    wide = PoolShape(1, 1, 1, 8, 1, 8)
    row = dataclasses.replace(ds, concurrency=2, prefill=wide)
    assert ENGINES["sglang"].disagg_ep_communication == "recipes"
    for backend, precision, want in (("sglang", "fp8", ("all_to_all", None)), ("sglang", "fp4", (None, None)),
                                     ("trtllm", "fp8", ("all_to_all", None)), ("trtllm", "fp4", ("all_to_all", None)),
                                     ("vllm", "fp8", (None, None))):
        d = build_case(dataclasses.replace(row, backend=backend, precision=precision),
                       per_user=2).scenario["disaggregation"]
        got = tuple(d[p]["parallel"].get("ep_communication") for p in ("prefill", "decode"))
        assert got == want, (backend, precision)   # the decode pool here is tp 8 without attention DP
    both = dataclasses.replace(row, precision="fp4", decode=wide)
    d = build_case(both, per_user=2).scenario["disaggregation"]
    assert d["decode"]["parallel"]["ep_communication"] == "all_to_all"
    assert "ep_communication" not in d["prefill"]["parallel"]
    out = simulate_case(None, build_case(row, per_user=2))
    assert "skipped" not in out, out.get("skipped")


def test_tensorrt_llms_attention_dp_pools_take_its_nvlink_all_to_all_by_precision():
    """TensorRT-LLM's rows: NVLinkOneSided on FP4 rows, NVLinkTwoSided on FP8 rows, as its recipes run them
    (sim.published.disagg.RECIPE_ALL_TO_ALL); the other engines keep `auto`."""
    from sim.published.disagg import PoolShape
    ds, _ = read_published(FIXTURE)
    row = dataclasses.replace(ds, concurrency=2, prefill=PoolShape(1, 1, 1, 8, 1, 8))
    assert ENGINES["trtllm"].disagg_all_to_all == "recipes"
    for backend, precision, want in (("trtllm", "fp4", "nvlink_one_sided"), ("trtllm", "fp8", "nvlink_two_sided"),
                                     ("sglang", "fp8", None), ("vllm", "fp8", None)):
        sc = build_case(dataclasses.replace(row, backend=backend, precision=precision), per_user=2).scenario
        assert sc["step_time"]["model"].get("all_to_all") == want, (backend, precision)


def test_pool_batch_stated_limits_each_worker_to_the_rows_batch_sizes():
    """`--pool-batch stated`: the row's prefill_batch_size / decode_batch_size cap each worker's running requests
    (per attention-DP rank); `defaults` keeps the engine's launch limit; `decode` states the decode pool's alone;
    anything else is refused by name."""
    from sim.published.disagg import PoolShape
    ds, _ = read_published(FIXTURE)
    assert (ds.prefill.batch, ds.decode.batch) == (1, 16)
    stated = build_case(ds, per_user=2, pool_batch="stated").scenario["disaggregation"]
    defaults = build_case(ds, per_user=2, pool_batch="defaults").scenario["disaggregation"]
    assert (stated["prefill"]["scheduler"]["max_num_seqs"], stated["decode"]["scheduler"]["max_num_seqs"]) == (1, 16)
    assert defaults["prefill"]["scheduler"]["max_num_seqs"] > 16
    # the token budget is the engine's either way
    assert stated["prefill"]["scheduler"]["max_num_batched_tokens"] == defaults["prefill"]["scheduler"][
        "max_num_batched_tokens"]
    dp = dataclasses.replace(ds, prefill=PoolShape(1, 1, 1, 8, 1, 8, 2))
    assert build_case(dp, pool_batch="stated").scenario["disaggregation"]["prefill"]["scheduler"]["max_num_seqs"] == 16
    # `decode`: the stated batch on the decode pool, the launch limit on the prefill pool
    decode = build_case(ds, per_user=2, pool_batch="decode").scenario["disaggregation"]
    assert decode["decode"]["scheduler"] == stated["decode"]["scheduler"]
    assert decode["prefill"]["scheduler"] == defaults["prefill"]["scheduler"]
    with pytest.raises(ConfigError, match="pool_batch"):
        build_case(ds, pool_batch="rows")


def test_pool_batch_flag_reaches_the_report_and_refuses_other_values(tmp_path):
    from tests.published.test_validate_published import capsim
    with pytest.raises(SystemExit) as exc:  # argparse refuses it, naming the flag and the choices
        capsim("validate-published", str(FIXTURE), "--pool-batch", "rows")
    assert exc.value.code == 2
    # the Qwen row only (skipped: no concurrency), so nothing is simulated (exit 1, said); the choice is recorded
    code, _, err = capsim("validate-published", str(FIXTURE), "--system", "h100_sxm", "--pool-batch", "stated",
                          "--workers", "1", "--no-progress", "--out", str(tmp_path))
    assert code == 1 and "none of the 1 selected rows could be simulated" in err
    import json
    assert json.loads((tmp_path / "report.json").read_text())["pool_batch"] == "stated"


def test_frontend_hops_counts_the_front_end_per_engine_rule(tmp_path):
    """benchmarks/disagg_frontend_hops.py: a TensorRT-LLM row whose measured TTFT holds its front end twice is exact
    under `twice_sequential` and `twice`; an SGLang row holding it once is exact under `once` and the rule, and
    `twice` counts it again; agg rows take no part."""
    import importlib.util
    import json
    spec = importlib.util.spec_from_file_location(
        "disagg_frontend_hops", Path(__file__).parents[2] / "benchmarks" / "disagg_frontend_hops.py")
    hops = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hops)
    rows = [{"line": 2, "mode": "disagg", "backend": "trtllm", "frontend_ms": 100.0,
             "predicted": {"ttft_ms": 500.0}, "measured": {"ttft_ms": 600.0}},
            {"line": 3, "mode": "disagg", "backend": "sglang", "frontend_ms": 100.0,
             "predicted": {"ttft_ms": 500.0}, "measured": {"ttft_ms": 500.0}},
            {"line": 4, "mode": "agg", "backend": "trtllm", "predicted": {"ttft_ms": 1.0}, "measured": {"ttft_ms": 9.0}},
            # a vLLM row whose replay already counted its front end twice (frontend_hops): 2 x 50 ms in its 600 ms
            {"line": 5, "mode": "disagg", "backend": "vllm", "frontend_ms": 100.0, "frontend_hops": 2,
             "predicted": {"ttft_ms": 600.0}, "measured": {"ttft_ms": 600.0}}]
    (tmp_path / "report.json").write_text(json.dumps({"rows": rows}))
    out = {(r["rule"], r["part"]): (r["n"], r["median"]) for r in hops.hops_table(str(tmp_path / "report.json"))}
    assert out[("once", "trtllm")] == (1, pytest.approx(1 / 6)) and out[("once", "sglang")] == (1, 0.0)
    assert out[("twice_sequential", "trtllm")] == (1, 0.0) and out[("twice_sequential", "sglang")] == (1, 0.0)
    assert out[("twice", "sglang")] == (1, pytest.approx(0.2)) and out[("none", "sglang")] == (1, pytest.approx(0.2))
    assert out[("once", "even lines")] == (1, pytest.approx(1 / 6))
    assert out[("twice_sequential", "vllm")] == (1, 0.0) and out[("once", "vllm")] == (1, pytest.approx(50 / 600))
    assert out[("none", "vllm")] == (1, pytest.approx(100 / 600))
    (tmp_path / "agg.json").write_text(json.dumps({"rows": [rows[2]]}))  # no disaggregated row: said, exit status 1
    assert hops.hops_table(str(tmp_path / "agg.json")) == [] and hops.main([str(tmp_path / "agg.json")]) == 1


def test_disagg_frontend_hops_host_scale_multiplies_the_front_end_on_the_named_cards_only(tmp_path):
    """benchmarks/disagg_frontend_hops.py --host-scale: the front end a row's replay counted, times K on the rows of
    the named cards (a GB200 row 100 ms short of its measurement with 50 ms of front end is exact at K = 3), the other
    cards' rows as they are; per engine and half, then all rows, each with its rows within 20%."""
    import importlib.util
    import json
    spec = importlib.util.spec_from_file_location(
        "disagg_frontend_hops", Path(__file__).parents[2] / "benchmarks" / "disagg_frontend_hops.py")
    hops = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hops)
    rows = [{"line": 2, "mode": "disagg", "backend": "sglang", "system": "gb200", "frontend_ms": 50.0,
             "predicted": {"ttft_ms": 400.0}, "measured": {"ttft_ms": 500.0}},
            {"line": 4, "mode": "disagg", "backend": "sglang", "system": "b200_sxm", "frontend_ms": 50.0,
             "predicted": {"ttft_ms": 500.0}, "measured": {"ttft_ms": 500.0}},
            {"line": 3, "mode": "agg", "backend": "sglang", "system": "gb200", "frontend_ms": 50.0,
             "predicted": {"ttft_ms": 1.0}, "measured": {"ttft_ms": 9.0}}]
    (tmp_path / "report.json").write_text(json.dumps({"rows": rows}))
    out = {(r["engine"], r["half"], r["scale"]): (r["n"], r["median"], r["within_20"])
           for r in hops.host_scale_table(str(tmp_path / "report.json"), 3.0, ("gb200",))}
    assert out[("sglang", "even", 1.0)] == (2, pytest.approx(0.1), 2)
    assert out[("sglang", "even", 3.0)] == (2, 0.0, 2)
    assert out[("all", "both", 3.0)] == (2, 0.0, 2)
    assert not any(half == "odd" for _, half, _ in out)
    rows[0]["predicted"]["ttft_ms"] = 200.0  # 60% short: out of 20% as it is, 40% short at K = 3
    (tmp_path / "report.json").write_text(json.dumps({"rows": rows}))
    out = {(r["engine"], r["scale"]): r["within_20"]
           for r in hops.host_scale_table(str(tmp_path / "report.json"), 3.0, ("gb200",)) if r["half"] == "even"}
    assert out[("sglang", 1.0)] == 1 and out[("sglang", 3.0)] == 1
    assert hops.main([str(tmp_path / "report.json"), "--host-scale", "3"]) == 0
    with pytest.raises(SystemExit):
        hops.main([str(tmp_path / "report.json"), "--host-scale", "0"])


def test_first_token_follows_each_engines_code_unless_asked():
    """`--first-token engine`: where the client's first token comes from is the row's engine's (vLLM decode_recompute,
    SGLang decode_admission, TensorRT-LLM decode_step); one value for every row when given; others refused by name."""
    ds, qwen = read_published(FIXTURE)
    row = dataclasses.replace(qwen, concurrency=4)
    for backend, mode in (("vllm", "decode_recompute"), ("trtllm", "decode_step"), ("sglang", "decode_admission")):
        case = build_case(dataclasses.replace(row, backend=backend), per_user=2)
        assert case.scenario["disaggregation"]["first_token"] == mode
        assert build_case(dataclasses.replace(row, backend=backend), per_user=2,
                          first_token="prefill").scenario["disaggregation"]["first_token"] == "prefill"
    with pytest.raises(ConfigError, match="first_token"):
        build_case(ds, first_token="router")
    # the decode pool's first iteration comes after the prefill: TTFT grows, TPOT barely moves
    at_prefill = simulate_case(None, build_case(row, per_user=2, first_token="prefill"))
    at_decode = simulate_case(None, build_case(row, per_user=2, first_token="decode_step"))
    assert at_decode["ttft_ms"] > at_prefill["ttft_ms"]
    assert at_decode["tpot_ms"] == pytest.approx(at_prefill["tpot_ms"], rel=0.2)


def test_disagg_first_token_compares_two_replays_and_chooses_on_even_lines(tmp_path):
    """benchmarks/disagg_compare.py: per engine the replay with the lower median |TTFT error| on the even lines is
    chosen (a tie keeps the first, `prefill`); the totals take each row from its engine's choice; agg rows and rows one
    replay skipped take no part."""
    import importlib.util
    import json
    spec = importlib.util.spec_from_file_location(
        "disagg_compare", Path(__file__).parents[2] / "benchmarks" / "disagg_compare.py")
    ft = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ft)

    def row(i, line, backend, ttft, mode="disagg"):
        return {"id": i, "line": line, "mode": mode, "backend": backend, "system": "gb200",
                "predicted": {"ttft_ms": ttft, "tpot_ms": 10.0}, "measured": {"ttft_ms": 100.0, "tpot_ms": 10.0}}
    before = [row("a", 2, "vllm", 50.0), row("b", 3, "vllm", 50.0), row("c", 2, "trtllm", 90.0),
              row("d", 3, "trtllm", 90.0), row("e", 4, "vllm", 1.0, mode="agg")]
    after = [row("a", 2, "vllm", 80.0), row("b", 3, "vllm", 70.0), row("c", 2, "trtllm", 110.0),
             row("d", 3, "trtllm", 100.0), row("e", 4, "vllm", 1.0, mode="agg")]
    for name, rows in (("before", before), ("after", after)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "report.json").write_text(json.dumps({"rows": rows}))
    out = ft.compare(str(tmp_path / "before" / "report.json"), str(tmp_path / "after" / "report.json"))
    assert out["chosen"] == {"trtllm": "before", "vllm": "after"}  # trtllm: 10% either way, a tie
    groups = {g["group"]: g for g in out["groups"]}
    assert groups["vllm"]["n"] == 2 and groups["vllm"]["before_ttft"] == (pytest.approx(0.5), pytest.approx(-0.5))
    assert groups["odd lines"]["after_ttft"][0] == pytest.approx(0.15)  # vllm -30%, trtllm 0%
    assert out["totals"]["odd lines"]["ttft"] == pytest.approx(0.2)   # vllm -30% (after), trtllm -10% (before)
    assert out["totals"]["all"]["ttft"] == pytest.approx(0.15)


@pytest.mark.parametrize("backend, phases", [("vllm", "random"), ("trtllm", "random"), ("sglang", "even")])
def test_a_disaggregated_rows_steady_state_takes_its_engines_disagg_phases(monkeypatch, backend, phases):
    """EngineDefaults.disagg_steady_phases (chosen on the disaggregated rows' even lines) reaches every
    steady-state run of the two pools; --phases overrides it."""
    from sim.published import predict
    _, qwen = read_published(FIXTURE)
    row = dataclasses.replace(qwen, concurrency=4, backend=backend)
    assert ENGINES[backend].disagg_steady_phases == phases
    case = build_case(row, per_user=3)
    assert case.phases == phases and build_case(row, per_user=3, phases="even").phases == "even"
    seen = []
    real = predict._run
    monkeypatch.setattr(predict, "_run", lambda sc, source: seen.append(sc["workload"]) or real(sc, source))
    predict.steady_state(case, "test")
    assert seen and all(w.get("ramp_phases", "even") == phases for w in seen)


def test_a_disaggregated_row_under_the_fixed_client_is_replayed_as_dynamos_benchmark_with_its_cohort_broken_up():
    """The fixed client (sim.published.client) on a disaggregated row: DISAGG_ROUNDS (Dynamo's max(3c, 10)
    requests) and EngineDefaults.disagg_later_waves (`spread` for every engine, SGLang too, whose agg rows keep a
    cohort): the cold first wave weighs 1 / 3 at 4 users."""
    from sim.published.engines import ENGINES
    from sim.published.predict import combine_cold
    _, qwen = read_published(FIXTURE)
    row = dataclasses.replace(qwen, concurrency=4, backend="sglang")
    assert ENGINES["sglang"].later_waves == "cohort" and ENGINES["sglang"].disagg_later_waves == "spread"
    case = build_case(row, per_user=3, client="fixed")
    assert case.rounds == 3
    out = simulate_case(None, case)
    first, steady = out["components"]["first_wave"], out["components"]["steady"]
    assert out["ttft_ms"] == pytest.approx((first["ttft_ms"] + 2 * steady["ttft_ms"]) / 3 + out["frontend_ms"])
    assert out["tpot_ms"] == pytest.approx(combine_cold(first, steady, 3, "spread")["tpot_ms"])
    assert build_case(row, per_user=3, rounds=10, client="fixed").rounds == 10


def test_a_layouts_collectives_are_checked_in_the_tables_the_step_time_uses():
    """The replay skips a row whose collectives its card's tables do not measure and its fabric does not reach
    (sim.models.collectives), checking the all-reduce in the engine's own table when the engine's choice is its own
    (GB300 measures TensorRT-LLM's on 8 GPUs, NCCL's on 2 and 4; its NVL72 rack reaches 72) and the logits'
    all-gather under tp in NCCL's."""
    from sim.models.parallel import Layout
    from sim.published.predict import _collectives_missing
    assert _collectives_missing("gb300", Layout(tp=4, ep=4), "trtllm") is None
    assert _collectives_missing("b200", Layout(tp=8, ep=8), "trtllm") is None
    for card in ("gb300", "gb200"):   # beyond the tray's measurements, within the rack's NVLink
        for whose in ("nccl", "trtllm"):
            assert _collectives_missing(card, Layout(tp=8, ep=8), whose) is None
    assert _collectives_missing("b200", Layout(tp=8, attention_dp=8, ep=64), "sglang") is None  # 8 boards of 8
    why = _collectives_missing("l40s", Layout(tp=16), "nccl")
    assert why.startswith("tp16: all_reduce over 16 GPUs, which the l40s tables do not measure nor its fabric reach (")
    assert "(measured: [2, 4, 8]), and l40s's hardware profile states no scale_up_gpus" in why


def test_a_disaggregated_rows_front_end_counts_the_users_of_one_decode_worker():
    """The engine's front end (base + per user x users, fitted on agg rows, where one serving process holds every user)
    counts, on a disaggregated row, the users of one decode worker: concurrency / decode_num_workers
    (frontend_users `decode_worker`, vLLM's default)."""
    from sim.published.engines import ENGINES
    _, qwen = read_published(FIXTURE)
    workers = qwen.decode.workers
    assert workers > 1
    for backend in ("trtllm", "vllm"):
        base, per_user = ENGINES[backend].frontend_ms
        hops = ENGINES[backend].disagg_frontend_hops
        assert per_user > 0
        row = dataclasses.replace(qwen, concurrency=8 * workers, backend=backend)
        case = build_case(row, per_user=3, frontend_users="decode_worker")
        assert case.frontend_s == pytest.approx(hops * (base + per_user * 8) / 1e3)
        one = dataclasses.replace(row, decode=dataclasses.replace(row.decode, workers=1))
        assert build_case(one, per_user=3, frontend_users="decode_worker").frontend_s == pytest.approx(
            hops * (base + per_user * 8 * workers) / 1e3)
    assert ENGINES["vllm"].disagg_frontend_users == "decode_worker"
    row = dataclasses.replace(qwen, concurrency=8 * workers, backend="vllm")
    assert build_case(row, per_user=3).frontend_s == build_case(row, per_user=3, frontend_users="decode_worker").frontend_s


def test_tensorrt_llms_disaggregated_front_end_counts_a_decode_workers_users_unless_asked(tmp_path):
    """EngineDefaults.disagg_frontend_users: TensorRT-LLM `decode_worker` since the rows replay as their recorded
    client (it had been `none` under the earlier one): its per-user term counts one decode worker's users, `none`
    leaves the base time alone at any concurrency; agg rows keep the term over all their users; `frontend_users`
    reaches report.json and other values are refused by name."""
    from sim.published.engines import ENGINES
    from sim.published.report import validate_published
    _, qwen = read_published(FIXTURE)
    base, per_user = ENGINES["trtllm"].frontend_ms
    assert ENGINES["trtllm"].disagg_frontend_users == "decode_worker" and per_user > 0
    for users in (4, 4096):
        row = dataclasses.replace(qwen, concurrency=users, backend="trtllm")
        per_worker = users / row.decode.workers
        assert build_case(row, per_user=3).frontend_s == pytest.approx((base + per_user * per_worker) / 1e3)
        assert build_case(row, per_user=3, frontend_users="none").frontend_s == pytest.approx(base / 1e3)
    d = qwen.decode
    agg = dataclasses.replace(qwen, mode="agg", concurrency=64, backend="trtllm", tp=d.tp, pp=d.pp,
                              attention_dp=d.attention_dp, moe_tp=d.moe_tp, moe_ep=d.moe_ep)
    assert build_case(agg, per_user=3).frontend_s == pytest.approx((base + per_user * 64) / 1e3)
    with pytest.raises(ConfigError, match="frontend_users: expected one of engine, decode_worker, none"):
        build_case(dataclasses.replace(qwen, backend="trtllm"), frontend_users="all")
    assert "no per-user term on disaggregated rows" not in ENGINES["trtllm"].describe()
    report = validate_published(FIXTURE, mode="disagg", per_user=2, frontend_users="none", backend="sglang",
                                client="fixed")
    assert report["frontend_users"] == "none"


def test_only_sglangs_client_waits_for_the_prefill_servers_answer_unless_asked(tmp_path):
    """EngineDefaults.disagg_prefill_response: SGLang `wait` (its router starts the stream once both servers have
    answered), the others `at_once`; `prefill_response` sets one value for every row, reaches report.json, and other
    values are refused by name."""
    from sim.published.report import validate_published
    ds, qwen = read_published(FIXTURE)
    row = dataclasses.replace(qwen, concurrency=4)
    for backend, waits in (("sglang", True), ("vllm", False), ("trtllm", False)):
        sc = build_case(dataclasses.replace(row, backend=backend), per_user=2).scenario
        assert sc["disaggregation"].get("wait_for_prefill_response", False) is waits
        for value, want in (("wait", True), ("at_once", False)):
            sc = build_case(dataclasses.replace(row, backend=backend), per_user=2, prefill_response=value).scenario
            assert sc["disaggregation"].get("wait_for_prefill_response", False) is want
    with pytest.raises(ConfigError, match="prefill_response: expected one of engine, at_once, wait, got 'router'"):
        build_case(ds, prefill_response="router")
    report = validate_published(FIXTURE, mode="disagg", per_user=2, prefill_response="at_once", client="fixed")
    assert report["prefill_response"] == "at_once"


def test_every_engines_workers_keep_their_launch_limits_unless_asked():
    """EngineDefaults.disagg_pool_batch: every engine's pools keep its launch limits (a row's stated batch sizes are
    its concurrency divided over the decode slots, not the engine's limit); `pool_batch` overrides it."""
    ds, _ = read_published(FIXTURE)
    stated = build_case(ds, per_user=2, pool_batch="stated").scenario["disaggregation"]
    defaults = build_case(ds, per_user=2, pool_batch="defaults").scenario["disaggregation"]
    assert stated["decode"]["scheduler"] != defaults["decode"]["scheduler"]
    limit = lambda d: (d["prefill"]["scheduler"]["max_num_seqs"], d["decode"]["scheduler"]["max_num_seqs"])  # noqa: E731
    for backend in ("sglang", "vllm", "trtllm"):
        assert ENGINES[backend].disagg_pool_batch == "defaults"
        row = dataclasses.replace(ds, backend=backend)
        got = limit(build_case(row, per_user=2).scenario["disaggregation"])
        assert got == limit(build_case(row, per_user=2, pool_batch="defaults").scenario["disaggregation"])
        assert got != limit(build_case(row, per_user=2, pool_batch="stated").scenario["disaggregation"])


def test_vllms_disaggregated_front_end_counts_twice_and_the_report_says_so():
    """EngineDefaults.disagg_frontend_hops: vLLM's proxy passes a request through two API servers in series, so its
    disaggregated rows add the front end twice and their report rows carry frontend_hops = 2; other engines once."""
    from sim.published.engines import ENGINES
    from sim.published.predict import frontend_latency_s
    from sim.published.report import _record
    _, qwen = read_published(FIXTURE)
    row = dataclasses.replace(qwen, concurrency=4)
    assert [ENGINES[b].disagg_frontend_hops for b in ("vllm", "sglang", "trtllm")] == [2, 1, 1]
    case = build_case(row, per_user=2)
    one = frontend_latency_s("engine", "vllm", 4 / row.decode.workers)
    assert case.frontend_hops == 2 and case.frontend_s == pytest.approx(2 * one)
    rec = _record(row, simulate_case(None, case))
    assert rec["frontend_hops"] == 2 and rec["frontend_ms"] == pytest.approx(2e3 * one)
    sglang = build_case(dataclasses.replace(row, backend="sglang"), per_user=2)
    assert sglang.frontend_hops == 1


def test_mla_kernels_reach_both_pools_step_time():
    """--mla-kernels: `own` gives an SGLang row SGLang's measured MLA kernels (the step time both pools share),
    `composed` none (the composition is the model's default, so the key is left out), and a vLLM row, whose engine
    has no MLA kernel table, the composition."""
    ds, qwen = read_published(FIXTURE)
    for how, want in (("engine", "sglang"), ("own", "sglang"), ("trtllm", "trtllm"), ("composed", None)):
        case = build_case(ds, per_user=2, mla_kernels=how)
        assert "step_time" not in case.scenario["disaggregation"]["decode"]
        assert case.scenario["step_time"]["model"].get("mla_kernels") == want
    vllm = build_case(dataclasses.replace(qwen, concurrency=4), per_user=2, mla_kernels="own").scenario
    assert "mla_kernels" not in vllm["step_time"]["model"]


def test_attention_dp_routing_binds_the_chosen_pools_ranks(tmp_path):
    """`attention_dp_routing` (`--attention-dp-routing`) sets parallel.attention_dp_routing on every pool of more than
    one attention-DP rank (`attention_dp_pools` both), on the prefill pool alone (`prefill`), and leaves the engine's
    shared queue by default; the bound pools simulate; bad values are refused by name, and the flags reach the report."""
    from sim.published.disagg import PoolShape
    ds, _ = read_published(FIXTURE)
    row = dataclasses.replace(ds, concurrency=4, prefill=PoolShape(1, 1, 1, 8, 1, 8, 1),
                              decode=PoolShape(1, 1, 1, 8, 1, 8, 2))
    routing = lambda case, pool: case.scenario["disaggregation"][pool]["parallel"].get("attention_dp_routing")  # noqa
    default = build_case(row, per_user=2)
    assert routing(default, "prefill") is None and routing(default, "decode") is None
    both = build_case(row, per_user=2, attention_dp_routing="random")
    assert routing(both, "prefill") == routing(both, "decode") == "random"
    pre = build_case(row, per_user=2, attention_dp_routing="random", attention_dp_pools="prefill")
    assert routing(pre, "prefill") == "random" and routing(pre, "decode") is None
    tp_decode = build_case(dataclasses.replace(row, decode=ds.decode), per_user=2, attention_dp_routing="round_robin")
    assert "attention_dp" not in tp_decode.scenario["disaggregation"]["decode"]["parallel"]
    assert routing(tp_decode, "decode") is None  # one rank: nothing to bind
    out = simulate_case(None, both)
    assert "skipped" not in out, out.get("skipped")
    with pytest.raises(ConfigError, match="attention_dp_routing: expected one of engine, shared_queue"):
        build_case(row, attention_dp_routing="busiest")
    with pytest.raises(ConfigError, match="attention_dp_pools: expected one of both, prefill, decode"):
        build_case(row, attention_dp_routing="random", attention_dp_pools="all")
    from tests.published.test_validate_published import capsim
    code, _, err = capsim("validate-published", str(FIXTURE), "--system", "h100_sxm", "--attention-dp-routing",
                          "random", "--attention-dp-pools", "prefill", "--workers", "1", "--no-progress", "--out",
                          str(tmp_path))
    import json
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["attention_dp_routing"], report["attention_dp_pools"]) == ("random", "prefill")
