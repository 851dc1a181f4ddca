"""report.html of a run and of a plan: self-contained, every shown number equal to the JSON it names,
and (when Chromium is installed) loaded in a real headless browser without errors, with every figure
drawn. The quickstart report is the one whose screenshot docs/ keeps."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from capsim.cli import main
from tests.report.checks import HEADLINE, check_cells, check_headline, check_in_browser, parse_page
from tests.report.chromium import Chromium, find_chromium

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "scenarios" / "quickstart.yaml"
CAPACITY = REPO / "scenarios" / "capacity-example.yaml"
CHROMIUM = find_chromium()
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium; "
                                                              ".ci/run installs it): the browser checks cannot run")


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "quickstart"
    assert main(["run", str(QUICKSTART), "--out", str(out), "--report"]) == 0
    return out


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "plan"
    assert main(["plan", str(CAPACITY), "--out", str(out), "--requests", "120", "--replications", "2",
                 "--target-rps", "3", "--search", "scheduler.max_num_seqs=16,64", "--workers", "1", "--quiet",
                 "--report"]) == 0
    return out


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (apt-get install chromium; .ci/run installs it)")
    with Chromium(CHROMIUM) as b:
        yield b


def _self_contained(text: str) -> None:
    cells, tags = parse_page(text)
    assert "script" not in tags and "iframe" not in tags and "link" not in tags
    for attr in re.findall(r'\s(?:src|href)="([^"]*)"', text):
        assert attr.startswith(("#", "data:")), attr      # nothing fetched: anchors and inline data only
    assert "<table>" in text and '<th scope="col">' in text
    assert 'charset="utf-8"' in text


def test_run_report_is_self_contained_and_shows_the_summary(quickstart):
    text = (quickstart / "report.html").read_text()
    _self_contained(text)
    cells, _ = parse_page(text)
    check_headline(cells)
    assert check_cells(cells, quickstart) >= len(HEADLINE)
    s = json.loads((quickstart / "summary.json").read_text())
    # the scenario, the SLOs by name, memory fit with its reason, the step-time model and the figures
    for needle in ("qwen3-8b", "rtx-pro-6000-bw-ws", "chunked: max_num_seqs 64", "12.00 GiB",
                   "TTFT &lt;= 2 s, each request&#x27;s largest ITL &lt;= 0.2 s, E2E &lt;= 30 s",
                   f"{s['kv_limited_requests']:,} request(s) waited for free KV blocks",
                   "rtx-pro-6000-bw-ws__qwen3-8b__bf16__chapter.yaml", "none recorded in the profile",
                   "<strong>no</strong>: allow_extrapolation is false", 'id="fig-cdf"', 'id="fig-timeline"',
                   "slowest finished requests", "Memory does not fit"):
        assert needle in text, needle
    # the slowest request shown first is the run's slowest
    req = __import__("pandas").read_csv(quickstart / "requests.csv")
    slowest = req.loc[req["e2e_s"].idxmax()]
    assert f'<tr><th scope="row">{int(slowest["id"])}</th>' in text


def test_report_command_writes_the_same_bytes(quickstart, tmp_path, capsys):
    first = (quickstart / "report.html").read_bytes()
    copy = tmp_path / "copy"
    shutil.copytree(quickstart, copy)
    assert main(["report", str(copy), "--force"]) == 0
    assert "report.html" in capsys.readouterr().out
    again = (copy / "report.html").read_bytes()
    assert again.replace(str(copy).encode(), b"DIR") == first.replace(str(quickstart).encode(), b"DIR")


def test_report_of_a_folder_without_scenario(quickstart, tmp_path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in ("summary.json", "requests.csv", "iterations.csv"):
        shutil.copy(quickstart / f, bare / f)
    assert main(["report", str(bare)]) == 2
    assert "no scenario.json" in capsys.readouterr().err
    assert main(["report", str(bare), "--scenario", str(CAPACITY)]) == 2
    err = capsys.readouterr().err
    assert "scenario 'quickstart' seed 0 was run, but the scenario given is 'capacity-example'" in err
    assert main(["report", str(bare), "--scenario", str(QUICKSTART)]) == 0
    assert (bare / "report.html").exists()
    # from here on the folder holds report.html: each try passes --force to get to the check it shows
    # the same name and seed, another scenario: a field summary.json's setup names, then one only the digest holds
    assert main(["report", str(bare), "--force", "--scenario", str(QUICKSTART), "--set", "slo.ttft_s=3"]) == 2
    assert "setup.slo is {'ttft_s': 2.0" in capsys.readouterr().err
    assert main(["report", str(bare), "--force", "--scenario", str(QUICKSTART), "--set",
                 "scheduler.max_num_seqs=63"]) == 2
    assert "the scenario given is not the one run (setup.scenario_sha256 differs" in capsys.readouterr().err
    whole = (bare / "requests.csv").read_text()
    cut = whole[:whole.index("\n", len(whole) // 2) + 20]  # a file cut off inside a row
    (bare / "requests.csv").write_text(cut)
    assert main(["report", str(bare), "--force", "--scenario", str(QUICKSTART)]) == 2
    assert f"requests.csv: line {cut.count(chr(10)) + 1}: no value in " in capsys.readouterr().err
    rows = whole.splitlines(keepends=True)
    (bare / "requests.csv").write_text("".join(rows[:-3]))  # cut at a row's end: only the count tells
    assert main(["report", str(bare), "--force", "--scenario", str(QUICKSTART)]) == 2
    assert (f"requests.csv: {len(rows) - 4:,} rows, but summary.json says {len(rows) - 1:,} requests (a file cut "
            "short, or files of two runs)") in capsys.readouterr().err
    (bare / "requests.csv").write_text("id,status\n0,finished\n")
    assert main(["report", str(bare), "--force", "--scenario", str(QUICKSTART)]) == 2
    assert "requests.csv: missing column(s)" in capsys.readouterr().err
    (bare / "requests.csv").write_text(whole)
    (bare / "summary.json").write_bytes(b"\xff\xfe{}")
    assert main(["report", str(bare), "--force", "--scenario", str(QUICKSTART)]) == 2
    assert "summary.json: not a UTF-8 text file" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "not a folder" in capsys.readouterr().err
    assert main(["run", str(QUICKSTART), "--report"]) == 2
    assert "--report needs --out" in capsys.readouterr().err


def test_extrapolation_is_reported(tmp_path):
    out = tmp_path / "beyond"
    assert main(["run", str(QUICKSTART), "--out", str(out), "--report", "--set", "scheduler.max_num_seqs=96",
                 "--set", "step_time.allow_extrapolation=true", "--set", "workload.max_requests=600"]) == 0
    text = (out / "report.html").read_text()
    s = json.loads((out / "summary.json").read_text())
    its = __import__("pandas").read_csv(out / "iterations.csv")
    assert its["batch_size"].max() > 64      # beyond the profile's max_batch
    assert "<strong>yes</strong>: the run went beyond the measured range" in text
    assert f"<td>{its['batch_size'].max()}</td><td>BEYOND</td>" in text
    assert "Step-time model extrapolated (yes)" in text
    assert "scheduler.max_num_seqs=96" in text
    assert check_cells(parse_page(text)[0], out) > 0 and s["scenario"] == "quickstart"


def test_plan_report_shows_plan_json_and_the_run_at_capacity(plan):
    text = (plan / "report.html").read_text()
    _self_contained(text)
    cells, _ = parse_page(text)
    assert check_cells(cells, plan) > 40
    keys = {(c["source"], c["key"]) for c in cells}
    for k in ("capacity.per_replica_rps", "capacity.interval_per_replica_rps.0", "replicas.simulated_replicas",
              "rates.0.attainment", "search.0.gpu_hours_per_million_good"):
        assert ("plan.json", k) in keys, k
    check_headline(cells, "at-capacity/summary.json")
    p = json.loads((plan / "plan.json").read_text())
    rec = json.loads((plan / "at-capacity" / "scenario.json").read_text())
    assert f"workload.arrival.rate_rps={p['capacity']['rate_rps']!r}" in rec["overrides"]
    assert rec["scenario"]["workload"]["num_requests"] == 120
    for fig in ("fig-goodput", "fig-replicas", "fig-plane", "cap-fig-cdf", "cap-fig-timeline"):
        assert f'id="{fig}"' in text, fig
    # plan.json's warnings (a capacity measured on runs too short to build a queue) are shown with the capacity
    from sim.report.plan import capacity_section
    assert "Warning: short run: a test." in capacity_section(dict(p, warnings=["short run: a test"]))
    assert "Warning:" not in capacity_section(dict(p, warnings=[]))


@needs_chromium
def test_run_report_in_chromium(quickstart, browser):
    seen = check_in_browser(browser, quickstart / "report.html")
    assert seen["figures"] == 2
    check_headline(seen["cell_list"])
    # readable: the headline table's first row is TTFT, and the page has a real heading structure
    assert browser.evaluate("document.querySelector('h1').textContent") == "capsim report: quickstart"
    assert browser.evaluate("document.querySelectorAll('table').length") >= 4


@needs_chromium
def test_plan_report_in_chromium(plan, browser):
    seen = check_in_browser(browser, plan / "report.html")
    assert seen["figures"] == 5
    check_headline(seen["cell_list"], "at-capacity/summary.json")


def test_every_shipped_scenario_reports(tmp_path):
    """Each scenario under scenarios/ gets a report whose numbers are its summary's, with both figures drawn."""
    scenarios = sorted((REPO / "scenarios").rglob("*.yaml"))
    browser = Chromium(CHROMIUM) if CHROMIUM else None
    try:
        for path in scenarios:
            out = tmp_path / path.stem
            assert main(["run", str(path), "--out", str(out), "--report"]) == 0, path
            cells, _ = parse_page((out / "report.html").read_text())
            check_headline(cells)
            check_cells(cells, out)
            if browser is not None:
                assert check_in_browser(browser, out / "report.html")["figures"] == 2, path
    finally:
        if browser is not None:
            browser.close()


