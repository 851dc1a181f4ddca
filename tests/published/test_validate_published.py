"""capsim validate-published on a 10-row cut of AIConfigurator's silicon sample.

Fixture: tests/published/silicon_sample_10rows.csv holds lines 1201, 1388, 812, 556, 2, 1383, 2807, 2804, 33
and 386 (with the header) of ../shared/data/benchmarks/aiconfigurator_silicon_sample.csv (github
ai-dynamo/aiconfigurator, aic-core/src/aiconfigurator_core/systems/silicon_sample.csv at commit 095f58a5,
Apache-2.0), unchanged: three single-replica dense rows on H100 (TensorRT-LLM, vLLM, SGLang) and seven
rows capsim cannot express yet, each for a different reason.
"""

import csv
import io
import json
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from capsim.cli import main

FIXTURE = Path(__file__).with_name("silicon_sample_10rows.csv")


def capsim(*args):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def report():
    code, out, err = capsim("validate-published", str(FIXTURE), "--json", "--workers", "1", "--no-progress")
    assert code == 0, err
    return json.loads(out)


def test_json_contract_rows_and_summary(report):
    assert set(report) >= {"rows", "summary"}
    rows = report["rows"]
    with FIXTURE.open() as fh:
        ids = [r["id"] for r in csv.DictReader(fh)]
    assert [r["id"] for r in rows] == ids
    for r in rows:
        assert set(r["measured"]) == {"ttft_ms", "tpot_ms"}
        if "skipped" in r:
            assert isinstance(r["skipped"], str) and r["skipped"] and "predicted" not in r
        else:
            assert set(r["predicted"]) == {"ttft_ms", "tpot_ms"}
            assert all(v > 0 and np.isfinite(v) for v in r["predicted"].values())
            assert set(r["derived"]) == {"e2e_ms"}
    assert set(report["derived"]) == {"e2e_ms"}
    for s in report["summary"]:
        assert set(s) == {"system", "backend", "mode", "metric", "n", "median_abs_error", "p90_abs_error"}


def test_summary_is_recomputable_from_the_rows(report):
    groups = {}
    for r in report["rows"]:
        if "predicted" in r:
            for m in ("ttft_ms", "tpot_ms"):
                err = abs(r["predicted"][m] - r["measured"][m]) / r["measured"][m]
                groups.setdefault((r["system"], r["backend"], r["mode"], m), []).append(err)
            d = r["derived"]["e2e_ms"]
            err = abs(d["predicted"] - d["measured"]) / d["measured"]
            groups.setdefault((r["system"], r["backend"], r["mode"], "e2e_ms"), []).append(err)
    assert len(report["summary"]) == len(groups)
    for s in report["summary"]:
        e = groups[(s["system"], s["backend"], s["mode"], s["metric"])]
        assert s["n"] == len(e)
        assert s["median_abs_error"] == pytest.approx(np.median(e))
        assert s["p90_abs_error"] == pytest.approx(np.percentile(e, 90))


def test_e2e_is_derived_from_the_files_ttft_tpot_and_osl_alike_for_the_prediction(report):
    with FIXTURE.open() as fh:
        raw = {r["id"]: r for r in csv.DictReader(fh)}
    predicted = [r for r in report["rows"] if "predicted" in r]
    assert predicted
    for r in predicted:
        osl = int(raw[r["id"]]["osl"])
        d = r["derived"]["e2e_ms"]
        assert d["measured"] == pytest.approx(float(raw[r["id"]]["silicon_ttft_ms"])
                                              + (osl - 1) * float(raw[r["id"]]["silicon_tpot_ms"]))
        assert d["predicted"] == pytest.approx(r["predicted"]["ttft_ms"] + (osl - 1) * r["predicted"]["tpot_ms"])
        assert d["error"] == pytest.approx(d["predicted"] / d["measured"] - 1)


def test_expressible_rows_are_predicted_and_the_others_say_why(report):
    by_id = {r["id"]: r for r in report["rows"]}
    predicted = [r for r in report["rows"] if "predicted" in r]
    assert {r["backend"] for r in predicted} == {"trtllm", "vllm", "sglang"}
    # B200 FP8: its FP8 GEMM table; B300: the tables benchmarks/aiconfigurator_cards.py converts from the wheel
    assert {r["system"] for r in predicted} == {"h100_sxm", "b200_sxm", "b300_sxm"}
    # the decode step of a dense model is memory-bound and well measured: TPOT lands near the measurement (not the
    # gpt-oss H100 TensorRT-LLM row: 192 users on a batch of 48, TPOT 19 ms predicted against 49 ms measured)
    for r in predicted:
        if "gpt-oss" not in r["model"]:
            assert 0.5 < r["predicted"]["tpot_ms"] / r["measured"]["tpot_ms"] < 2.0
    assert "predicted" in by_id[next(i for i in by_id if i.startswith("openai_gpt_oss_120b"))]
    reasons = {rid: r["skipped"] for rid, r in by_id.items() if "skipped" in r}
    assert len(reasons) == 1   # the B200 FP4 row is replayed with the NVFP4 tables, gpt-oss with its profile
    assert "less than one request needs" in next(iter(reasons.values()))
    # replicas over two HGX boards (attention dp 4 x tp 4 on B300; a disaggregated H100 prefill pool at dp 16), whose
    # collectives the one-node tables do not measure, take them from the card's fabric (sim.models.collectives)
    assert "predicted" in by_id["minimaxm2_5_b300_vllm_fp8_agg_8192x1024_c128_cfg733"]
    assert "predicted" in by_id["dsr1_h100_trtllm_fp8_disagg_8192x1024_c6_cfg494"]


def test_a_row_of_a_model_without_a_profile_says_so():
    from sim.published.predict import build_case
    from sim.published.rows import read_published
    row = next(r for r in read_published(FIXTURE) if r.model_path == "openai/gpt-oss-120b")
    case = build_case(replace(row, model_path="zai-org/GLM-5"))
    assert case.skipped == "no model profile for 'zai-org/GLM-5'"


def test_deterministic_and_filters():
    args = ("validate-published", str(FIXTURE), "--json", "--workers", "1", "--no-progress", "--backend", "vllm")
    a, b = capsim(*args), capsim(*args)
    assert a[0] == 0 and a[1] == b[1]
    rows = json.loads(a[1])["rows"]
    assert rows and all(r["backend"] == "vllm" for r in rows)
    code, out, _ = capsim("validate-published", str(FIXTURE), "--json", "--workers", "1", "--no-progress",
                          "--system", "b300_sxm", "--mode", "agg")
    rows = json.loads(out)["rows"]
    assert code == 0 and len(rows) == 2 and all(r["system"] == "b300_sxm" for r in rows)
    assert all("predicted" in r for r in rows)   # the second spans two boards (16 GPUs in one collective)


