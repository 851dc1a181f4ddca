"""An ops step-time model has no fit error of its own; a run on a card's kernel tables quotes how far the ops
model was from published serving runs on that card (profiles/ops/published_check.yaml, written by
benchmarks/published_check.py), and says so when none were checked."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from capsim.cli import main
from sim.io.errors import ConfigError
from sim.io.published_check import CHECK_FILE, PublishedCheck, card_check, check_path, check_text
from sim.models.ops_tables import known_table_sets
from tests.sim.helpers import REPO_SCENARIOS

REPO = Path(__file__).resolve().parents[2]
TP4 = REPO_SCENARIOS / "parallel" / "llama-3.1-70b-tp4-h100.yaml"


def _generator():
    spec = importlib.util.spec_from_file_location("published_check", REPO / "benchmarks" / "published_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_shipped_check_covers_table_sets_that_exist():
    check = PublishedCheck.model_validate(yaml.safe_load(check_path().read_text()))
    assert check.cards and set(check.cards) <= set(known_table_sets())
    for groups in check.cards.values():
        assert {g.engine for g in groups} <= {"vllm", "sglang", "trtllm"} and {g.mode for g in groups} <= {"agg", "disagg"}
        for g in groups:
            assert g.ttft_median_abs_error <= g.ttft_p90_abs_error and g.tpot_median_abs_error <= g.tpot_p90_abs_error


def test_a_run_on_checked_tables_quotes_the_check(capsys):
    assert main(["run", str(TP4), "--set", "workload.num_requests=3", "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)["setup"]["step_time_fit"]
    assert fit["unknown"] == "an ops model is composed from kernel tables, not fitted"
    published = fit["published"]
    assert published == card_check("h100-sxm") and published["tables"] == "h100-sxm"
    vllm = [g for g in published["groups"] if g["engine"] == "vllm" and g["mode"] == "agg"]
    assert len(vllm) == 1 and vllm[0]["runs"] > 100
    assert main(["run", str(TP4), "--set", "workload.num_requests=3"]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line.endswith("; " + check_text(published))
    assert (f"vLLM {vllm[0]['ttft_median_abs_error']:.1%} / {vllm[0]['tpot_median_abs_error']:.1%} / "
            f"{vllm[0]['e2e_median_abs_error']:.1%} over {vllm[0]['runs']:,} runs") in line
    assert "median |error| TTFT / TPOT / E2E: " in line


def test_tables_without_a_check_say_so(capsys, tmp_path):
    # tables given as a folder path: the check is per named table set, so none applies
    folder = REPO / "profiles" / "ops" / "h100-sxm"
    assert main(["run", str(TP4), "--set", "workload.num_requests=3", "--set", f"step_time.model.tables={folder}",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["setup"]["step_time_fit"]["published"] is None
    assert main(["run", str(TP4), "--set", "workload.num_requests=3", "--set", f"step_time.model.tables={folder}"]) == 0
    assert capsys.readouterr().out.splitlines()[1].endswith("; no published serving runs checked on its tables")


def test_a_malformed_check_file_names_the_file_and_field(tmp_path, monkeypatch):
    (tmp_path / "ops").mkdir()
    bad = tmp_path / "ops" / CHECK_FILE
    bad.write_text("source: s\ncommit: c\ndate: d\ncards:\n  h100-sxm:\n  - {engine: vllm, mode: agg, runs: 0,\n"
                   "     ttft_median_abs_error: 0.1, ttft_p90_abs_error: 0.2, tpot_median_abs_error: 0.1,\n"
                   "     tpot_p90_abs_error: 0.2}\n")
    monkeypatch.setenv("CAPSIM_PROFILES", str(tmp_path))
    with pytest.raises(ConfigError) as exc:
        card_check("h100-sxm")
    assert str(bad) in str(exc.value) and "runs" in str(exc.value)
    bad.unlink()
    assert card_check("h100-sxm") is None  # no file: no check, not an error


def test_a_check_written_before_e2e_was_reported_still_reads(tmp_path, monkeypatch):
    (tmp_path / "ops").mkdir()
    old = tmp_path / "ops" / CHECK_FILE
    group = ("{engine: vllm, mode: agg, runs: 3, ttft_median_abs_error: 0.1, ttft_p90_abs_error: 0.2, "
             "tpot_median_abs_error: 0.05, tpot_p90_abs_error: 0.1")
    old.write_text(f"source: s\ncommit: c\ndate: d\ncards:\n  h100-sxm:\n  - {group}}}\n")
    monkeypatch.setenv("CAPSIM_PROFILES", str(tmp_path))
    assert check_text(card_check("h100-sxm")) == ("against published serving runs on h100-sxm, median |error| "
                                                  "TTFT / TPOT: vLLM 10.0% / 5.0% over 3 runs; docs/fidelity.md")
    (tmp_path / "new" / "ops").mkdir(parents=True)  # another file: a check file is read once per path
    (tmp_path / "new" / "ops" / CHECK_FILE).write_text(
        f"source: s\ncommit: c\ndate: d\ncards:\n  b200:\n  - {group}, e2e_median_abs_error: 0.04, "
        "e2e_p90_abs_error: 0.09}\n")
    monkeypatch.setenv("CAPSIM_PROFILES", str(tmp_path / "new"))
    assert check_text(card_check("b200")) == ("against published serving runs on b200, median |error| "
                                              "TTFT / TPOT / E2E: vLLM 10.0% / 5.0% / 4.0% over 3 runs; docs/fidelity.md")
    # a card whose groups do not all have E2E quotes TTFT / TPOT for all of them
    mixed = {"tables": "x", "groups": [dict(PublishedCheck.model_validate(yaml.safe_load(
        (tmp_path / "new" / "ops" / CHECK_FILE).read_text())).cards["b200"][0].model_dump()),
        {"engine": "sglang", "mode": "agg", "runs": 2, "ttft_median_abs_error": 0.2, "ttft_p90_abs_error": 0.3,
         "tpot_median_abs_error": 0.1, "tpot_p90_abs_error": 0.2}]}
    assert check_text(mixed) == ("against published serving runs on x, median |error| TTFT / TPOT: vLLM 10.0% / 5.0% "
                                 "over 3 runs; SGLang 20.0% / 10.0% over 2 runs; docs/fidelity.md")
    with pytest.raises(ValueError, match="e2e_median_abs_error and e2e_p90_abs_error: give both or neither"):
        PublishedCheck.model_validate({"source": "s", "commit": "c", "date": "d", "cards": {"b200": [
            {"engine": "vllm", "mode": "agg", "runs": 1, "ttft_median_abs_error": 0.1, "ttft_p90_abs_error": 0.2,
             "tpot_median_abs_error": 0.1, "tpot_p90_abs_error": 0.2, "e2e_median_abs_error": 0.1}]}})


def _report(path: Path, rows: list[dict], **settings) -> Path:
    base = {"file": "../x/sample.csv", **_generator().DEFAULTS, **_generator().DISAGG_DEFAULTS}
    path.write_text(json.dumps({**base, **settings, "rows": rows}))
    return path


def _row(line, system, backend, mode, ttft, tpot):
    """A replayed row of OSL 10: measured E2E 100 + 9 x 10 = 190 ms, predicted ttft + 9 x tpot."""
    e2e = ttft + 9 * tpot
    return {"line": line, "system": system, "backend": backend, "mode": mode, "osl": 10,
            "measured": {"ttft_ms": 100.0, "tpot_ms": 10.0}, "predicted": {"ttft_ms": ttft, "tpot_ms": tpot},
            "derived": {"e2e_ms": {"measured": 190.0, "predicted": e2e, "error": e2e / 190.0 - 1}}}


def test_the_generator_groups_reports_by_card_engine_and_mode(tmp_path):
    gen = _generator()
    agg = _report(tmp_path / "agg.json", [_row(2, "h100_sxm", "vllm", "agg", 110.0, 9.0),
                                          _row(3, "h100_sxm", "vllm", "agg", 80.0, 10.5),
                                          _row(4, "b200_sxm", "trtllm", "agg", 150.0, 10.0),
                                          {"line": 5, "system": "h100_sxm", "backend": "vllm", "mode": "agg",
                                           "skipped": "no model profile"},
                                          _row(6, "mi300x", "vllm", "agg", 100.0, 10.0)])  # a card without tables
    disagg = _report(tmp_path / "disagg.json", [_row(7, "b200_sxm", "sglang", "disagg", 50.0, 12.0)])
    out = tmp_path / "check.yaml"
    assert gen.main([str(agg), str(disagg), "--out", str(out), "--commit", "abc1234", "--date", "2026-12-04"]) == 0
    doc = yaml.safe_load(out.read_text())
    assert doc["commit"] == "abc1234" and doc["date"] == "2026-12-04" and "sample.csv" in doc["source"]
    # E2E: b200 trtllm 150 + 90 = 240 against 190; sglang 50 + 108 = 158; h100 vllm 191 and 174.5
    assert doc["cards"] == {
        "b200": [{"engine": "trtllm", "mode": "agg", "runs": 1, "ttft_median_abs_error": 0.5,
                  "ttft_p90_abs_error": 0.5, "tpot_median_abs_error": 0.0, "tpot_p90_abs_error": 0.0,
                  "e2e_median_abs_error": 0.2632, "e2e_p90_abs_error": 0.2632},
                 {"engine": "sglang", "mode": "disagg", "runs": 1, "ttft_median_abs_error": 0.5,
                  "ttft_p90_abs_error": 0.5, "tpot_median_abs_error": 0.2, "tpot_p90_abs_error": 0.2,
                  "e2e_median_abs_error": 0.1684, "e2e_p90_abs_error": 0.1684}],
        "h100-sxm": [{"engine": "vllm", "mode": "agg", "runs": 2, "ttft_median_abs_error": 0.15,
                      "ttft_p90_abs_error": 0.19, "tpot_median_abs_error": 0.075, "tpot_p90_abs_error": 0.095,
                      "e2e_median_abs_error": 0.0434, "e2e_p90_abs_error": 0.0739}]}
    PublishedCheck.model_validate(doc)
    with pytest.raises(SystemExit, match="not a run with the default settings"):
        gen.main([str(_report(tmp_path / "burst.json", [], start="burst")), "--out", str(out)])
    with pytest.raises(SystemExit, match="line 2 .agg. is predicted by"):
        gen.main([str(agg), str(agg), "--out", str(out)])


def test_a_composed_profile_says_its_fit_is_against_the_composition(tmp_path, capsys):
    """A profile from `capsim profile compose` fits its own composition (a few %), which says nothing of a real
    engine: the run says so and quotes the tables' published check; a profile composed before `composed_from`
    existed is recognised by its provenance."""
    out = tmp_path / "h100-sxm__llama-3.1-8b__bf16.yaml"
    assert main(["profile", "compose", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--max-batch", "64",
                 "--out", str(out)]) == 0
    assert "composed_from: h100-sxm" in out.read_text()
    capsys.readouterr()
    step = f"step_time={{model: {{kind: profile, path: {out}, use: efficiency}}}}"
    args = ["run", str(TP4), "--set", "parallel=null", "--set", "model=llama-3.1-8b", "--set", step,
            "--set", "workload.num_requests=3"]
    expected = ("against its composition from the h100-sxm kernel tables, not a measurement; "
                + check_text(card_check("h100-sxm")))
    assert main(args) == 0
    assert capsys.readouterr().out.splitlines()[1].endswith(expected)
    old = tmp_path / "old.yaml"
    old.write_text("\n".join(ln for ln in out.read_text().splitlines() if not ln.startswith("composed_from")) + "\n")
    assert main(args[:-4] + ["--set", step.replace(str(out), str(old)), "--set", "workload.num_requests=3",
                             "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)["setup"]["step_time_fit"]
    assert fit["composed_from"] == "h100-sxm" and fit["published"] == card_check("h100-sxm")
    assert fit["mape"] is not None and fit["mape"] < 0.2


def test_a_measured_profile_quotes_its_own_fit_only(capsys):
    scenario = REPO_SCENARIOS / "validation" / "cpu-qwen0.5b-continuous.yaml"
    assert main(["run", str(scenario), "--set", "workload.num_requests=3", "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)["setup"]["step_time_fit"]
    assert "composed_from" not in fit and "published" not in fit and fit["mape"] is not None


def test_report_accepts_a_run_whose_check_or_wording_is_older(tmp_path, capsys):
    """capsim report compares which step-time model ran (kind, profile, scale), not what capsim says of it: a run
    made before the published check existed, or with another check file, still matches its scenario; another
    kind or scale does not."""
    out = tmp_path / "run"
    assert main(["run", str(TP4), "--set", "workload.num_requests=3", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    fit = summary["setup"]["step_time_fit"]
    fit.pop("published")
    fit["unknown"] = "none is recorded for a ops model"   # the wording of the capsim that ran it
    (out / "summary.json").write_text(json.dumps(summary))
    (out / "scenario.json").unlink(missing_ok=True)
    capsys.readouterr()
    args = ["report", str(out), "--scenario", str(TP4), "--set", "workload.num_requests=3"]
    assert main(args) == 0, capsys.readouterr().err
    assert main([*args, "--force", "--set", "step_time.scale=1.1"]) == 2
    assert "setup.step_time_fit is {'kind': 'ops', 'profile': None, 'scale': None} in the run" in capsys.readouterr().err


def test_a_card_given_as_a_yaml_path_gets_its_cards_check(capsys):
    hw = REPO / "profiles" / "hardware" / "h100-sxm.yaml"
    assert main(["run", str(TP4), "--set", "workload.num_requests=3", "--set", f"hardware={hw}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["setup"]["step_time_fit"]["published"] == card_check("h100-sxm")


def test_a_profile_composed_from_a_table_folder_path_claims_no_check(tmp_path):
    from sim.io.profiles import load_fitted
    out = tmp_path / "p.yaml"
    assert main(["profile", "compose", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--max-batch", "64",
                 "--tables", str(REPO / "profiles" / "ops" / "h100-sxm"), "--out", str(out)]) == 0
    assert load_fitted(out).composed_from is None


@pytest.mark.parametrize("setting", [{"all_reduce": "nccl"}, {"host_overhead_s": 0.001}, {"moe_kernels": "own"},
                                     {"requests_per_user": 4}])
def test_the_generator_refuses_every_non_default_setting(tmp_path, setting):
    gen = _generator()
    path = _report(tmp_path / "r.json", [_row(2, "h100_sxm", "vllm", "agg", 110.0, 9.0)], **setting)
    with pytest.raises(SystemExit, match="not a run with the default settings"):
        gen.main([str(path), "--out", str(tmp_path / "c.yaml"), "--commit", "x"])


def test_the_report_page_shows_the_check_and_the_scale(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", str(TP4), "--set", "workload.num_requests=3", "--set", "step_time.scale=1.1",
                 "--out", str(out), "--report"]) == 0
    page = (out / "report.html").read_text()
    vllm = [g for g in card_check("h100-sxm")["groups"] if g["engine"] == "vllm" and g["mode"] == "agg"][0]
    assert "published runs, vLLM agg" in page and f"TTFT {vllm['ttft_median_abs_error']:.1%} (p90" in page
    assert (f"E2E {vllm['e2e_median_abs_error']:.1%} (p90 {vllm['e2e_p90_abs_error']:.1%}) on {vllm['runs']:,} runs"
            in page)
    assert "step_time.scale" in page and "x 1.1 (a sensitivity run" in page
    assert capsys.readouterr().out.splitlines()[1].startswith(
        "llama-3.1-70b on h100-sxm, chunked scheduler; step-time model ops, every step x 1.1 (step_time.scale): ")


def test_the_disaggregated_benchmark_length_is_required_of_disaggregated_rows_only(tmp_path):
    """disagg_rounds (since 2026-12-06) must be the default where a report replays disaggregated rows; an agg-only
    report from before it, which does not state it, still reads."""
    gen = _generator()
    agg = _row(2, "h100_sxm", "vllm", "agg", 110.0, 9.0)
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"file": "../x/sample.csv", **gen.DEFAULTS, "rows": [agg]}))
    assert gen.main([str(old), "--out", str(tmp_path / "a.yaml"), "--commit", "x"]) == 0
    dis = _report(tmp_path / "d.json", [_row(7, "b200_sxm", "sglang", "disagg", 50.0, 12.0)], disagg_rounds=10)
    with pytest.raises(SystemExit, match="not a run with the default settings: {'disagg_rounds': 10}"):
        gen.main([str(dis), "--out", str(tmp_path / "b.yaml"), "--commit", "x"])


def test_a_disaggregated_run_says_when_its_card_has_no_disaggregated_check(tmp_path, monkeypatch):
    from sim.io.published_check import for_serving
    (tmp_path / "ops").mkdir()
    group = ("{{engine: {e}, mode: {m}, runs: 3, ttft_median_abs_error: 0.1, ttft_p90_abs_error: 0.2, "
             "tpot_median_abs_error: 0.05, tpot_p90_abs_error: 0.1}}")
    (tmp_path / "ops" / CHECK_FILE).write_text(
        "source: s\ncommit: c\ndate: d\ncards:\n"
        f"  h100-sxm:\n  - {group.format(e='vllm', m='agg')}\n"
        f"  b200:\n  - {group.format(e='vllm', m='agg')}\n  - {group.format(e='sglang', m='disagg')}\n")
    monkeypatch.setenv("CAPSIM_PROFILES", str(tmp_path))
    h100, b200 = card_check("h100-sxm"), card_check("b200")
    assert for_serving(h100, False) is h100 and for_serving(b200, True) is b200 and for_serving(None, True) is None
    marked = for_serving(h100, True)
    assert marked["disagg_checked_on"] == ["b200"] and marked["groups"] == h100["groups"]
    assert check_text(marked) == ("against published serving runs on h100-sxm, median |error| TTFT / TPOT: vLLM "
                                  "10.0% / 5.0% over 3 runs; docs/fidelity.md; none of them disaggregated, as this "
                                  "run is (disaggregated runs are checked on b200 only: docs/disaggregation.md)")


def test_the_shipped_disaggregated_scenario_quotes_where_disaggregated_runs_were_checked(capsys):
    """The shipped disaggregated scenario runs on H100, whose card has disaggregated checks since its TensorRT-LLM
    pools over two boards replay (2026-12-07): the run quotes that group, and says nothing of other cards."""
    scenario = REPO_SCENARIOS / "disagg-llama-3.1-70b-h100.yaml"
    assert main(["run", str(scenario), "--set", "workload.num_requests=4", "--json"]) == 0
    published = json.loads(capsys.readouterr().out)["setup"]["step_time_fit"]["published"]
    shipped = yaml.safe_load(check_path().read_text())["cards"]
    disagg = [g for g in shipped["h100-sxm"] if g["mode"] == "disagg"]
    assert disagg and "disagg_checked_on" not in published
    assert [g for g in published["groups"] if g["mode"] == "disagg"] == disagg
    assert main(["run", str(scenario), "--set", "workload.num_requests=4"]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    g = disagg[0]
    assert (f"TensorRT-LLM disagg {g['ttft_median_abs_error']:.1%} / {g['tpot_median_abs_error']:.1%}" in line
            and "none of them disaggregated" not in line)
