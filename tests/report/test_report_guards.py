"""`capsim report` on folders it should not trust or overwrite: an existing report.html (kept unless
--force), a hand-edited or damaged summary.json (a named field, not a traceback), and a run where
nothing finished (figures drawn without matplotlib warnings)."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest

from capsim.cli import main
from tests.report.checks import check_cells, parse_page

REPO = Path(__file__).resolve().parents[2]
CHUNKED = REPO / "scenarios" / "chapter8" / "four-requests-chunked.yaml"
DELETE = object()


@pytest.fixture(scope="module")
def chunked(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("guards") / "chunked"
    assert main(["run", str(CHUNKED), "--out", str(out), "--report"]) == 0
    return out


@pytest.fixture
def folder(chunked, tmp_path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(chunked, copy)
    return copy


def test_report_keeps_an_existing_report_html_without_force(folder, capsys):
    (folder / "report.html").write_text("my notes")
    capsys.readouterr()
    assert main(["report", str(folder)]) == 2
    assert f"error: {folder}: already holds report.html; pass --force to replace it" in capsys.readouterr().err
    assert (folder / "report.html").read_text() == "my notes"
    assert main(["report", str(folder), "--force"]) == 0
    assert "<table>" in (folder / "report.html").read_text()
    # `run --out DIR --report` writes the same file through its own check: refused, then replaced with --force
    assert main(["run", str(CHUNKED), "--out", str(folder), "--report"]) == 2
    assert "already holds" in capsys.readouterr().err
    assert main(["run", str(CHUNKED), "--out", str(folder), "--report", "--force"]) == 0


def test_report_names_a_plans_run_at_capacity_and_a_folder_in_the_way(tmp_path):
    from sim.io.errors import ConfigError

    from capsim.commands.report import check_report_out
    plan = tmp_path / "plan"
    (plan / "at-capacity").mkdir(parents=True)
    (plan / "plan.json").write_text("{}")
    with pytest.raises(ConfigError, match="already holds at-capacity; pass --force to replace it"):
        check_report_out(plan, force=False)
    check_report_out(plan, force=True)
    (plan / "report.html").mkdir()
    with pytest.raises(ConfigError, match="report.html is a folder there"):
        check_report_out(plan, force=True)


@pytest.mark.parametrize("field, value, expected", [
    ("ttft_s", "x", "field 'ttft_s': expected a mapping of mean, median, p90, p99, max to numbers or null, got 'x'"),
    ("e2e_s", {"p99": "abc"}, "field 'e2e_s.p99': expected a number or null, got 'abc'"),
    ("slo_attainment", "abc", "field 'slo_attainment': expected a number or null, got 'abc'"),
    ("requests", None, "field 'requests': expected a number, got None"),
    ("completed", True, "field 'completed': expected a number, got True"),
    ("memory_fit", "yes", "field 'memory_fit': expected true or false, got 'yes'"),
    ("kv_capacity_blocks", 0, "field 'kv_capacity_blocks': expected a number above 0, got 0"),
    ("goodput_rps", DELETE, "missing key(s) goodput_rps"),
])
def test_a_damaged_summary_names_the_field(folder, capsys, field, value, expected):
    path = folder / "summary.json"
    s = json.loads(path.read_text())
    if value is DELETE:
        del s[field]
    else:
        s[field] = {**s[field], **value} if isinstance(value, dict) else value
    path.write_text(json.dumps(s))
    capsys.readouterr()
    assert main(["report", str(folder), "--force"]) == 2
    err = capsys.readouterr().err
    assert f"error: {path}: {expected}" in err
    assert "Traceback" not in err


def test_nulls_a_run_writes_are_accepted(folder):
    path = folder / "summary.json"
    s = json.loads(path.read_text())
    s.update(goodput_rps=None, slo_attainment=None, energy_j_per_good=None, ttft_s={**s["ttft_s"], "p99": None})
    path.write_text(json.dumps(s))
    assert main(["report", str(folder), "--force"]) == 0


def test_a_run_where_nothing_finished_reports_without_warnings(tmp_path):
    out = tmp_path / "none"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # a KV pool of one block: every request is rejected, no iteration runs
        assert main(["run", str(CHUNKED), "--out", str(out), "--report", "--set", "kv.budget=2359296"]) == 0
    assert [str(w.message) for w in caught] == []
    s = json.loads((out / "summary.json").read_text())
    assert (s["completed"], s["iterations"], s["rejected"]) == (0, 0, 4)
    text = (out / "report.html").read_text()
    assert check_cells(parse_page(text)[0], out) > 0
    assert 'id="fig-cdf"' in text and 'id="fig-timeline"' in text