def test_out_dir_and_table(tmp_path):
    args = ("validate-published", str(FIXTURE), "--workers", "1", "--no-progress", "--backend", "trtllm",
            "--out", str(tmp_path / "res"))
    code, out, err = capsim(*args)
    assert code == 0, err
    assert "median |err|" in out and "trtllm (" in out
    written = {p.name for p in (tmp_path / "res").iterdir()}
    assert written == {"report.json", "rows.csv", "summary.csv"}
    with (tmp_path / "res" / "rows.csv").open() as fh:
        lines = list(csv.DictReader(fh))
    # one line per row and metric: ttft_ms, tpot_ms and e2e_ms for each of the 3 rows (all predicted)
    assert len(lines) == 3 * 3
    e2e = [r for r in lines if r["metric"] == "e2e_ms"]
    assert len(e2e) == 3
    by_metric = {r["metric"]: r for r in lines if r["id"] == e2e[0]["id"]}
    for side in ("measured", "predicted"):  # the same rule on both sides, from the row's own ttft and tpot lines
        assert float(e2e[0][side]) == pytest.approx(float(by_metric["ttft_ms"][side])
                                                    + (int(e2e[0]["osl"]) - 1) * float(by_metric["tpot_ms"][side]))
    with (tmp_path / "res" / "summary.csv").open() as fh:
        assert {r["metric"] for r in csv.DictReader(fh)} == {"ttft_ms", "tpot_ms", "e2e_ms"}
    assert "e2e_ms is derived: ttft_ms + (osl - 1) x tpot_ms" in out and "      e2e_ms" in out.splitlines()[0]
    # a second run into the same folder needs --force, refused before any row runs
    (tmp_path / "res" / "report.json").write_text("mine")
    code, _, err = capsim(*args)
    assert code == 2 and "already holds report.json, rows.csv, summary.csv; pass --force" in err
    assert (tmp_path / "res" / "report.json").read_text() == "mine"
    code, _, err = capsim(*args, "--force")
    assert code == 0, err
    assert json.loads((tmp_path / "res" / "report.json").read_text())["rows"]


@pytest.mark.parametrize("flag, value, words", [
    ("--seed", "-1", "expected an integer in 0..4,294,967,295, got '-1'"),
    ("--seed", "99999999999999999999", "expected an integer in 0..4,294,967,295"),
    ("--requests-per-user", "1000000", "--requests-per-user: expected an integer in 2..1000"),
    ("--requests-per-user", "1", "--requests-per-user: expected an integer in 2..1000"),
])
def test_out_of_range_flags_are_named(capsys, flag, value, words):
    try:
        code = main(["validate-published", str(FIXTURE), "--workers", "1", "--no-progress", flag, value])
    except SystemExit as stop:  # argparse's own usage error
        code = stop.code
    assert code == 2 and words in capsys.readouterr().err


def _copy_with(tmp_path, line: int, column: str, value: str) -> Path:
    with FIXTURE.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
        header = list(rows[0])
    rows[line - 2][column] = value
    path = tmp_path / "bad.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, header, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return path


@pytest.mark.parametrize("column,value,expected", [
    ("isl", "abc", "expected an integer >= 1, got 'abc'"),
    ("batch_size", "8.5", "expected an integer >= 1, got '8.5'"),
    ("silicon_tpot_ms", "-3", "expected a positive number, got '-3'"),
    ("backend", "tgi", "expected one of vllm, sglang, trtllm, got 'tgi'"),
])
def test_malformed_row_names_line_and_column(tmp_path, column, value, expected):
    path = _copy_with(tmp_path, 4, column, value)
    code, out, err = capsim("validate-published", str(path), "--workers", "1", "--no-progress")
    assert code == 2 and out == ""
    assert f"{path}: line 4, column {column}: {expected}" in err
    assert "Traceback" not in err


def test_missing_column_and_ragged_row(tmp_path):
    text = FIXTURE.read_text().splitlines()
    path = tmp_path / "nocol.csv"
    path.write_text("\n".join([text[0].replace("silicon_ttft_ms", "ttft")] + text[1:]) + "\n")
    code, _, err = capsim("validate-published", str(path), "--no-progress")
    assert code == 2 and f"{path}: line 1: missing column(s) silicon_ttft_ms" in err
    path = tmp_path / "ragged.csv"
    path.write_text("\n".join(text[:3] + [text[3] + ",extra"] + text[4:]) + "\n")
    code, _, err = capsim("validate-published", str(path), "--no-progress")
    assert code == 2 and f"{path}: line 4: " in err and "fields, the header has" in err
    code, _, err = capsim("validate-published", str(tmp_path / "none.csv"), "--no-progress")
    assert code == 2 and "file not found" in err


THROUGHPUT = Path(__file__).with_name("trtllm_throughput_5rows.csv")
"""Lines 224, 3, 43, 118 and 223 of ../shared/data/benchmarks/trtllm_perf_overview_throughput.csv (TensorRT-LLM
docs/source/performance/perf-overview.md at 00f37686, transcribed; Apache-2.0), unchanged."""


def test_max_throughput_table():
    code, out, err = capsim("validate-published", str(THROUGHPUT), "--json", "--workers", "1", "--no-progress")
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert len(rows) == 5
    done = [r for r in rows if "predicted" in r]
    # H200 FP8: its FP8 GEMM table; GB200 FP4: the NVFP4 GEMMs of profiles/ops/gb200
    assert [r["system"] for r in done] == ["H100", "GB200", "H200"]
    for r in done:
        assert 0.5 < r["predicted"]["output_tok_s"] / r["measured"]["output_tok_s"] < 2.0
    text = " | ".join(r["skipped"] for r in rows if "skipped" in r)
    for needle in ("pipeline parallelism", "MoE"):
        assert needle in text, needle
    summary = json.loads(out)["summary"]
    assert [(s["system"], s["mode"], s["metric"], s["n"]) for s in summary] == [
        ("GB200", "max_throughput", "output_tok_s", 1), ("H100", "max_throughput", "output_tok_s", 1),
        ("H200", "max_throughput", "output_tok_s", 1)]


def test_mixed_rule_is_passed_to_the_step_time_model():
    args = ("validate-published", str(FIXTURE), "--json", "--workers", "1", "--no-progress", "--backend", "vllm")
    one = json.loads(capsim(*args)[1])["rows"][0]["predicted"]
    summed = json.loads(capsim(*args, "--mixed", "sum")[1])["rows"][0]["predicted"]
    # a chunked iteration costed as two passes reads the weights twice: never faster than one pass
    assert summed["ttft_ms"] > one["ttft_ms"] and summed["tpot_ms"] >= one["tpot_ms"]


def test_all_reduce_choice_is_passed_to_the_step_time_model():
    from sim.published.engines import ENGINES
    from sim.published.predict import build_case
    from sim.published.rows import read_published
    rows = [r for r in read_published(FIXTURE) if r.tp > 1 and build_case(r).scenario is not None]
    assert len(rows) >= 3
    for row in rows:
        ar = {k: build_case(row, all_reduce=k).scenario["step_time"]["model"]["all_reduce"]
              for k in ("engine", "own", "nccl", "trtllm")}
        assert ar == {"engine": ENGINES[row.backend].all_reduce, "own": row.backend, "nccl": "nccl", "trtllm": "trtllm"}
    args = ("validate-published", str(FIXTURE), "--json", "--workers", "1", "--no-progress", "--backend", "vllm")
    nccl = json.loads(capsim(*args, "--all-reduce", "nccl")[1])
    own = json.loads(capsim(*args, "--all-reduce", "own")[1])
    pairs = [(a["predicted"]["tpot_ms"], b["predicted"]["tpot_ms"]) for a, b in zip(nccl["rows"], own["rows"])
             if "predicted" in a]
    # TP2, TP4 and TP8 decode steps (H100, B200 FP8 and FP4, B300 at TP8 and at dp 4 x tp 4 over two boards):
    # vLLM's custom all-reduce is a few microseconds where NCCL's is tens
    assert len(pairs) == 5 and all(o < n for n, o in pairs)
    assert "all-reduce: " in own["engines"]["vllm"]


