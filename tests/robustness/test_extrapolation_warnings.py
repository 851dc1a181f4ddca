"""Every extrapolation of an efficiency model is said once on stderr (docs/scenarios.md's promise), and
a refusal says how to allow it (issue 16, silent degradations)."""

from __future__ import annotations

import pytest
import yaml

from capsim.cli import main
from tests.sim.helpers import REPO_SCENARIOS

SCHEME_B = yaml.safe_load((REPO_SCENARIOS / "chapter8" / "scheme-b.yaml").read_text())


def scenario(tmp_path, model: dict, allow: bool, requests: list[dict], scheduler: dict | None = None):
    data = {**SCHEME_B, "step_time": {"model": model, "allow_extrapolation": allow},
            "workload": {"kind": "requests", "requests": requests}}
    data["kv"] = {"block_tokens": 16, "format": "bf16", "budget": "12GiB"}
    if scheduler:
        data["scheduler"] = scheduler
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


NARROW = {"kind": "efficiency", "decode_table": [{"bytes": 1.0e9, "time_s": 0.01}, {"bytes": 2.0e9, "time_s": 0.02}],
          "prefill_mfu": 0.5}
TWO = [{"arrival_s": 0.0, "prompt_tokens": 100, "output_tokens": 4}]


def warnings_of(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("warning: step_time")]


def test_refusal_says_how_to_allow(tmp_path, capsys):
    assert main(["run", str(scenario(tmp_path, NARROW, False, TWO))]) == 2
    err = capsys.readouterr().err
    assert "decode bytes read" in err and "set step_time.allow_extrapolation: true in the scenario" in err


def test_inline_table_extrapolation_warns_once(tmp_path, capsys):
    assert main(["run", str(scenario(tmp_path, NARROW, True, TWO * 3))]) == 0
    lines = warnings_of(capsys.readouterr().err)
    assert len(lines) == 1 and lines[0].startswith("warning: step_time (efficiency): decode bytes read ")
    assert "extrapolating linearly (step_time.allow_extrapolation: true); further cases are not reported" in lines[0]


def test_mfu_clamp_of_a_verify_step_warns_once(tmp_path, capsys):
    # a speculative verify of 5 positions is compute bound at this MFU: the table's end decides its time
    model = {"kind": "efficiency", "decode_table": [{"bytes": 1.0e9, "time_s": 0.0005}, {"bytes": 1.0e12, "time_s": 0.001}],
             "prefill_mfu": [{"new_tokens": 256, "mfu": 0.01}, {"new_tokens": 1024, "mfu": 0.02}]}
    sched = {"kind": "continuous", "max_num_seqs": 4, "max_num_batched_tokens": 8192,
             "speculative": {"draft": {"kind": "ngram"}, "num_draft_tokens": 4,
                             "acceptance": {"kind": "constant", "a": 0.5}}}
    reqs = [{"arrival_s": 0.0, "prompt_tokens": 300, "output_tokens": 40}]
    assert main(["run", str(scenario(tmp_path, model, True, reqs, sched))]) == 0
    lines = warnings_of(capsys.readouterr().err)
    assert lines == ["warning: step_time (efficiency): 5 tokens in one pass lie outside the prefill MFU table "
                     "[256, 1024]: the MFU at its nearest end is used (a compute-bound verify step or one-pass "
                     "iteration); further cases are not reported"]


def test_unmatched_override_shapes_warn_once(tmp_path, capsys):
    model = {**NARROW, "decode_table": [{"bytes": 1.0e9, "time_s": 0.01}, {"bytes": 1.0e12, "time_s": 1.0}],
             "prefill_overrides": [{"sequences": 2, "new_tokens_per_sequence": 100, "time_s": 0.05}]}
    reqs = [{"arrival_s": 0.0, "prompt_tokens": 100, "output_tokens": 2},
            {"arrival_s": 0.0, "prompt_tokens": 300, "output_tokens": 2}] * 2
    assert main(["run", str(scenario(tmp_path, model, False, reqs))]) == 0
    lines = warnings_of(capsys.readouterr().err)
    assert lines == ["warning: step_time (efficiency): a prefill batch of 2 different shapes matches no "
                     "prefill_overrides entry (each is one shape): FLOPs / MFU used; further cases are not reported"]


@pytest.mark.parametrize("allow", [False, True])
def test_runs_inside_the_table_say_nothing(tmp_path, capsys, allow):
    model = {**NARROW, "decode_table": [{"bytes": 1.0e9, "time_s": 0.01}, {"bytes": 1.0e12, "time_s": 1.0}]}
    assert main(["run", str(scenario(tmp_path, model, allow, TWO))]) == 0
    assert warnings_of(capsys.readouterr().err) == []


def test_a_sweep_says_each_warning_once_not_once_per_point(tmp_path, capsys):
    # every point builds a fresh model of the same scenario: its warning is said by the first point only
    path = scenario(tmp_path, NARROW, True, TWO * 3)
    assert main(["sweep", str(path), "--grid", "seed=0,1,2", "--workers", "1", "--no-progress",
                 "--out", str(tmp_path / "out")]) == 0
    lines = warnings_of(capsys.readouterr().err)
    assert len(lines) == 1 and lines[0].startswith("warning: step_time (efficiency): decode bytes read ")
    # a plain run afterwards, in the same process, still says it (the once-per-process rule holds inside sweeps)
    assert main(["run", str(path), "--out", str(tmp_path / "run")]) == 0
    assert len(warnings_of(capsys.readouterr().err)) == 1
