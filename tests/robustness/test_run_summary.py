"""capsim run says what it ran and how far to trust it: model, card, scheduler, the SLOs behind
"SLO attainment", the step-time model's fit error (also in summary.json's `setup`), and why memory
does not fit."""

from __future__ import annotations

import json

from capsim.cli import main
from tests.sim.helpers import REPO_SCENARIOS


def test_summary_json_names_the_setup(capsys):
    assert main(["run", str(REPO_SCENARIOS / "capacity-example.yaml"), "--set", "workload.num_requests=3",
                 "--json"]) == 0
    setup = json.loads(capsys.readouterr().out)["setup"]
    digest = setup.pop("scenario_sha256")
    assert len(digest) == 64 and int(digest, 16) >= 0
    assert main(["run", str(REPO_SCENARIOS / "capacity-example.yaml"), "--set", "workload.num_requests=4",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["setup"]["scenario_sha256"] != digest
    assert setup == {"model": "qwen3-8b", "hardware": "rtx-pro-6000-bw-ws", "scheduler": "chunked",
                     "slo": {"ttft_s": 2.0, "itl_s": None, "itl_stat": "max", "e2e_s": 20.0},
                     "step_time_fit": {"kind": "linear", "profile": None, "mape": None, "max_abs_rel_err": None,
                                       "n_heldout": None,
                                       "unknown": "the coefficients are typed into the scenario, not fitted"}}


def test_fitted_profile_error_is_printed(capsys):
    scenario = REPO_SCENARIOS / "validation" / "cpu-qwen0.5b-continuous.yaml"
    assert main(["run", str(scenario), "--set", "workload.num_requests=3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("qwen2.5-0.5b on cpu-epyc-2c, continuous scheduler; step-time model profile "
                               "(linear): fit error held-out error ")
    assert "of cpu__qwen2.5-0.5b__bf16.yaml" in lines[1]


def test_why_memory_does_not_fit_and_which_slos(capsys):
    assert main(["run", str(REPO_SCENARIOS / "chapter8" / "scheme-a-6gib.yaml")]) == 0
    out = capsys.readouterr().out
    assert "SLO attainment 0.000 (E2E <= 7 s)" in out
    assert "memory fit NO (" in out and "request(s) waited for KV" in out


def test_version(capsys):
    import pytest

    from capsim import __version__
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"capsim {__version__}" and __version__[0].isdigit()


def test_a_disaggregated_misfit_names_its_pool(capsys):
    """The verdict had quoted the scenario's own budget (which fits) instead of the pool's that does not."""
    pools = "disaggregation={prefill: {replicas: 1, kv_budget: 200GiB}, decode: {replicas: 1}, link: {bandwidth_gbs: 50}}"
    assert main(["run", str(REPO_SCENARIOS / "capacity-example.yaml"), "--set", "workload.num_requests=3",
                 "--set", pools]) == 0
    out = capsys.readouterr().out
    assert ("memory fit NO (prefill pool: weights 15.26 GiB + KV budget 200.00 GiB (+ activations) exceed its "
            "replica's 1 card)") in out
