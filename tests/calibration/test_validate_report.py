"""`capsim validate --report`: the validation's report.html shows validation.json's numbers (simulated,
measured, error) and the simulated run's headline, and loads cleanly in headless Chromium."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.report.checks import check_cells, check_headline, check_in_browser, parse_page
from tests.report.chromium import Chromium, find_chromium


@pytest.fixture
def scenario(tmp_path, tiny_run):
    from calibration.shapes import tiny_model_profile
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(tiny_model_profile().model_dump(mode="json")))
    sc = {"name": "tiny-report", "seed": 3, "model": "tiny.yaml", "hardware": "l4",
          "kv": {"budget": "64MiB", "block_tokens": 16, "format": "bf16"},
          "scheduler": {"kind": "chunked", "max_num_seqs": 4, "max_num_batched_tokens": 24, "chunk_tokens": 16},
          "step_time": {"model": {"kind": "profile", "path": str(tiny_run[1].profile_path)},
                        "allow_extrapolation": True},
          "workload": {"kind": "synthetic", "num_requests": 8, "arrival": {"kind": "poisson", "rate_rps": 300},
                       "prompt_tokens": {"kind": "uniform", "low": 3, "high": 30},
                       "output_tokens": {"kind": "uniform", "low": 2, "high": 10}},
          "slo": {"ttft_s": 0.05, "e2e_s": 0.5}}
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(sc))
    return path


def test_validation_report(tmp_path, scenario, tiny_run, capsys):
    pytest.importorskip("torch", reason="the replay needs torch")
    from capsim.cli import main
    out = tmp_path / "val"
    rc = main(["validate", str(scenario), "--device", "cpu", "--out", str(out), "--rates", "200,2000",
               "--seeds", "2", "--model-draws", "2", "--threads", "1", "--quiet", "--report"])
    assert rc == 0
    assert f"wrote {out / 'report.html'}" in capsys.readouterr().out
    text = (out / "report.html").read_text()
    cells, tags = parse_page(text)
    assert "script" not in tags
    assert check_cells(cells, out) > 60
    v = json.loads((out / "validation.json").read_text())
    keys = {(c["source"], c["key"]) for c in cells}
    for i in range(2):
        for k in ("ttft_s.median.simulated", "ttft_s.median.measured", "e2e_s.p99.rel_error", "makespan_s.rel_error"):
            assert ("validation.json", f"points.{i}.metrics.{k}") in keys
    check_headline(cells, "rate-200/simulated/summary.json")
    assert "Simulated against measured (rate_rps 2000)" in text and v["points"][1]["rate_rps"] == 2000
    for fig in ("fig-val-cdf-0", "fig-val-scatter-1", "sim-fig-cdf", "sim-fig-timeline"):
        assert f'id="{fig}"' in text
    # the regenerated report (from validation.json's own record of the scenario) is the same page
    first = (out / "report.html").read_bytes()
    (out / "scenario.json").unlink()
    assert main(["report", str(out), "--force"]) == 0
    assert (out / "report.html").read_bytes() == first
    exe = find_chromium()
    if exe is None:
        pytest.skip("Chromium is not installed (apt-get install chromium; .ci/run installs it): browser check skipped")
    with Chromium(exe) as browser:
        seen = check_in_browser(browser, out / "report.html")
    assert seen["figures"] == 6
