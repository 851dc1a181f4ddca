"""The benchmark client a published row is replayed as (sim.published.client): disaggregated rows as InferenceX's
SA-Bench ran them (every user at once, 10 requests each, lengths uniform on [int(0.8 L), L], round-robin over each
pool's workers), agg rows as before (`fixed`)."""

import dataclasses
import json

import pytest

from sim.io.errors import ConfigError
from sim.published.client import SA_BENCH_REQUESTS_PER_USER, client_for, sa_bench_lengths
from sim.published.predict import build_case, simulate_case
from sim.published.rows import read_published
from tests.published.test_disagg_rows import FIXTURE as DISAGG
from tests.published.test_validate_published import FIXTURE, capsim


def _rows():
    ds, _ = read_published(DISAGG)
    agg = next(r for r in read_published(FIXTURE) if r.mode == "agg")
    return ds, agg


def test_a_disaggregated_row_replays_as_sa_bench_by_default():
    ds, _ = _rows()
    case = build_case(ds)
    w = case.scenario["workload"]
    assert case.start == "burst"
    assert w["users"] == ds.concurrency == 64 and w["num_requests"] == 64 * SA_BENCH_REQUESTS_PER_USER
    assert w["prompt_tokens"] == {"kind": "uniform", "low": 6553, "high": 8192}  # int(0.8 x 8192)
    assert w["output_tokens"] == {"kind": "uniform", "low": 819, "high": 1024}
    assert case.scenario["cluster"]["router"] == {"kind": "round_robin"}


def test_the_fixed_client_keeps_fixed_lengths_and_the_cold_recombination():
    ds, agg = _rows()
    for case in (build_case(ds, client="fixed"), build_case(agg)):
        w = case.scenario["workload"]
        assert case.start == "cold" and w["prompt_tokens"]["kind"] == "fixed" and "cluster" not in case.scenario
    case = build_case(agg, client="sa_bench")  # an agg row can be asked for it too
    assert case.start == "burst" and case.scenario["workload"]["output_tokens"]["kind"] == "uniform"


def test_client_choices_and_lengths():
    assert (client_for("disagg", "auto"), client_for("agg", "auto")) == ("sa_bench", "fixed")
    assert client_for("disagg", "fixed") == "fixed"
    with pytest.raises(ConfigError, match="client: expected one of auto, sa_bench, fixed, got 'aiperf'"):
        client_for("agg", "aiperf")
    assert sa_bench_lengths(1) == {"kind": "fixed", "value": 1}
    assert sa_bench_lengths(10) == {"kind": "uniform", "low": 8, "high": 10}


def test_an_sa_bench_replay_counts_every_request_and_is_deterministic():
    """Every user's 10 requests are simulated and counted (burst: no first-wave recombination), the drawn lengths come
    from the scenario seed, so the same row gives the same result, and another seed another one."""
    ds, _ = _rows()
    row = dataclasses.replace(ds, concurrency=4)
    one, two = (simulate_case(None, build_case(row)) for _ in range(2))
    assert "components" not in one and one["ttft_ms"] > 0 and one == two
    assert simulate_case(None, build_case(row, seed=1))["ttft_ms"] != one["ttft_ms"]
    assert simulate_case(None, build_case(row, client="fixed"))["ttft_ms"] != one["ttft_ms"]


def test_options_of_the_fixed_client_are_refused_where_a_row_replays_as_sa_bench(tmp_path):
    args = ("validate-published", str(DISAGG), "--workers", "1", "--no-progress")
    for extra in (("--rounds", "3"), ("--start", "burst"), ("--requests-per-user", "4")):
        code, _, err = capsim(*args, *extra)
        assert code == 2 and "shape the fixed client" in err and "disagg rows replay as sa_bench" in err, err
    code, _, err = capsim(*args, "--rounds", "3", "--client", "fixed", "--out", str(tmp_path / "f"))
    assert code == 0, err
    assert json.loads((tmp_path / "f" / "report.json").read_text())["client"] == {"agg": "fixed", "disagg": "fixed"}
    code, _, err = capsim(*args, "--out", str(tmp_path / "a"))
    assert code == 0, err
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    assert report["client"] == {"agg": "fixed", "disagg": "sa_bench"}
    assert "components" not in report["rows"][0]