def test_aic_benchmark_engine_config_sets_the_generators_limits():
    """AIConfigurator's benchmark rules (generator/rule_plugin/benchmark/<engine>.rule): max batch = the row's
    batch size, token budget = batch + ISL + 1,500 (TensorRT-LLM: rounded up to 32), graphs for every size."""
    from sim.io.errors import ConfigError
    from sim.published.launches import launch_config
    from sim.published.predict import build_case
    from sim.published.rows import read_published
    seen = set()
    for row in read_published(FIXTURE):
        case = build_case(row, engine_config="aic_benchmark")
        if case.scenario is None or row.mode != "agg" or row.attention_dp > 1:  # pools and DP ranks: below, and
            continue                                                              # test_disagg_rows
        seen.add(row.backend)
        s, b = case.scenario["scheduler"], row.concurrency
        budget = b + row.isl + 1500
        if row.backend == "trtllm":
            budget = -(-budget // 32) * 32
        assert (s["max_num_seqs"], s["max_num_batched_tokens"]) == (b, budget)
        if row.backend == "sglang":
            assert s["chunk_tokens"] == row.isl + 1500
        assert case.scenario["step_time"].get("graph_sizes", list(range(1, b + 1))) == list(range(1, b + 1))
        default = build_case(row, engine_config="defaults").scenario["scheduler"]
        assert default["max_num_batched_tokens"] == 8192 and default["kind"] == s["kind"]
        # each engine's choice (docs/fidelity.md): vLLM and TensorRT-LLM the benchmark rules, SGLang its defaults;
        # InferenceX's vLLM launches vLLM's defaults (sim.published.launches.launch_config)
        chosen = build_case(row).scenario["scheduler"]
        assert chosen == (default if row.backend == "sglang" or launch_config(row, "") else s)
    assert seen == {"vllm", "sglang", "trtllm"}
    (dp_row,) = read_published(FIXTURE.with_name("silicon_sample_attention_dp_1row.csv"))
    s = build_case(dp_row, engine_config="aic_benchmark").scenario
    # per rank: batch 16, budget 16 + ISL + 1500; the replica holds two ranks
    assert s["scheduler"]["max_num_seqs"] == 32
    assert s["scheduler"]["max_num_batched_tokens"] == 2 * (16 + dp_row.isl + 1500)
    assert s["step_time"]["graph_sizes"] == [2 * g for g in range(1, 17)]
    with pytest.raises(ConfigError, match="engine_config"):
        build_case(dp_row, engine_config="tuned")


def test_host_overhead_is_the_engines_unless_given():
    from sim.published.engines import ENGINES
    from sim.published.predict import build_case
    from sim.published.rows import read_published
    for row in read_published(FIXTURE):
        case = build_case(row)
        if case.scenario is None:
            continue
        model = case.scenario["step_time"]["model"]
        assert model.get("host_overhead_s") == ENGINES[row.backend].host_overhead_s
        assert build_case(row, host_overhead_s=5e-4).scenario["step_time"]["model"]["host_overhead_s"] == 5e-4
    code, _, err = capsim("validate-published", str(FIXTURE), "--host-overhead-ms", "-1", "--no-progress")
    assert code != 0 and "--host-overhead-ms" in err



def _with_second_row(tmp_path, **values) -> Path:
    """The fixture with its second data row's columns set to `values`."""
    with FIXTURE.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    rows[1].update(values)
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return path


def test_concurrency_is_the_stated_silicon_concurrency(tmp_path):
    """A GB200 TensorRT-LLM collection writes batch_size = concurrency / TP (`c8` in its id, batch_size 4,
    silicon_concurrency=8): the client's concurrency is the one the source text states; without one, batch_size."""
    from sim.published.rows import read_published

    def concurrency(path):
        return read_published(path)[1].concurrency

    assert concurrency(FIXTURE) == 8   # Qwen3-32B vLLM TP2: batch_size 8, silicon_concurrency=8
    assert concurrency(_with_second_row(tmp_path, batch_size="4")) == 8
    disagree = _with_second_row(tmp_path, batch_size="4")
    assert read_published(disagree)[1].note == ("client concurrency 8 from silicon_concurrency; batch_size x "
                                                "attention_dp_size = 4 x 1 = 4 disagrees")
    assert read_published(FIXTURE)[1].note == ""
    code, out, _ = capsim("validate-published", str(disagree), "--workers", "1", "--no-progress", "--json")
    rows = json.loads(out)["rows"]
    assert [r.get("note") for r in rows][1] == read_published(disagree)[1].note
    assert sum("note" in r for r in rows) == sum(bool(r.note) for r in read_published(disagree)) >= 1
    assert concurrency(_with_second_row(tmp_path, batch_size="4", silicon_data_source="measured=2026")) == 4
    assert concurrency(_with_second_row(tmp_path, silicon_data_source="silicon_concurrency=12.0")) == 12
    path = _with_second_row(tmp_path, silicon_data_source="silicon_concurrency=abc")
    code, _, err = capsim("validate-published", str(path), "--workers", "1", "--no-progress")
    assert code == 2 and f"{path}: line 3, column silicon_data_source: silicon_concurrency='abc'" in err


def test_shared_experts_overlap_follows_each_engine_unless_asked(capsys):
    """Each engine's rule for shared experts, q / k norms and the attention-DP prefill gather (sim.published.engines) reaches the replayed scenario; the flag overrides it and refuses
    anything but engine, off, decode, fused or a positive token count."""
    from sim.published.predict import build_case
    from sim.published.rows import read_published
    rows = [r for r in read_published(FIXTURE) if r.mode == "agg"]
    by_engine = {r.backend: r for r in rows}
    want = {"vllm": 256, "sglang": "off", "trtllm": "decode"}
    assert set(by_engine) == set(want)
    for backend, row in by_engine.items():
        case = build_case(row, per_user=3)
        if case.scenario is not None:
            assert case.scenario["step_time"]["model"]["shared_experts_overlap"] == want[backend]
            assert case.scenario["step_time"]["model"]["qk_norm_kernels"] == (
                "fused_with_rope" if backend == "trtllm" else "separate")
            # SGLang's attention-DP prefill passes gather by all-reduce (SUM_LEN); the others keep the default
            assert case.scenario["step_time"]["model"].get("dp_prefill_gather", "all_gather") == (
                "all_reduce" if backend == "sglang" else "all_gather")
            asked = build_case(row, per_user=3, shared_experts_overlap=64)
            assert asked.scenario["step_time"]["model"]["shared_experts_overlap"] == 64
    with pytest.raises(SystemExit) as stop:
        main(["validate-published", str(FIXTURE), "--shared-experts-overlap", "always"])
    assert stop.value.code == 2
    assert "expected engine, off, decode, fused or a positive token count, got 'always'" in capsys.readouterr().err


def test_frontend_is_each_engines_fit_unless_asked(capsys):
    """Each engine's fitted front end (sim.published.engines: base + per user x concurrency, ms) is the time an agg
    replay adds to its TTFT, disaggregated ones too; `off` and a stated pair override it; the flag refuses anything
    else."""
    from dataclasses import replace
    from sim.published.predict import build_case
    from sim.published.rows import read_published
    rows = read_published(FIXTURE)
    from sim.published.launches import postprocess_workers
    fitted = {"vllm": (25.0, 0.4), "sglang": (100.0, 0.0), "trtllm": (120.0, 1.0)}
    workers = {"trtllm": (30.0, 0.0)}   # launches with postprocess workers (test_launches.py)
    seen = set()
    for row in rows:
        case = build_case(row, per_user=3)
        if case.scenario is None:
            assert case.frontend_s == 0.0
            continue
        if row.mode != "agg":   # disaggregated: below
            continue
        assert "cluster" not in case.scenario   # added to TTFT, not simulated as time outside the engine
        base, per_user = workers[row.backend] if postprocess_workers(row) else fitted[row.backend]
        assert case.frontend_s == pytest.approx((base + per_user * row.concurrency) / 1e3)
        assert build_case(row, per_user=3, frontend="off").frontend_s == 0.0
        stated = build_case(row, per_user=3, frontend=(12.0, 1.0)).frontend_s
        assert stated == pytest.approx((12.0 + row.concurrency) / 1e3)
        seen.add(row.backend)
    assert seen == set(fitted)
    # a disaggregated row (test_disagg_rows' Qwen3-32B row, with a concurrency it does not state) gets its engine's
    disagg = Path(__file__).with_name("silicon_sample_disagg_3rows.csv")
    row = replace(read_published(disagg)[1], concurrency=4)
    assert row.mode == "disagg" and row.backend == "vllm"
    # front end, its per-user term over the users of one of its decode_num_workers decode workers
    # (twice: vLLM's proxy sends the prefill request, then the decode one, EngineDefaults.disagg_frontend_hops)
    assert build_case(row, per_user=3).frontend_s == pytest.approx(2 * (25.0 + 4 / row.decode.workers * 0.4) / 1e3)
    assert build_case(row, per_user=3, frontend="off").frontend_s == 0.0
    for bad in ("fast", "-5", "1+2+3", "nan"):
        with pytest.raises(SystemExit) as stop:
            main(["validate-published", str(FIXTURE), "--frontend", bad])
        assert stop.value.code == 2
        assert "expected engine, off or BASE_MS[+PER_USER_MS]" in capsys.readouterr().err


def test_frontend_time_is_added_to_ttft_and_reported_per_row(report):
    """A stated front end of 80 ms adds exactly that to a replayed row's TTFT and nothing to its TPOT; the JSON
    report gives each predicted row's front-end time beside its prediction."""
    from sim.published.predict import build_case, simulate_case
    from sim.published.rows import read_published
    row = next(r for r in read_published(FIXTURE) if r.mode == "agg" and r.backend == "vllm")
    off = simulate_case(None, build_case(row, per_user=3, frontend="off"))
    on = simulate_case(None, build_case(row, per_user=3, frontend=(80.0, 0.0)))
    assert "frontend_ms" not in off and on["frontend_ms"] == pytest.approx(80.0)
    assert on["ttft_ms"] - off["ttft_ms"] == pytest.approx(80.0)
    assert on["tpot_ms"] == off["tpot_ms"]
    predicted = [r for r in report["rows"] if "predicted" in r and r["mode"] == "agg"]
    assert predicted and all(r["frontend_ms"] == pytest.approx(
        {"vllm": 25 + 0.4 * r["concurrency"], "sglang": 100, "trtllm": 120 + 1.0 * r["concurrency"]}[r["backend"]]
        if "postprocess_workers" not in r.get("launch", {}) else 30) for r in predicted)


def test_kv_budget_comes_from_the_memory_the_card_reports():
    """Engines size KV from the total the driver reports (an H100's 80 GB are 80 GiB): a vLLM row's replay gets
    0.9 x 85,899,345,920 B - weights - 2 GiB per GPU, by hand from the profiles; a card without the field keeps
    memory_gb."""
    from sim.io.profiles import load_hardware, load_model
    from sim.models.parallel import Layout, weights_per_gpu
    from sim.models.spec import ModelSpec
    from sim.published.predict import PRECISIONS, build_case, model_for
    from sim.published.rows import read_published
    h100 = load_hardware("h100-sxm")
    assert h100.memory_bytes == 80_000_000_000 and h100.reported_memory_bytes == 85_899_000_000
    assert load_hardware("b300").reported_memory_bytes == load_hardware("b300").memory_bytes  # nvidia-smi's already
    row = next(r for r in read_published(FIXTURE) if r.mode == "agg" and r.backend == "vllm" and r.system == "h100_sxm")
    case = build_case(row, per_user=3)
    spec = ModelSpec(load_model(model_for(row.model_path)))
    weights = weights_per_gpu(spec, Layout(tp=row.tp), PRECISIONS[row.precision]).total
    want = int((0.9 * 85_899_000_000 - weights - 2 * 2**30) * row.tp)
    assert case.scenario["kv"]["budget"] == want


def test_async_scheduling_follows_each_engine_unless_asked(capsys):
    """scheduler.async_scheduling of a replayed row: the engine's choice (sim.published.engines), `on` or `off` for
    every row; anything else is refused by build_case and by the flag."""
    from sim.io.errors import ConfigError
    from sim.published.engines import ENGINES
    from sim.published.predict import build_case
    from sim.published.rows import read_published
    seen = 0
    for row in read_published(FIXTURE):
        if row.mode != "agg" or build_case(row, per_user=3).scenario is None:
            continue
        seen += 1
        scheduler = lambda how: build_case(row, per_user=3, async_scheduling=how).scenario["scheduler"]  # noqa: E731
        assert scheduler("engine").get("async_scheduling", False) is ENGINES[row.backend].async_scheduling
        assert scheduler("on")["async_scheduling"] is True and "async_scheduling" not in scheduler("off")
        with pytest.raises(ConfigError, match="async_scheduling: expected one of engine, on, off"):
            build_case(row, async_scheduling="sometimes")
    assert seen >= 2
    with pytest.raises(SystemExit) as stop:
        main(["validate-published", str(FIXTURE), "--async-scheduling", "sometimes"])
    assert stop.value.code == 2 and "invalid choice: 'sometimes'" in capsys.readouterr().err


def test_prefill_batches_follow_each_engine_on_chunked_schedulers_unless_asked(capsys):
    """scheduler.prefill_batches of a replayed agg row: the engine's choice where it schedules chunked prefill (vLLM,
    SGLang), `mixed` or `separate` for every such row; TensorRT-LLM's continuous scheduler has none; anything else is
    refused by build_case and by the flag."""
    from sim.io.errors import ConfigError
    from sim.published.engines import ENGINES
    from sim.published.predict import build_case
    from sim.published.rows import read_published
    kinds = set()
    for row in read_published(FIXTURE):
        if row.mode != "agg" or build_case(row, per_user=3).scenario is None:
            continue
        scheduler = lambda how: build_case(row, per_user=3, prefill_batches=how).scenario["scheduler"]  # noqa: E731
        kinds.add(scheduler("engine")["kind"])
        if scheduler("engine")["kind"] == "chunked":
            assert scheduler("engine").get("prefill_batches", "mixed") == ENGINES[row.backend].prefill_batches
            assert scheduler("separate")["prefill_batches"] == "separate"
            # AIConfigurator's benchmark limits launch SGLang with mixed chunks: mixed unless asked
            aic = lambda how: build_case(row, per_user=3, prefill_batches=how,  # noqa: E731
                                         engine_config="aic_benchmark").scenario["scheduler"]
            assert "prefill_batches" not in aic("engine") and aic("separate")["prefill_batches"] == "separate"
        else:
            assert "prefill_batches" not in scheduler("separate")
        assert "prefill_batches" not in scheduler("mixed")
        with pytest.raises(ConfigError, match="prefill_batches: expected one of engine, mixed, separate"):
            build_case(row, prefill_batches="sometimes")
    assert kinds == {"chunked", "continuous"}
    with pytest.raises(SystemExit) as stop:
        main(["validate-published", str(FIXTURE), "--prefill-batches", "sometimes"])
    assert stop.value.code == 2 and "invalid choice: 'sometimes'" in capsys.readouterr().err


def test_steady_state_phases_follow_each_engine_unless_asked(monkeypatch, capsys):
    """--phases: each engine's choice on agg rows (vLLM random, the others even; disaggregated rows:
    test_disagg_rows.py), or even / random for every row (workload.ramp_phases in every steady-state run when
    random); anything else refused."""
    from sim.io.errors import ConfigError
    from sim.published import predict
    from sim.published.engines import ENGINES
    from sim.published.rows import read_published
    rows = [r for r in read_published(FIXTURE) if r.mode == "agg" and predict.build_case(r, per_user=3).scenario]
    assert {r.backend for r in rows} >= {"vllm", "trtllm"}
    for row in rows:
        assert predict.build_case(row, per_user=3).phases == ENGINES[row.backend].steady_phases
        assert predict.build_case(row, per_user=3, phases="even").phases == "even"
    assert ENGINES["vllm"].steady_phases == "random" and ENGINES["trtllm"].steady_phases == "even"
    row = next(r for r in rows if r.backend == "trtllm")
    case = predict.build_case(row, per_user=3, phases="random")
    assert case.phases == "random" and case.scenario == predict.build_case(row, per_user=3).scenario
    assert predict.build_case(row, per_user=3, seed=5).scenario["seed"] == 5
    seen = []
    real = predict._run
    monkeypatch.setattr(predict, "_run", lambda sc, source: seen.append(sc["workload"]) or real(sc, source))
    predict.steady_state(case, "test")
    assert seen and all(w["ramp_phases"] == "random" and w["ramp_up_s"] > 0 for w in seen)
    seen.clear()
    predict.steady_state(predict.build_case(row, per_user=3), "test")
    assert seen and all("ramp_phases" not in w for w in seen)
    with pytest.raises(ConfigError, match="phases: expected one of engine, even, random"):
        predict.build_case(row, phases="jittered")
    with pytest.raises(SystemExit) as stop:
        main(["validate-published", str(FIXTURE), "--phases", "jittered"])
    assert stop.value.code == 2 and "invalid choice: 'jittered'" in capsys.readouterr().err


def test_nothing_to_validate_is_an_error(tmp_path):
    """A filter matching no row, a header without rows, every row skipped, a bad --out or a NaN host overhead:
    an error naming what is wrong, never an empty report with exit status 0."""
    code, _, err = capsim("validate-published", str(FIXTURE), "--system", "h100", "--no-progress")
    assert code == 2 and "--system h100: no row matches (the file has backend: " in err and "h100_sxm" in err
    header = tmp_path / "header.csv"
    header.write_text(FIXTURE.read_text().splitlines()[0] + "\n")
    code, _, err = capsim("validate-published", str(header), "--no-progress")
    assert code == 2 and f"{header}: no rows (only a header)" in err
    lines = FIXTURE.read_text().splitlines()
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    rows = [dict(r, model_path="foo/Bar") for r in rows[:2]]
    unknown = tmp_path / "unknown.csv"
    with unknown.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    code, out, err = capsim("validate-published", str(unknown), "--workers", "1", "--no-progress")
    assert code == 1 and "no model profile for 'foo/Bar'" in out and "none of the 2 selected rows" in err
    code, _, err = capsim("validate-published", str(FIXTURE), "--out", str(FIXTURE), "--no-progress")
    assert code == 2 and "is a file, expected a folder" in err
    code, _, err = capsim("validate-published", str(FIXTURE), "--host-overhead-ms", "nan", "--no-progress")
    assert code == 2 and "--host-overhead-ms: expected a number in 0..1e6 (ms), got nan" in err
    bom = tmp_path / "bom.csv"  # Excel's 'CSV UTF-8': read as the file without its byte-order mark
    bom.write_text("\ufeff" + FIXTURE.read_text(), encoding="utf-8")
    from sim.published.rows import read_published
    assert read_published(bom) == read_published(FIXTURE)
    raw = tmp_path / "latin1.csv"
    raw.write_bytes(b"id,backend\n\xff\xfe\n")
    code, _, err = capsim("validate-published", str(raw), "--no-progress")
    assert code == 2 and f"{raw}: line 1: not a UTF-8 text file" in err


def test_phase_draws_compares_each_draw_with_the_mean_of_draws(tmp_path, capsys):
    """benchmarks/phase_draws.py: reports grouped by seed (several per seed merge), the rows every seed predicted,
    each draw's median |error| and the mean of the first k draws' predictions; a run of even phases is refused."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "phase_draws", Path(__file__).parents[2] / "benchmarks" / "phase_draws.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def report(name, seed, preds, phases="random"):
        rows = [{"id": i, "line": line, "predicted": {"ttft_ms": p, "tpot_ms": 10.0},
                 "measured": {"ttft_ms": 100.0, "tpot_ms": 10.0}} for i, line, p in preds]
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"phases": phases, "seed": seed, "rows": rows}))
        return str(path)

    paths = [report("a0", 0, [("x", 2, 80.0)]), report("b0", 0, [("y", 3, 130.0), ("z", 5, 100.0)]),
             report("a1", 1, [("x", 2, 100.0), ("y", 3, 110.0)])]  # z: seed 1 has no prediction, left out
    assert mod.main(paths) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2] == "| seed 0 | 2 | 25.0% | 20.0% | 30.0% | 0.0% |"
    assert out[3] == "| seed 1 | 2 | 5.0% | 0.0% | 10.0% | 0.0% |"
    assert out[4] == "| mean of seeds 0, 1 | 2 | 15.0% | 10.0% | 20.0% | 0.0% |"
    with pytest.raises(SystemExit, match="--phases 'even'"):
        mod.main([report("e", 0, [("x", 2, 1.0)], phases="even"), paths[2]])


def _published_repeats():
    """benchmarks/published_repeats.py as a module (a script, not a package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "published_repeats", Path(__file__).parents[2] / "benchmarks" / "published_repeats.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_published_repeats_finds_repeated_runs_and_relabelled_measurements(tmp_path, capsys):
    """benchmarks/published_repeats.py: rows describing the same run with different numbers are one repeated
    configuration (a copy with the same numbers counts once), its spread is max / min - 1; the same numbers
    under two layouts are listed as one measurement filed twice; a report's errors appear beside each row."""
    mod = _published_repeats()
    header = (Path(__file__).parent / "silicon_sample_10rows.csv").read_text().splitlines()[0]
    cols = header.split(",")

    def row(i, date, tp, ep, ttft, tpot):
        values = {"id": f"r{i}", "silicon_data_source": f"x; silicon_concurrency=4; measured={date}T00:00:00Z",
                  "backend": "vllm", "backend_version": "0.17.0", "model_path": "org/M", "system": "b200_sxm",
                  "precision": "fp4", "mode": "agg", "isl": "1024", "osl": "1024", "batch_size": "4",
                  "tp_size": str(tp), "pp_size": "1", "moe_tp_size": "1", "moe_ep_size": str(ep),
                  "silicon_ttft_ms": str(ttft), "silicon_tpot_ms": str(tpot)}
        return ",".join(values.get(c, "") for c in cols)

    csv_path = tmp_path / "sample.csv"
    csv_path.write_text("\n".join([header,
                                   row(1, "2026-03-27", 8, 1, 160.0, 7.5),   # line 2
                                   row(2, "2026-04-20", 8, 1, 80.0, 7.0),    # line 3: a repeat of line 2
                                   row(3, "2026-03-27", 8, 1, 160.0, 7.5),   # line 4: line 2 copied, not a repeat
                                   row(4, "2026-03-11", 4, 4, 170.0, 8.4),   # line 5
                                   row(5, "2026-03-27", 4, 16, 170.0, 8.4),  # line 6: line 5's numbers, other layout
                                   ]) + "\n")
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"rows": [{"line": 3, "predicted": {"ttft_ms": 88.0, "tpot_ms": 7.0},
                                            "measured": {"ttft_ms": 80.0, "tpot_ms": 7.0}}]}))
    assert mod.main([str(csv_path), "--report", str(report)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    repeated = [ln for ln in lines if ln.startswith("| vllm 0.17.0")]
    assert repeated == ["| vllm 0.17.0 | b200_sxm | M | fp4 | 1024 / 1024 | 4 | tp8 | 2: 2026-03-27, 160.0 / 7.50; "
                        "3: 2026-04-20, 80.0 / 7.00 (+10% / +0%) | 100% | 7% |"]
    assert "1 configurations measured more than once (2 distinct measurements)" in out
    assert "TTFT 100.0% / 100.0%, TPOT 7.1% / 7.1%" in out
    assert "1 measurements filed under more than one description of the run" in out
    assert "| b200_sxm | M | 1024 / 1024 | 170.0 / 8.40 | 5: 2026-03-11, 4 users, tp4 ep4; " \
           "6: 2026-03-27, 4 users, tp4 ep16 |" in out


def test_published_repeats_across_versions_sets_one_run_under_two_engine_versions(tmp_path, capsys):
    """--across-versions: the same run measured under two versions of its engine is one configuration of the pair
    (earlier -> later in release order, a nightly last), its later / earlier ratios and TTFT difference printed with
    capsim's signed error on each version's rows; one measurement filed under two version names is left out."""
    mod = _published_repeats()
    header = (Path(__file__).parent / "silicon_sample_10rows.csv").read_text().splitlines()[0]
    cols = header.split(",")

    def row(i, version, tp, ttft, tpot, model="org/M"):
        values = {"id": f"r{i}", "silicon_data_source": "x; silicon_concurrency=4; measured=2026-04-03T00:00:00Z",
                  "backend": "vllm", "backend_version": version, "model_path": model, "system": "b200_sxm",
                  "precision": "fp8", "mode": "agg", "isl": "1024", "osl": "1024", "batch_size": "4",
                  "tp_size": str(tp), "pp_size": "1", "moe_tp_size": "1", "moe_ep_size": "1",
                  "silicon_ttft_ms": str(ttft), "silicon_tpot_ms": str(tpot)}
        return ",".join(values.get(c, "") for c in cols)

    csv_path = tmp_path / "sample.csv"
    csv_path.write_text("\n".join([header,
                                   row(1, "0.19.0", 2, 80.0, 9.0),              # line 2
                                   row(2, "0.17.0", 2, 120.0, 10.0),            # line 3: line 2's run, earlier
                                   row(3, "0.19.0", 4, 60.0, 8.0),              # line 4
                                   row(4, "nightly-5b8c30d", 4, 90.0, 8.0),     # line 5: line 4's run, a nightly
                                   row(5, "0.19.0", 2, 70.0, 7.0, "org/N"),     # line 6
                                   row(6, "0.19.1", 2, 70.0, 7.0, "org/N"),     # line 7: line 6 filed twice
                                   ]) + "\n")
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"rows": [{"line": 3, "predicted": {"ttft_ms": 90.0, "tpot_ms": 9.0},
                                            "measured": {"ttft_ms": 120.0, "tpot_ms": 10.0}}]}))
    assert mod.main([str(csv_path), "--across-versions", "--report", str(report)]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| vllm |") or "two versions" in ln]
    assert lines == [
        "| vllm | b200_sxm | M | fp8 | 1024 / 1024 | 0.17.0 -> 0.19.0 | 1 | 0.67 | -40.0 ms | 0.90 | -25% / -10% | - / - |",
        "| vllm | b200_sxm | M | fp8 | 1024 / 1024 | 0.19.0 -> nightly-5b8c30d | 1 | 1.50 | +30.0 ms | 1.00 | - / - | - / - |",
        "2 runs measured under two versions of their engine (one line per pair of versions): the version alone moves "
        "TTFT by 41.7% and TPOT by 5.0% (median |later / earlier - 1|)"]


def test_published_repeats_of_disaggregated_rows_need_their_pools_workers(tmp_path, capsys):
    """--mode disagg: a run is also its pools; rows with the same pools and other numbers are a repeat, a row that
    leaves a pool's worker count empty says too little to be one."""
    mod = _published_repeats()
    lines = (Path(__file__).parent / "silicon_sample_disagg_3rows.csv").read_text().splitlines()
    first = lines[1]
    again = first.replace("dsr1_b200_sglang_fp8_disagg_8192x1024_c64_cfg453", "again").replace(
        "9717.870258232142,13.04694102878905", "9000.0,13.5")
    cells = first.split(",")
    cells[0], cells[19] = "no_workers", ""   # prefill_num_workers empty: two such rows with other numbers
    other = ",".join(cells).replace("9717.870258232142,13.04694102878905", "5000.0,20.0").replace("no_workers", "nw2")
    (tmp_path / "d.csv").write_text("\n".join([lines[0], first, again, ",".join(cells), other]) + "\n")
    assert mod.main([str(tmp_path / "d.csv"), "--mode", "disagg", "--across-versions"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("no run measured under two versions of its engine")
    assert "1 configurations measured more than once (2 distinct measurements)" in out
    assert "| sglang 0.5.8.post1 disagg | b200_sxm | DeepSeek-V3 | fp8 | 8192 / 1024 | 64 | 1 x tp8 ep8 : 4 x tp8 ep8 |" in out
    assert "4: " not in out and "5: " not in out  # the rows without a worker count are left out


def test_host_time_per_sequence_is_paid_by_the_versions_that_schedule_synchronously():
    """vLLM before 0.14 (no async scheduling by default) pays its fitted host time per sequence every step; 0.14 on,
    or a version that is not a release number, pays none; --host-per-sequence-ms sets it for every row."""
    from dataclasses import replace
    from sim.published.engines import ENGINES, release_number
    from sim.published.predict import build_case
    from sim.published.rows import read_published
    vllm = ENGINES["vllm"]
    assert vllm.async_since == "0.14" and vllm.sync_host_per_sequence_s > 0
    assert [release_number(v) for v in ("0.12.0", "v0.14", "1.3.0rc1", "nightly-5b8c30d", "")] == [
        (0, 12, 0), (0, 14), (1, 3, 0), None, None]
    assert vllm.host_per_sequence_s("0.13.9") == vllm.sync_host_per_sequence_s
    assert [vllm.host_per_sequence_s(v) for v in ("0.14.0", "0.19.0", "nightly-5b8c30d", "")] == [0.0] * 4
    assert ENGINES["trtllm"].host_per_sequence_s("0.8.1") == 0.0  # overlaps its host work in every version
    row = next(r for r in read_published(FIXTURE) if r.backend == "vllm" and r.backend_version == "0.12.0")
    model = build_case(row).scenario["step_time"]["model"]
    assert model["host_per_sequence_s"] == vllm.sync_host_per_sequence_s
    later = build_case(replace(row, backend_version="0.14.1")).scenario["step_time"]["model"]
    assert "host_per_sequence_s" not in later
    assert build_case(row, host_per_sequence_s=0.0).scenario["step_time"]["model"].get("host_per_sequence_s") is None
    forced = build_case(replace(row, backend_version="0.19.0"), host_per_sequence_s=2e-5).scenario
    assert forced["step_time"]["model"]["host_per_sequence_s"] == 2e-5
    code, _, err = capsim("validate-published", str(FIXTURE), "--host-per-sequence-ms", "-0.01", "--no-progress")
    assert code != 0 and "--host-per-sequence-ms" in err


def test_fp4_rows_of_experts_only_checkpoints_keep_the_rest_in_bf16():
    """MiniMax-M2.5's, Kimi-K2.5's and Qwen3.5-397B-A17B's NVFP4 checkpoints quantize their routed experts alone: an
    fp4 row of one is replayed with weight_format bf16 and expert_weight_format nvfp4; a dense fp4 row (Llama-3.1-70B)
    keeps nvfp4."""
    from dataclasses import replace
    from sim.published.predict import EXPERTS_ONLY_FP4, build_case
    from sim.published.rows import read_published
    rows = read_published(FIXTURE)
    minimax = next(r for r in rows if r.model_path == "MiniMaxAI/MiniMax-M2.5")
    llama = next(r for r in rows if r.model_path == "meta-llama/Llama-3.1-70B")
    assert set(EXPERTS_ONLY_FP4) == {"minimax-m2.5", "kimi-k2.5", "qwen3.5-397b-a17b"}
    s = build_case(replace(minimax, precision="fp4")).scenario
    assert (s["weight_format"], s["expert_weight_format"]) == ("bf16", "nvfp4")
    s = build_case(replace(llama, precision="fp4")).scenario
    assert s["weight_format"] == "nvfp4" and "expert_weight_format" not in s
    s = build_case(replace(minimax, precision="fp8")).scenario
    assert s["weight_format"] == "fp8" and "expert_weight_format" not in s
    assert all("attention_weight_format" not in build_case(replace(r, precision=p)).scenario
               for r in (minimax, llama) for p in ("fp4", "fp8"))


def test_fp4_rows_keep_attention_in_bf16_only_for_the_models_listed(monkeypatch):
    """ATTENTION_BF16_FP4 lists the models whose fp4 rows are replayed with attention_weight_format bf16: none, since
    DeepSeek's (whose NVIDIA checkpoints keep self_attn in BF16) lost on the even lines so (docs/fidelity.md). Listed,
    a DeepSeek fp4 row gets weight_format nvfp4 with attention_weight_format bf16, and its KV budget is what the engine
    leaves beside those weights (the attention's at two bytes)."""
    from dataclasses import replace
    from sim.io.profiles import load_hardware, load_model
    from sim.models.parallel import Layout, weights_per_gpu
    from sim.models.spec import ModelSpec
    from sim.published import predict
    from sim.published.engines import ENGINES, kv_budget_bytes
    from sim.published.rows import read_published
    row = next(r for r in read_published(FIXTURE) if r.model_path.startswith("deepseek-ai/") and r.mode == "agg")
    row = replace(row, precision="fp4", system="b200_sxm")
    assert predict.ATTENTION_BF16_FP4 == {}
    assert "attention_weight_format" not in predict.build_case(row).scenario
    monkeypatch.setitem(predict.ATTENTION_BF16_FP4, "deepseek-v3", "self_attn* kept in BF16")
    sc = predict.build_case(row).scenario
    assert (sc["weight_format"], sc["attention_weight_format"]) == ("nvfp4", "bf16")
    assert "expert_weight_format" not in sc
    lay = Layout(tp=row.tp, pp=row.pp, ep=row.moe_ep, attention_dp=max(row.attention_dp, 1))
    kept = weights_per_gpu(ModelSpec(load_model("deepseek-v3"), attention_format="bf16"), lay, "nvfp4").total
    assert kept > weights_per_gpu(ModelSpec(load_model("deepseek-v3")), lay, "nvfp4").total
    card = load_hardware("b200").reported_memory_bytes
    assert sc["kv"]["budget"] == kv_budget_bytes(ENGINES[row.backend], card, kept, lay.gpus)


def test_kv_cache_format_follows_the_rule_asked_for(capsys):
    """--kv-cache: bf16 stores every row's KV in BF16, quantized every FP8 / FP4 row's in FP8, checkpoint the FP4 rows'
    only; `engine` takes EngineDefaults.kv_cache. An FP8 cache halves the bytes a request needs, so a row the BF16
    cache could not hold fits; a disaggregated row's pools take the same format; an unknown value is refused."""
    from dataclasses import replace
    from sim.io.errors import ConfigError
    from sim.published.engines import ENGINES
    from sim.published.predict import KV_CACHE, build_case, kv_format_for
    from sim.published.rows import read_published
    rows = read_published(FIXTURE)
    fp8 = next(r for r in rows if r.precision == "fp8" and build_case(r).scenario is not None)
    fp4, bf16 = replace(fp8, precision="fp4"), replace(fp8, precision="bf16")
    assert [kv_format_for(v, r) for v in KV_CACHE for r in (bf16, fp8, fp4)] == [
        "bf16", "bf16", "bf16", "bf16", "fp8", "fp8", "bf16", "bf16", "fp8"]
    assert kv_format_for("engine", fp8) == kv_format_for(ENGINES[fp8.backend].kv_cache, fp8)
    with pytest.raises(ConfigError, match="kv_cache: expected one of engine, bf16, quantized, checkpoint"):
        kv_format_for("fp8", fp8)
    assert build_case(fp8, kv_cache="quantized").scenario["kv"]["format"] == "fp8"
    assert build_case(fp8, kv_cache="bf16").scenario["kv"]["format"] == "bf16"
    assert build_case(fp8, kv_cache="checkpoint").scenario["kv"]["format"] == "bf16"
    disagg = next(r for r in read_published(FIXTURE.parent / "silicon_sample_disagg_3rows.csv")
                  if build_case(r).scenario is not None)
    assert build_case(replace(disagg, precision="fp8"), kv_cache="quantized").scenario["kv"]["format"] == "fp8"
    with pytest.raises(SystemExit) as stop:
        main(["validate-published", str(FIXTURE), "--kv-cache", "fp8"])
    assert stop.value.code == 2 and "--kv-cache: invalid choice: 'fp8'" in capsys.readouterr().err


def test_an_fp8_kv_cache_holds_a_request_the_bf16_one_cannot():
    """The replay's check that one request fits the KV budget counts the format's bytes: a context only an FP8 cache
    can hold is replayed under `quantized` and skipped, saying so, under `bf16`."""
    from dataclasses import replace
    from sim.models.parallel import Layout, kv_bytes_per_token_per_gpu
    from sim.models.spec import ModelSpec
    from sim.io.profiles import load_model
    from sim.published.predict import build_case, model_for
    from sim.published.rows import read_published
    row = next(r for r in read_published(FIXTURE) if r.precision == "fp8" and r.mode == "agg"
               and build_case(r).scenario is not None)
    budget = build_case(row, kv_cache="bf16").scenario["kv"]["budget"]
    spec = ModelSpec(load_model(model_for(row.model_path)))
    layout = Layout(tp=row.tp, pp=row.pp, ep=row.moe_ep, attention_dp=max(row.attention_dp, 1))
    per_token = kv_bytes_per_token_per_gpu(spec, layout, "bf16") * layout.rank_gpus
    tokens = int(budget / per_token * 1.5) // 16 * 16   # 1.5x what BF16 holds, 0.75x what FP8 holds
    long = replace(row, isl=tokens - row.osl)
    assert "less than one request needs" in build_case(long, kv_cache="bf16").skipped
    assert build_case(long, kv_cache="quantized").scenario["kv"]["format"] == "fp8"


def test_ttft_residual_splits_a_rows_error_into_the_rate_and_the_decode_time(tmp_path, capsys):
    """benchmarks/ttft_residual.py on a hand-computed report: a row whose E2E is exact and whose TPOT is 10% over has
    its TTFT (a tenth of E2E) 90% under, e_TTFT = k e_E2E - (k - 1) e_TPOT with k = 10."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "ttft_residual", Path(__file__).parents[2] / "benchmarks" / "ttft_residual.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # osl 10: measured E2E = 100 + 9 x 100 = 1000 ms (k = 10); predicted 10 + 9 x 110 = 1000 ms
    split = {"id": "a", "line": 2, "mode": "disagg", "backend": "trtllm", "system": "b200_sxm", "osl": 10,
             "concurrency": 8, "measured": {"ttft_ms": 100.0, "tpot_ms": 100.0},
             "predicted": {"ttft_ms": 10.0, "tpot_ms": 110.0}}
    # every metric 20% over: the rate 1 / 1.2 - 1 under
    over = dict(split, id="b", line=3, backend="sglang", concurrency=100, predicted={"ttft_ms": 120.0, "tpot_ms": 120.0})
    e = mod.row_errors(split)
    assert e["k"] == pytest.approx(10) and e["e2e"] == pytest.approx(0) and e["tpot"] == pytest.approx(0.1)
    assert e["ttft"] == pytest.approx(-0.9) and e["rate"] == pytest.approx(0)
    assert mod.row_errors(over)["rate"] == pytest.approx(1 / 1.2 - 1)
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"rows": [split, over, {"id": "c", "line": 4, "skipped": "why",
                                                       "measured": {"ttft_ms": 1.0, "tpot_ms": 1.0}}]}))
    assert mod.main([str(path), "--json", str(tmp_path / "t.json")]) == 0
    groups = {g["group"]: g for g in json.loads((tmp_path / "t.json").read_text())}
    assert groups["disagg: all rows"]["n"] == 2
    assert groups["disagg: trtllm"]["ttft"] == pytest.approx([0.9, -0.9])
    assert groups["disagg: sglang"]["e2e"] == pytest.approx([0.2, 0.2])
    assert groups["disagg: 1-16 users"]["n"] == 1 and groups["disagg: 65+ users"]["n"] == 1
    assert "| disagg: trtllm | 1 | 10.0 | 90.0% (-90%) | 10.0% (+10%) | 0.0% (+0%) |" in capsys.readouterr().out
    agg = {"rows": [dict(split, mode="agg"), dict(over, mode="agg")]}
    groups = {g["group"]: g for g in mod.table(agg, multi_gpu={3})}
    assert groups["agg: TP > 1, PP, EP or attention DP"]["n"] == 1
    assert groups["agg: TP > 1, PP, EP or attention DP"]["e2e"] == pytest.approx([0.2, 0.2])
    assert "agg: TP > 1, PP, EP or attention DP" not in {g["group"] for g in mod.table(agg)}
    wrong = dict(split, derived={"e2e_ms": {"measured": 999.0, "predicted": 1000.0, "error": 0.001}})
    with pytest.raises(AssertionError, match="derived e2e_ms is not"):
        mod.row_errors(wrong)
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert mod.main([str(bad)]) == 2 and "cannot read a validate-published report" in capsys.readouterr().err


def test_prefill_batches_choice_applies_the_stated_rule(tmp_path, capsys):
    """benchmarks/prefill_batches_choice.py: `separate` only when its even lines' mean of median |TTFT| and |TPOT|
    error beats `mixed`'s by more than 0.1 point; odd lines reported, every (card, model, precision) group printed
    (a row without a precision is bf16's group)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "prefill_batches_choice", Path(__file__).parents[2] / "benchmarks" / "prefill_batches_choice.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def report(name, ttft_even, ttft_odd):
        rows = [{"id": f"r{line}", "line": line, "mode": "agg", "backend": "sglang", "system": "h100_sxm",
                 "model": "Qwen/Qwen3-32B", "precision": None, "osl": 10,
                 "measured": {"ttft_ms": 100.0, "tpot_ms": 10.0},
                 "predicted": {"ttft_ms": ttft_even if line % 2 == 0 else ttft_odd, "tpot_ms": 10.0},
                 "derived": {"e2e_ms": {"measured": 190.0, "predicted": 190.0, "error": 0.0}}} for line in (2, 3)]
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"rows": rows}))
        return str(path)

    mixed = report("mixed", 120.0, 120.0)   # even lines: 20% TTFT, 0% TPOT: score 10%
    assert mod.compare(mixed, report("better", 110.0, 130.0))["chosen"] == {"sglang": "separate"}  # score 5%
    assert mod.compare(mixed, report("tie", 119.9, 100.0))["chosen"] == {"sglang": "mixed"}  # 9.95%: within 0.1 pt
    assert mod.main([mixed, report("worse", 150.0, 100.0)]) == 0
    out = capsys.readouterr().out
    assert "-> mixed; odd lines (held out): mixed 10.00%, separate 0.00%" in out
    assert "| h100_sxm Qwen3-32B bf16 | 2 |" in out


def test_an_hgx_row_whose_tp_size_is_its_experts_product_reads_as_its_node():
    """A B200 / B300 / H100 agg row stating tp_size = moe_tp x moe_ep beyond its 8-GPU node (the sample's 193 MoE rows
    at tp 64 = 8 x 8 and tp 16 = 4 x 4, whose repeats elsewhere in the file say tp 8 / 4, moe_tp 1) is read as
    that node: tp_size / moe_tp, moe_tp 1, with a note. Rows that fit their node, GB200 racks and rows with attention DP
    read as stated."""
    from sim.published.rows import parse_row

    def row(**kw):
        base = {"id": "x", "backend": "sglang", "model_path": "deepseek-ai/DeepSeek-R1", "system": "b200_sxm",
                "mode": "agg", "isl": "1024", "osl": "1024", "batch_size": "16", "tp_size": "64", "moe_tp_size": "8",
                "moe_ep_size": "8", "attention_dp_size": "1", "silicon_ttft_ms": "200", "silicon_tpot_ms": "10",
                "silicon_data_source": "db-dump/2026-04-27; config_id=201; silicon_concurrency=16"}
        r = parse_row(dict(base, **kw), "f.csv, line 2", 2)
        return r.tp, r.moe_tp, r.moe_ep, r.note
    tp, moe_tp, moe_ep, note = row()
    assert (tp, moe_tp, moe_ep) == (8, 1, 8)
    assert note == ("tp_size 64 = moe_tp 8 x moe_ep 8 exceeds one 8-GPU node; read as tp 8, moe_tp 1, moe_ep 8, as the "
                    "same runs' rows elsewhere in the file state it")
    assert row(tp_size="16", moe_tp_size="4", moe_ep_size="4", system="h100_sxm")[:3] == (4, 1, 4)
    assert row(system="gb200")[:3] == (64, 8, 8)                                        # a rack, not one node
    assert row(tp_size="8", moe_tp_size="1", moe_ep_size="8") == (8, 1, 8, "")           # fits its node
    assert row(attention_dp_size="8")[:3] == (64, 8, 8)                                   # not the pattern
    # the attention-DP form (TensorRT-LLM's B200 rows at dp 64 = 8 x 8 and dp 16 = 4 x 4, tp 1): read as the node
    dp = parse_row({
        "id": "x", "backend": "trtllm", "model_path": "deepseek-ai/DeepSeek-R1", "system": "b200_sxm", "mode": "agg",
        "isl": "1024", "osl": "1024", "batch_size": "16", "tp_size": "1", "attention_dp_size": "64",
        "moe_tp_size": "8", "moe_ep_size": "8", "silicon_ttft_ms": "200", "silicon_tpot_ms": "10"}, "f.csv, line 2", 2)
    assert (dp.tp, dp.attention_dp, dp.moe_tp, dp.moe_ep) == (1, 8, 1, 8)
    assert dp.note == ("attention_dp_size 64 = moe_tp 8 x moe_ep 8 exceeds one 8-GPU node; read as attention dp 8, "
                       "tp 1, moe_tp 1, moe_ep 8, the single node InferenceX's B200 runs use, as its tp_size rows of "
                       "the same form read")
    assert row(tp_size="64", moe_tp_size="64", moe_ep_size="1")[:3] == (64, 64, 1)        # experts not split both ways
    both = row(batch_size="4")[3]                                                        # two notes, both kept
    assert both.startswith("client concurrency 16 from silicon_concurrency") and "exceeds one 8-GPU node" in both
