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
