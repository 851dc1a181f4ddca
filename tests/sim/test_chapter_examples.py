"""Reference sections 2 and 5 through `capsim run`: the four-request example and the timelines."""

import json

import pandas as pd
import pytest

from capsim.cli import main

from tests.sim.helpers import REPO_SCENARIOS

# reference section 5: makespan and longest output interval, ms (two-decimal values derived there)
FOUR_REQUESTS = {
    "fixed": (870.47, 26.31, {0: (163.33, 347.16), 1: (163.33, 189.62), 2: (791.65, 817.96), 3: (791.65, 870.47)}),
    "continuous": (765.59, 375.97, {0: (163.33, 765.59), 1: (163.33, 189.62), 2: (565.59, 591.90), 3: (686.71, 765.59)}),
    "chunked": (844.25, 132.56, {0: (163.33, 765.48), 1: (163.33, 189.62), 2: (644.36, 670.67), 3: (765.48, 844.25)}),
}


@pytest.mark.parametrize("policy", list(FOUR_REQUESTS))
def test_four_requests(policy, tmp_path, capsys):
    out = tmp_path / policy
    assert main(["run", str(REPO_SCENARIOS / "chapter8" / f"four-requests-{policy}.yaml"), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    makespan, longest, times = FOUR_REQUESTS[policy]
    assert round(summary["makespan_s"] * 1e3, 2) == makespan
    assert round(summary["itl_s"]["max"] * 1e3, 2) == longest
    reqs = pd.read_csv(out / "requests.csv").set_index("id")
    for rid, (first, last) in times.items():
        assert round(reqs.loc[rid, "first_token_s"] * 1e3, 2) == first
        assert round(reqs.loc[rid, "finish_s"] * 1e3, 2) == last
    assert "makespan" in capsys.readouterr().out


def test_single_request_timeline(tmp_path):
    """0.1 s outside wait + 0.096 s + 255 x 26.5 ms = 6.95 s, TTFT 0.196 s, 0.05 s under 7 s."""
    out = tmp_path / "one"
    assert main(["run", str(REPO_SCENARIOS / "chapter8" / "single-request-timeline.yaml"), "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert round(s["e2e_s"]["max"], 2) == 6.95
    assert round(s["ttft_s"]["max"], 3) == 0.196
    assert s["good"] == 1


def test_extra_prefill_misses_deadline(tmp_path):
    """One extra 2K prefill mid-generation: one interval ~123 ms, total 7.05 s, past the 7 s deadline."""
    out = tmp_path / "two"
    reqs = ("workload.requests=[{arrival_s: 0.0, outside_wait_s: 0.1, prompt_tokens: 2048, output_tokens: 256},"
            " {arrival_s: 3.0, prompt_tokens: 2048, output_tokens: 1}]")
    assert main(["run", str(REPO_SCENARIOS / "chapter8" / "single-request-timeline.yaml"), "--set", reqs,
                 "--out", str(out)]) == 0
    r0 = pd.read_csv(out / "requests.csv").set_index("id").loc[0]
    assert round(r0["e2e_s"], 2) == 7.05
    assert r0["max_itl_s"] == pytest.approx(0.0265 + 0.096)  # 122.5 ms: "about 123 ms"
    assert not r0["met_slo"]