def test_agg_client_compare_groups_rows_by_collection_and_scores_both_replays(tmp_path):
    """benchmarks/agg_client_compare.py: the rows both replays predicted, grouped by the collection read from each
    row's silicon_data_source (InferenceX's database and its CSV exports against the others); single-GPU rows only
    with --all; disaggregated rows and rows one replay skipped take no part."""
    import csv
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location(
        "agg_client_compare", Path(__file__).parents[2] / "benchmarks" / "agg_client_compare.py")
    cc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cc)
    sources = {"a": "db-dump/2026-04-27; config_id=1", "b": "source_file=2026-03-25.csv; model=X",
               "c": "source_file=/x/aic-auto-gap-analysis/data/h100/vllm.csv", "d": "db-dump/2026-04-27; config_id=2",
               "e": "db-dump/2026-04-27; config_id=3", "f": "db-dump/2026-04-27; config_id=4"}
    tp = {"a": 2, "b": 4, "c": 8, "d": 1, "e": 2, "f": 2}
    with open(tmp_path / "sample.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["id", "silicon_data_source", "tp_size", "pp_size", "moe_ep_size"])
        w.writeheader()
        w.writerows({"id": i, "silicon_data_source": s, "tp_size": tp[i], "pp_size": 1, "moe_ep_size": ""}
                    for i, s in sources.items())

    def row(i, line, ttft, mode="agg"):
        return {"id": i, "line": line, "mode": mode, "backend": "vllm",
                "predicted": {"ttft_ms": ttft, "tpot_ms": 10.0}, "measured": {"ttft_ms": 100.0, "tpot_ms": 10.0},
                "error": {"ttft_ms": ttft / 100 - 1, "tpot_ms": 0.0}}
    before = [row("a", 2, 90.0), row("b", 3, 70.0), row("c", 4, 150.0), row("d", 5, 100.0), row("e", 6, 50.0, "disagg"),
              row("f", 7, 100.0)]
    after = [row("a", 2, 110.0), row("b", 3, 95.0), row("c", 4, 75.0), row("d", 5, 50.0), row("e", 6, 50.0, "disagg")]
    for name, rows in (("before", before), ("after", after)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"rows": rows}))
    table = {g["group"]: g for g in cc.compare(str(tmp_path / "before.json"), str(tmp_path / "after.json"),
                                               str(tmp_path / "sample.csv"))}
    assert table["all"]["n"] == 3  # d is single-GPU, e disaggregated, f skipped by AFTER
    assert table["InferenceX"]["n"] == 2 and table["other collections"]["n"] == 1
    assert table["InferenceX"]["before_ttft"] == (pytest.approx(0.2), pytest.approx(-0.2), 1)  # -10%, -30%
    assert table["InferenceX"]["after_ttft"] == (pytest.approx(0.075), pytest.approx(0.025), 2)  # +10%, -5%
    assert table["gap-analysis vllm"]["before_ttft"][2] == 0 and table["gap-analysis vllm"]["after_ttft"][2] == 0
    everything = {g["group"]: g for g in cc.compare(str(tmp_path / "before.json"), str(tmp_path / "after.json"),
                                                    str(tmp_path / "sample.csv"), every_row=True)}
    assert everything["all"]["n"] == 4 and everything["db-dump vllm"]["after_ttft"][0] == pytest.approx(0.3)


def test_sglang_launch_flags_reads_inferencex_limits_and_summarises_complete_rows(tmp_path):
    """benchmarks/sglang_launch_flags.py: InferenceX's SGLang DeepSeek limits by precision, TP and users, and a summary
    that scores each way only on rows every way finished (a row one way skipped counts in none)."""
    import csv
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location(
        "sglang_launch_flags", Path(__file__).parents[2] / "benchmarks" / "sglang_launch_flags.py")
    fl = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fl)
    assert fl.launch_flags("fp8", 8, 16) == {"running": 128, "chunk": 32768, "fraction": 0.82, "recv": 30}
    assert fl.launch_flags("fp8", 8, 8)["recv"] == 10 and fl.launch_flags("fp8", 4, 64)["recv"] == 10
    assert fl.launch_flags("fp4", 8, 4) == {"running": 256, "chunk": 16384, "fraction": 0.85, "recv": 10}
    with open(tmp_path / "sample.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["id", "silicon_ttft_ms", "silicon_tpot_ms"])
        w.writeheader()
        w.writerows({"id": i, "silicon_ttft_ms": 100.0, "silicon_tpot_ms": 10.0} for i in range(3))  # lines 2-4
    out = [[2, w, t, 10.0, None] for w, t in zip(fl.WAYS, (100.0, 50.0, 90.0, 130.0))]
    out += [[3, w, t, 11.0, None] for w, t in zip(fl.WAYS, (110.0, 60.0, 70.0, 100.0))]
    out += [[4, w, 100.0, 10.0, "skipped" if w == "sa_bench" else None] for w in fl.WAYS]
    (tmp_path / "out.jsonl").write_text("\n".join(json.dumps(x) for x in out) + "\n")
    got = {s["way"]: s for s in fl.summary(str(tmp_path / "out.jsonl"), str(tmp_path / "sample.csv"))}
    assert got["fixed"]["rows"] == 2 and got["sa_bench"]["rows"] == 2  # line 4 is every way's but counts in none
    assert got["sa_bench"]["ttft"] == pytest.approx(0.45) and got["sa_bench"]["within_20"] == 0
    assert got["sa_bench+flags"]["ttft"] == pytest.approx(0.15) and got["sa_bench+flags"]["within_20"] == 1
    assert got["fixed"]["tpot"] == pytest.approx(0.05)
