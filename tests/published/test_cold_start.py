"""The cold-start replay of validate-published (sim/published/predict.py): a benchmark of N requests per
user whose first wave reaches an idle engine at once, the later waves at the closed loop's steady state
(`spread`) or repeating the first (`cohort`). Rows from tests/published/silicon_sample_10rows.csv."""

import json
from pathlib import Path

import pytest

from sim.published.predict import ROUNDS, build_case, combine_cold, first_wave, simulate_case, steady_state
from sim.published.rows import read_published
from tests.published.test_validate_published import FIXTURE, capsim


def _peer(name: str):
    """benchmarks/published_peer.py loaded as a module of its own (a benchmark script, not a package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[2] / "benchmarks" / "published_peer.py")
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    return peer


def _row(backend: str):
    return next(r for r in read_published(FIXTURE) if r.backend == backend and r.mode == "agg"
                and r.system == "h100_sxm")


def test_combine_cold_by_hand():
    first = {"ttft_ms": 1000.0, "tpot_ms": 20.0}
    steady = {"ttft_ms": 100.0, "tpot_ms": 10.0}
    # 10 rounds: one burst wave and nine steady ones
    assert combine_cold(first, steady, 10, "spread") == pytest.approx({"ttft_ms": 190.0, "tpot_ms": 11.0})
    assert combine_cold(first, steady, 1, "spread") == pytest.approx(first)
    assert combine_cold(first, steady, 4, "cohort") == first


def test_steady_state_spreads_users_over_their_own_lifetime():
    row = _row("vllm")  # Qwen3-32B TP2, 1024/128 at concurrency 8
    case = build_case(row, per_user=3, start="staggered")
    st = steady_state(case, "test")
    # the counted requests' mean lifetime is what the users were spread over (within the 5% it allows)
    assert st["lifetime_s"] == pytest.approx(st["e2e_s"], rel=0.05)
    first = first_wave(case, "test")
    # the first wave is a burst: at least as slow to first token as a request of the steady state
    assert first["ttft_ms"] >= st["ttft_ms"]


def test_cold_is_between_steady_and_first_wave_and_keeps_its_parts():
    row = _row("vllm")
    res = simulate_case(None, build_case(row, per_user=3, frontend="off"))  # the simulated engine's TTFT alone
    parts = res["components"]
    lo, hi = sorted((parts["steady"]["ttft_ms"], parts["first_wave"]["ttft_ms"]))
    assert lo <= res["ttft_ms"] <= hi
    assert res["ttft_ms"] == pytest.approx(combine_cold(parts["first_wave"], parts["steady"], ROUNDS,
                                                        "spread")["ttft_ms"])
    sg = simulate_case(None, build_case(_row("sglang"), per_user=3))  # SGLang keeps the cohort
    assert sg["ttft_ms"] == pytest.approx(sg["components"]["first_wave"]["ttft_ms"] + sg["frontend_ms"])


def test_rounds_flag():
    args = ("validate-published", str(FIXTURE), "--json", "--workers", "1", "--no-progress", "--backend", "vllm",
            "--requests-per-user", "3", "--client", "fixed")
    one = json.loads(capsim(*args, "--rounds", "1")[1])["rows"][0]
    many = json.loads(capsim(*args, "--rounds", "40")[1])["rows"][0]
    assert one["predicted"]["ttft_ms"] == pytest.approx(one["components"]["first_wave"]["ttft_ms"]
                                                        + one["frontend_ms"])
    assert many["predicted"]["ttft_ms"] < one["predicted"]["ttft_ms"]
    code, _, err = capsim(*args, "--rounds", "0")
    assert code == 2 and "--rounds: expected an integer >= 1" in err
    code, _, err = capsim(*args, "--rounds", "5", "--start", "burst")
    assert code == 2 and "--rounds: only with --start cold" in err


def test_rounds_held_out_chooses_on_even_lines_and_reports_odd(tmp_path):
    peer = _peer("published_peer")
    first, steady = {"ttft_ms": 900.0, "tpot_ms": 30.0}, {"ttft_ms": 100.0, "tpot_ms": 10.0}
    truth = combine_cold(first, steady, 5, "spread")  # rows measured as a 5-round cold benchmark
    rows, sample = [], ["id,silicon_data_source"]
    for line in range(2, 8):
        measured = dict(truth) if line != 7 else {"ttft_ms": 2 * truth["ttft_ms"], "tpot_ms": truth["tpot_ms"]}
        rows.append({"id": f"r{line}", "line": line, "backend": "vllm", "measured": measured,
                     "predicted": truth, "components": {"first_wave": first, "steady": steady}})
        sample.append(f"r{line},source_file=x.csv; silicon_concurrency=8")
    (tmp_path / "report.json").write_text(json.dumps({"rows": rows}))
    (tmp_path / "sample.csv").write_text("\n".join(sample) + "\n")
    out = peer.rounds_held_out(str(tmp_path / "report.json"), str(tmp_path / "sample.csv"), None)
    assert out[0]["chosen"] == (5, "spread") and (out[0]["n_fit"], out[0]["n_test"]) == (3, 3)
    assert out[0]["ttft_ms"] == pytest.approx(0.0)  # median over lines 3, 5, 7: line 7 is off by 50%


def test_offset_held_out_chooses_on_even_lines_and_reports_odd(tmp_path):
    peer = _peer("published_peer3")
    rows, sample = [], ["id,silicon_data_source"]
    for line in range(2, 10):
        measured = 100.0 * line + 60.0   # every row 60 ms over its prediction, but line 9 (off by 300 ms more)
        rows.append({"id": f"r{line}", "line": line, "backend": "trtllm",
                     "measured": {"ttft_ms": measured + (300.0 if line == 9 else 0.0), "tpot_ms": 10.0},
                     "predicted": {"ttft_ms": 100.0 * line, "tpot_ms": 10.0}})
        sample.append(f"r{line},source_file=y.csv; silicon_concurrency=8")
    (tmp_path / "report.json").write_text(json.dumps({"rows": rows}))
    (tmp_path / "sample.csv").write_text("\n".join(sample) + "\n")
    out = peer.offset_held_out(str(tmp_path / "report.json"), str(tmp_path / "sample.csv"), None)
    assert out[0]["offset_ms"] == 60 and (out[0]["n_fit"], out[0]["n_test"]) == (4, 4)
    assert out[0]["after"] == pytest.approx(0.0) and out[0]["before"] > 0.05  # held out: lines 3, 5, 7, 9
    assert out[-1]["collection"] == "all" and out[-1]["after"] == pytest.approx(0.0)


def test_before_after_figure(tmp_path):
    peer = _peer("published_peer2")
    for name, factor in (("before", 0.5), ("now", 1.1)):
        rows = [{"id": f"r{i}", "backend": b, "measured": {"ttft_ms": 100.0 * (i + 1), "tpot_ms": 10.0},
                 "predicted": {"ttft_ms": factor * 100.0 * (i + 1), "tpot_ms": 10.0},
                 "error": {"ttft_ms": factor - 1, "tpot_ms": 0.0}} for i, b in enumerate(("vllm", "sglang", "trtllm"))]
        (tmp_path / name).mkdir()
        (tmp_path / name / "report.json").write_text(json.dumps({"rows": rows}))
    assert peer.main([str(tmp_path / "now" / "report.json"), "--before", str(tmp_path / "before" / "report.json"),
                      "--fig", str(tmp_path / "fig.png")]) == 0
    assert (tmp_path / "fig.png").stat().st_size > 10_000


def test_frontend_fit_chooses_base_and_per_user_on_even_lines(tmp_path):
    """Rows whose measured TTFT is the prediction + 40 ms + 0.5 ms per user (one odd row far off): the fit on the
    even lines finds (40, 0.5) and the held-out odd rows' median error falls to zero."""
    peer = _peer("published_peer4")
    rows = []
    for line in range(2, 14):
        users = (4, 8, 16, 64, 128, 256)[line % 6]
        measured = 100.0 * line + 40.0 + 0.5 * users + (500.0 if line == 13 else 0.0)
        rows.append({"id": f"r{line}", "line": line, "backend": "vllm", "mode": "agg", "system": "h100_sxm",
                     "concurrency": users, "measured": {"ttft_ms": measured, "tpot_ms": 10.0},
                     "predicted": {"ttft_ms": 100.0 * line, "tpot_ms": 10.0}})
    rows.append(dict(rows[0], id="d", line=15, mode="disagg"))   # disaggregated rows take no part
    (tmp_path / "report.json").write_text(json.dumps({"rows": rows}))
    out = peer.frontend_fit(str(tmp_path / "report.json"))
    assert (out[0]["backend"], out[0]["system"], out[0]["base_ms"], out[0]["per_user_ms"]) == ("vllm", "all", 40, 0.5)
    assert (out[0]["n_fit"], out[0]["n_test"]) == (6, 6)
    assert out[0]["after"] == pytest.approx(0.0) and out[0]["before"] > 0.05


