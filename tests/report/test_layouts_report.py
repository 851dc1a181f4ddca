"""report.html of a layout plan (`capsim plan --gpus ... --report`, or `capsim report` on its folder): self-contained,
every shown number equal to the layouts.json key it names, the ranking drawn, the plan's warnings shown."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from capsim.cli import main
from tests.report.checks import check_cells, check_in_browser, parse_page
from tests.report.test_report import _self_contained, browser, needs_chromium  # noqa: F401 (browser: a fixture)
from tests.sim.test_plan_layouts import CASE


@pytest.fixture(scope="module")
def layouts(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("layouts")
    scenario = root / "case.yaml"
    scenario.write_text(CASE)
    out = root / "out"
    assert main(["plan", str(scenario), "--gpus", "3", "--tp", "1,2", "--out", str(out), "--workers", "1", "--quiet",
                 "--replications", "1", "--report"]) == 0
    return out


def test_layout_plan_report_shows_layouts_json(layouts):
    text = (layouts / "report.html").read_text()
    _self_contained(text)
    cells, _ = parse_page(text)
    plan = json.loads((layouts / "layouts.json").read_text())
    assert check_cells(cells, layouts) == 8 * len(plan["deployments"])  # eight numbers a row
    keys = {(c["source"], c["key"]) for c in cells}
    for k in ("deployments.0.capacity_rps", "deployments.0.goodput_per_gpu_rps", "deployments.0.bracket_rps.1",
              "deployments.0.attainment_at_capacity"):
        assert ("layouts.json", k) in keys, k
    best = plan["deployments"][0]
    assert f"Best of {len(plan['deployments'])} deployment(s) of 3 x h100-sxm: {best['deployment']}" in text
    assert 'id="fig-layouts"' in text
    # the targets the capacities were searched for, and the plan's warning (the case's KV budget is in bytes)
    assert plan["slo"] == {"e2e_s": 0.3} and plan["attainment_target"] == 0.9 and plan["replications"] == 1
    assert "E2E &lt;= 0.3 s" in text and "kv.budget is given in bytes (8 GiB)" in text


def test_report_command_on_a_layout_plan(layouts, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(layouts, copy)
    assert main(["report", str(copy)]) != 0  # report.html is there: refused without --force
    assert "already holds report.html; pass --force" in capsys.readouterr().err
    assert main(["report", str(copy), "--force"]) == 0
    first = (layouts / "report.html").read_bytes().replace(str(layouts).encode(), b"DIR")
    assert (copy / "report.html").read_bytes().replace(str(copy).encode(), b"DIR") == first
    capsys.readouterr()
    assert main(["report", str(copy), "--force", "--scenario", "x.yaml"]) != 0
    assert "a layout plan's report is drawn from its layouts.json alone" in capsys.readouterr().err


def test_a_layout_plan_without_any_capacity_says_so(layouts, tmp_path):
    from sim.report.layouts import layouts_page
    folder = tmp_path / "none"
    folder.mkdir()
    plan = json.loads((layouts / "layouts.json").read_text())
    for r in plan["deployments"]:
        r.update(capacity_rps=None, goodput_per_gpu_rps=None, bracket_rps=None, note="missed at every rate")
    (folder / "layouts.json").write_text(json.dumps(plan))
    page = layouts_page(folder)
    assert page.lead.startswith(f"None of the {len(plan['deployments'])} deployment(s) of 3 x h100-sxm has a goodput")
    assert "fig-layouts" not in page.render()


@needs_chromium
def test_layout_plan_report_in_chromium(layouts, browser):
    seen = check_in_browser(browser, layouts / "report.html")
    assert seen["figures"] == 1
