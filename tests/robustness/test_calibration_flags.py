"""`capsim calibrate`, `capsim validate` and `capsim fit` refuse out-of-range and ignored flags with an error
naming the flag and what it expects: no torch traceback, no value quietly read as another, no flag quietly
ignored. Every case here fails before any timing or replay starts (no torch needed)."""

from __future__ import annotations

import pytest

from capsim.cli import build_parser, main
from tests.sim.helpers import REPO_SCENARIOS

SCENARIO = str(REPO_SCENARIOS / "validation" / "cpu-qwen0.5b-continuous.yaml")
LOG = "duration_ms,prefill_tokens,decode_seqs\n100,2048,0\n30,0,1\n31,0,4\n60,1024,0\n"


def _usage_error(argv: list[str], capsys) -> str:
    """argparse's refusal of `argv`: exit status 2, its stderr returned."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("flags, expected", [
    (["--threads", "-3"], "argument --threads: expected an integer >= 1, got '-3'"),
    (["--threads", "0"], "argument --threads: expected an integer >= 1, got '0'"),
    (["--warmup", "-1"], "argument --warmup: expected an integer >= 0, got '-1'"),
    (["--repeats", "0"], "argument --repeats: expected an integer >= 1, got '0'"),
    (["--max-repeats", "0"], "argument --max-repeats: expected an integer >= 1, got '0'"),
    (["--seed", "-1"], "argument --seed: expected an integer in 0..4,294,967,295, got '-1'"),
    (["--seed", str(2**32)], "argument --seed: expected an integer in 0..4,294,967,295, got '4294967296'"),
    (["--layers", "0"], "argument --layers: expected an integer >= 1, got '0'"),
    (["--max-points", "-1"], "argument --max-points: expected an integer >= 0, got '-1'"),
])
def test_calibrate_refuses_out_of_range_counts(flags, expected, capsys, tmp_path):
    argv = ["calibrate", "--model", "qwen2.5-0.5b", "--out", str(tmp_path), *flags, "--max-points", "0"]
    if flags[0] == "--max-points":
        argv = argv[:-2]
    assert expected in _usage_error(argv, capsys)


@pytest.mark.parametrize("flags, expected", [
    (["--max-repeats", "1", "--repeats", "2"], "error: --max-repeats 1: below --repeats (2); expected an integer >= 2"),
    (["--max-repeats", "2"], "error: --max-repeats 2: below the default --repeats on cpu (3)"),
])
def test_calibrate_refuses_max_repeats_below_repeats(flags, expected, capsys, tmp_path):
    """Refused before the model loads or torch is imported (the harness used to raise it quietly)."""
    argv = ["calibrate", "--model", "qwen2.5-0.5b", "--out", str(tmp_path), *flags, "--max-points", "0"]
    assert main(argv) == 2
    assert expected in capsys.readouterr().err


def test_calibrate_defaults_and_edge_values_still_parse(tmp_path):
    base = ["calibrate", "--model", "qwen2.5-0.5b", "--out", str(tmp_path)]
    a = build_parser("calibrate").parse_args(base)
    assert (a.threads, a.warmup, a.repeats, a.max_repeats, a.layers, a.seed, a.max_points) == \
        (None, None, None, None, None, 0, None)
    a = build_parser("calibrate").parse_args(base + ["--threads", "1", "--warmup", "0", "--seed", str(2**32 - 1),
                                                     "--layers", "1", "--max-points", "0", "--max-repeats", "2",
                                                     "--repeats", "2"])
    assert (a.threads, a.warmup, a.seed, a.layers, a.max_points, a.max_repeats) == (1, 0, 2**32 - 1, 1, 0, 2)


@pytest.mark.parametrize("flags, expected", [
    (["--threads", "-1"], "argument --threads: expected an integer >= 1, got '-1'"),
    (["--threads", "0"], "argument --threads: expected an integer >= 1, got '0'"),
    (["--rates", "nan"], "--rates: expected positive finite numbers, got 'nan'"),
    (["--rates", "0.5,inf"], "--rates: expected positive finite numbers, got 'inf'"),
    (["--rates", "0.5,-1"], "--rates: expected positive finite numbers, got '-1'"),
    (["--rates", "1,,2"], "--rates: an empty item in '1,,2'"),
    (["--rates", "1,2,"], "--rates: an empty item in '1,2,'"),
    (["--rates", "fast"], "--rates: expected comma-separated positive finite numbers"),
])
def test_validate_refuses_bad_threads_and_rates(flags, expected, capsys, tmp_path):
    """A NaN rate is the flag's fault, not the scenario file's workload.arrival.rate_rps."""
    err = _usage_error(["validate", SCENARIO, "--out", str(tmp_path / "v"), *flags], capsys)
    assert expected in err and "rate_rps" not in err


def test_validate_keeps_good_rates_as_given(tmp_path):
    a = build_parser("validate").parse_args(["validate", SCENARIO, "--out", str(tmp_path), "--rates", "0.3, 1,2"])
    assert a.rates == "0.3, 1,2" and a.threads is None


@pytest.mark.parametrize("flags, named", [
    (["--record-only"], "--record-only"),
    (["--engine-python", "/no/such/python"], "--engine-python"),
    (["--record-only", "--engine-python", "/no/such/python"], "--record-only and --engine-python"),
    (["--engine", "reference", "--record-only"], "--record-only"),
])
def test_validate_refuses_vllm_only_flags_without_engine_vllm(flags, named, capsys, tmp_path):
    assert main(["validate", SCENARIO, "--out", str(tmp_path / "v"), *flags]) == 2
    err = capsys.readouterr().err
    assert f"error: {named}: only with --engine vllm" in err
    assert not (tmp_path / "v").exists()  # refused before any replay


def test_fit_names_a_columns_target_the_file_lacks(capsys, tmp_path):
    log = tmp_path / "log.csv"
    log.write_text(LOG)
    argv = ["fit", str(log), "--model", "qwen2.5-0.5b", "--out", str(tmp_path / "p.yaml")]
    assert main(argv + ["--columns", "duration_ms=nope"]) == 2
    err = capsys.readouterr().err
    assert "--columns duration_ms=nope: no column 'nope' in the file; columns: duration_ms, prefill_tokens, " \
           "decode_seqs" in err
    assert "needs a duration_ms" not in err


def test_fit_refuses_columns_for_a_format_with_fixed_columns(capsys, tmp_path):
    log = tmp_path / "perf_model.csv"
    log.write_text(LOG)
    assert main(["fit", str(log), "--model", "qwen2.5-0.5b", "--out", str(tmp_path / "p.yaml"), "--format",
                 "splitwise", "--columns", "duration_ms=duration_ms"]) == 2
    assert "--columns maps the columns of a per-iteration log CSV" in capsys.readouterr().err


def test_fit_fp32_on_a_card_without_an_fp32_peak_says_so(capsys, tmp_path):
    log = tmp_path / "log.csv"
    log.write_text(LOG)
    assert main(["fit", str(log), "--model", "qwen2.5-0.5b", "--out", str(tmp_path / "p.yaml"),
                 "--dtype", "fp32", "--hardware", "h100-sxm"]) == 0
    out = capsys.readouterr().out
    assert "hardware h100-sxm has no fp32 peak FLOP/s" in out and "give --peak-tflops" in out
    assert "give --hardware or --peak-tflops" not in out