def test_multi_gpu_and_disaggregated_reports_count_per_gpu_and_every_gpu(tmp_path):
    """A TP4 replica's memory fit is judged per GPU (what one card holds) and its GPU-seconds note counts its four
    GPUs; a disaggregated run's layout, memory and GPU-seconds name both pools."""
    tp4 = tmp_path / "tp4"
    assert main(["run", str(REPO / "scenarios" / "parallel" / "llama-3.1-70b-tp4-h100.yaml"), "--set",
                 "workload.num_requests=12", "--out", str(tp4), "--report"]) == 0
    text, s = (tp4 / "report.html").read_text(), json.loads((tp4 / "summary.json").read_text())
    par = s["parallel"]
    per_gpu = par["weights_bytes_per_gpu"] + par["kv_budget_bytes_per_gpu"] + par["activation_bytes_per_gpu"]
    assert f"= {per_gpu / 2**30:.2f} GiB per GPU of the card" in text
    assert "GPU-seconds: 4 GPU(s) (1 replica(s) x 4)" in text and "1 replica(s) x 4 h100-sxm (tp 4)" in text
    assert "ops model: tp 1" not in text and "ops model: mixed" in text
    dis = tmp_path / "dis"
    assert main(["run", str(REPO / "scenarios" / "disagg-llama-3.1-70b-h100.yaml"), "--set",
                 "workload.num_requests=12", "--out", str(dis), "--report"]) == 0
    text, s = (dis / "report.html").read_text(), json.loads((dis / "summary.json").read_text())
    pools = s["disaggregation"]
    assert "prefill pool: weights" in text and "; decode pool: weights" in text
    assert (f"GPU-seconds: {s['gpus']} GPUs (prefill {pools['prefill']['replicas']} x "
            f"{pools['prefill']['gpus_per_replica']}, decode {pools['decode']['replicas']} x "
            f"{pools['decode']['gpus_per_replica']})") in text
    assert f"decode pool {pools['decode']['replicas']} replica(s) x {pools['decode']['gpus_per_replica']} h100-sxm" in text