def test_frontend_by_version_tests_on_odd_lines_and_on_a_collection_left_out(tmp_path):
    """Version 0.19 rows measured 20 ms over their prediction in both collections, version 0.17 rows 120 ms over:
    each version's pair is found on its even lines and carries over to the collection left out, where the engine's
    one pair (chosen over both versions) does not; a nightly build has no released version and takes no part."""
    peer = _peer("published_peer6")
    rows, sample = [], ["id,backend_version,silicon_data_source"]
    for line in range(2, 26):
        version = ("0.19.0", "0.17.0", "nightly-abc")[line % 3]
        over = {"0.19.0": 20.0, "0.17.0": 120.0, "nightly-abc": 500.0}[version]
        rows.append({"id": f"r{line}", "line": line, "backend": "vllm", "mode": "agg", "system": "b200_sxm",
                     "concurrency": 8, "measured": {"ttft_ms": 100.0 + over, "tpot_ms": 10.0},
                     "predicted": {"ttft_ms": 100.0, "tpot_ms": 10.0}})
        sample.append(f"r{line},{version},source_file={'a' if line < 14 else 'b'}.csv; silicon_concurrency=8")
    (tmp_path / "report.json").write_text(json.dumps({"rows": rows}))
    (tmp_path / "sample.csv").write_text("\n".join(sample) + "\n")
    out = {v["version"]: v for v in peer.frontend_by_version(str(tmp_path / "report.json"), str(tmp_path / "sample.csv"))}
    assert sorted(out) == ["0.17", "0.19"]
    for version, over in (("0.17", 120), ("0.19", 20)):
        v = out[version]
        assert v["pair"][0] + 8 * v["pair"][1] == pytest.approx(over) and v["version_pair"] == pytest.approx(0.0)
        assert v["engine"] > 0.05 and [c["collection"] for c in v["left_out"]] == ["a.csv", "b.csv"]
        assert all(c["version_pair"] == pytest.approx(0.0) for c in v["left_out"])
    assert peer.main([str(tmp_path / "report.json"), "--frontend-by-version"]) == 2  # needs --sample


