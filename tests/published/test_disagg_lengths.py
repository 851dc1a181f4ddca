"""benchmarks/disagg_cohort.py: `lengths` chooses the benchmark a disaggregated replay is recombined as on the even
lines (docs/disaggregation.md, "The benchmark's length"); `regimes` reads the length the report was run with."""

import importlib.util
import json
import re
from pathlib import Path

import pytest

from sim.published.predict import combine_cold

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "disagg_cohort.py"


def _script():
    spec = importlib.util.spec_from_file_location("disagg_cohort", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _report(tmp_path, truth, **header) -> Path:
    """Rows of SGLang and TensorRT-LLM at 8 users measured as `truth(first, steady)` plus a 100 ms front end."""
    rows = []
    for line in range(2, 10):
        first = {"ttft_ms": 900.0 + 10 * line, "tpot_ms": 12.0}
        steady = {"ttft_ms": 100.0 + line, "tpot_ms": 10.0}
        measured = truth(first, steady)
        rows.append({"id": f"r{line}", "line": line, "mode": "disagg", "backend": "sglang" if line % 4 < 2 else "trtllm",
                     "concurrency": 8, "frontend_ms": 100.0, "components": {"first_wave": first, "steady": steady},
                     "measured": {"ttft_ms": measured["ttft_ms"] + 100.0, "tpot_ms": measured["tpot_ms"]},
                     "predicted": {"ttft_ms": 0.0, "tpot_ms": 0.0}})
    path = tmp_path / "report.json"
    path.write_text(json.dumps({**header, "rows": rows}))
    return path


def test_lengths_marks_the_benchmark_the_rows_were_measured_with(tmp_path, capsys):
    path = _report(tmp_path, lambda f, s: combine_cold(f, s, 3, "spread"))   # Dynamo's 24 requests at 8 users
    _script().lengths(str(path))
    lines = capsys.readouterr().out.splitlines()
    chosen = [ln for ln in lines if ln.endswith("|") and " * |" in ln]
    assert len(chosen) == 1 and chosen[0].startswith("| dynamo: max(3c, 10) requests, every engine spread *")
    assert chosen[0].split("|")[2].strip() == "0.0% (+0%)"                  # even lines: exact
    cohort = next(ln for ln in lines if ln.startswith("| N = 10, SGLang cohort"))
    assert cohort.split("|")[2].strip() != "0.0% (+0%)"


def test_regimes_recombines_with_the_length_the_report_states(tmp_path, capsys):
    truth = lambda f, s: combine_cold(f, s, 3, "spread")  # noqa: E731
    _script().regimes(str(_report(tmp_path, truth, rounds=10, disagg_rounds="dynamo")))
    out = capsys.readouterr().out
    assert "N = dynamo" in out
    assert _medians(out, "all") == [_medians(out, "all")[0], "0.0"] and _medians(out, "all")[0] != "0.0"
    _script().regimes(str(_report(tmp_path, truth, rounds=10)))   # a report from before disagg_rounds: N = 10
    out = capsys.readouterr().out
    assert "N = 10" in out and _medians(out, "all")[1] != "0.0"


def _medians(out: str, group: str) -> list[str]:
    """The median |error| under cohort and under spread that `regimes` prints for `group`."""
    line = next(ln for ln in out.splitlines() if ln.startswith(group + " "))
    return re.findall(r"([\d.]+)% \(", line)


def test_lengths_refuses_a_report_without_disaggregated_parts(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"rows": [{"line": 2, "mode": "agg", "predicted": {}}]}))
    with pytest.raises(SystemExit, match="no replayed disaggregated row with its two parts"):
        _script().lengths(str(path))