def test_groups_table_per_model_and_the_odd_lines(tmp_path):
    """--groups: per (card, engine, model, precision) capsim's median errors over all its rows and both tools' on
    the rows the peer predicts too; totals over all rows and over the odd lines."""
    peer = _peer("published_peer5")
    rows, aic = [], ["id,aic_ttft_ms,aic_tpot_ms"]
    for line, (model, over) in enumerate([("org/A", 1.1), ("org/A", 1.3), ("org/B", 0.5), ("org/A", 1.2)], start=2):
        rows.append({"id": f"r{line}", "line": line, "system": "h100_sxm", "backend": "vllm", "mode": "agg",
                     "model": model, "precision": None, "measured": {"ttft_ms": 100.0, "tpot_ms": 10.0},
                     "predicted": {"ttft_ms": 100.0 * over, "tpot_ms": 10.0}})
        if line != 3:
            aic.append(f"r{line},150.0,12.0")
    (tmp_path / "report.json").write_text(json.dumps({"rows": rows}))
    (tmp_path / "aic.csv").write_text("\n".join(aic) + "\n")
    out = {(g["system"], g["model"]): g for g in peer.groups(str(tmp_path / "report.json"), str(tmp_path / "aic.csv"))}
    a = out[("h100_sxm", "A")]
    assert (a["n"], a["n_both"], a["precision"]) == (3, 2, "bf16")
    assert a["capsim_ttft_ms"] == pytest.approx(0.2) and a["capsim_ttft_ms_both"] == pytest.approx(0.15)
    assert a["aic_ttft_ms"] == pytest.approx(0.5) and a["aic_tpot_ms"] == pytest.approx(0.2)
    assert out[("all", "")]["n"] == 4 and out[("odd lines", "")]["n"] == 2   # lines 3 and 5
    assert out[("odd lines", "")]["capsim_ttft_ms"] == pytest.approx(0.25)    # 30% and 20%


def test_rounds_with_frontend_finds_the_benchmark_length_it_was_built_with(tmp_path):
    """Rows measured as a benchmark of N = 5 requests per user behind a 40 ms front end: chosen jointly, (5, 40, 0)
    predicts the odd lines and every collection left out exactly; N fixed at 10 cannot, whatever its front end."""
    peer = _peer("published_peer7")
    rows, sample = [], ["id,silicon_data_source"]
    for line in range(2, 30):
        first, steady, users = 100.0 + 37.0 * line, 20.0 + 3.0 * (line % 5), 4 + line
        rows.append({"id": f"r{line}", "line": line, "backend": "vllm", "mode": "agg", "concurrency": users,
                     "components": {"first_wave": {"ttft_ms": first}, "steady": {"ttft_ms": steady}},
                     "measured": {"ttft_ms": (first + 4 * steady) / 5 + 40.0}})
        sample.append(f"r{line},source_file={'ab'[line % 2]}{line % 3}.csv; silicon_concurrency={users}")
    (tmp_path / "report.json").write_text(json.dumps({"rows": rows}))
    (tmp_path / "sample.csv").write_text("\n".join(sample) + "\n")
    out = peer.rounds_with_frontend(str(tmp_path / "report.json"), str(tmp_path / "sample.csv"))
    chosen = [r for r in out if r["rule"] == "N chosen"]
    assert [r["test"] for r in chosen][:2] == ["odd lines", "left out: a0.csv"] and len(chosen) == 8
    assert all(r["median"] == pytest.approx(0.0, abs=1e-12) for r in chosen)
    assert all(r["chosen"] == (5, 40, 0) for r in chosen if r["chosen"])
    assert all(r["median"] > 0.01 for r in out if r["rule"] == "N = 10")
    assert peer.main([str(tmp_path / "report.json"), "--rounds-with-frontend"]) == 2  # needs --sample


def test_async_scheduling_choice_refits_the_front_end_per_side(tmp_path):
    """benchmarks/async_scheduling_choice.py: the `on` run's rows sit exactly 30 ms under their measurement, the `off`
    run's 30 ms under in one collection and 130 ms in the other: `on` gets (30, 0) and no error on any test, `off`
    cannot be exact with one front end; a row only one report predicted takes no part."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "async_scheduling_choice", Path(__file__).parents[2] / "benchmarks" / "async_scheduling_choice.py")
    choice = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(choice)
    sample, off, on = ["id,silicon_data_source"], [], []
    for line in range(2, 22):
        row = {"id": f"r{line}", "line": line, "backend": "trtllm", "mode": "agg", "concurrency": 8,
               "measured": {"ttft_ms": 200.0, "tpot_ms": 10.0}}
        on.append(dict(row, predicted={"ttft_ms": 170.0, "tpot_ms": 11.0}))
        off.append(dict(row, predicted={"ttft_ms": 170.0 if line < 12 else 70.0, "tpot_ms": 10.0}))
        sample.append(f"r{line},source_file={'a' if line < 12 else 'b'}.csv; silicon_concurrency=8")
    on.append(dict(on[0], id="only_on", line=40))
    for name, rows in (("off.json", off), ("on.json", on)):
        (tmp_path / name).write_text(json.dumps({"rows": rows}))
    (tmp_path / "s.csv").write_text("\n".join(sample) + "\n")
    out = {r["side"]: r for r in choice.choice_table(str(tmp_path / "off.json"), str(tmp_path / "on.json"),
                                                     str(tmp_path / "s.csv"))}
    assert out["on"]["pair"] == (30, 0) and out["on"]["n"] == 20
    assert out["on"]["even"] == out["on"]["odd"] == out["on"]["left_out"] == 0.0
    assert out["on"]["tpot_odd"] == pytest.approx(0.1) and out["off"]["tpot_odd"] == 0.0
    assert out["off"]["left_out"] > 0.1 and max(out["off"]["even"], out["off"]["odd"]) > 0.0


def test_benchmark_rounds_by_mode_and_rule():
    from sim.io.errors import ConfigError
    from sim.published.predict import benchmark_rounds
    # defaults: N = 10 on agg rows; Dynamo's max(3c, 10) requests on disaggregated ones
    assert benchmark_rounds(None, "agg", 64) == 10
    assert [benchmark_rounds(None, "disagg", c) for c in (1, 2, 3, 4, 64)] == pytest.approx([10, 5, 10 / 3, 3, 3])
    assert benchmark_rounds("dynamo", "agg", 5) == 3 and benchmark_rounds(7, "disagg", 64) == 7
    for bad in (0, "ten"):
        with pytest.raises(ConfigError, match="rounds: expected an integer >= 1 or one of dynamo"):
            benchmark_rounds(bad, "agg", 4)


def test_a_fractional_benchmark_is_the_mean_over_its_requests():
    """Dynamo's 10 requests at 3 users: the first wave's 3 and 7 steady ones, N = 10 / 3."""
    first, steady = {"ttft_ms": 1000.0, "tpot_ms": 20.0}, {"ttft_ms": 100.0, "tpot_ms": 10.0}
    assert combine_cold(first, steady, 10 / 3, "spread") == pytest.approx({"ttft_ms": (3 * 1000 + 7 * 100) / 10,
                                                                          "tpot_ms": (3 * 20 + 7 * 10) / 10})


def test_rounds_dynamo_flag_and_the_report_says_both_lengths(tmp_path):
    args = ("validate-published", str(FIXTURE), "--workers", "1", "--no-progress", "--backend", "vllm",
            "--requests-per-user", "3", "--client", "fixed")
    assert capsim(*args, "--out", str(tmp_path / "a"))[0] == 0
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    assert (report["rounds"], report["disagg_rounds"]) == (10, "dynamo")
    assert capsim(*args, "--rounds", "dynamo", "--out", str(tmp_path / "b"))[0] == 0
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    row = report["rows"][0]
    n = max(3 * row["concurrency"], 10) / row["concurrency"]
    assert (report["rounds"], report["disagg_rounds"]) == ("dynamo", "dynamo")
    assert row["predicted"]["ttft_ms"] == pytest.approx(combine_cold(row["components"]["first_wave"],
                                                                     row["components"]["steady"], n, "spread")
                                                        ["ttft_ms"] + row["frontend_ms"])
    code, _, err = capsim(*args, "--rounds", "3x")
    assert code == 2 and "--rounds: expected an integer >= 1" in err and "or dynamo" in err
