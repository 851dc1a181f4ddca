"""calibration.cli's four entry points, torch-free imports and the module boundaries (style guide B.1)."""

from __future__ import annotations

import argparse
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from calibration.cli import add_calibrate_args, add_fit_args, calibrate_main, fit_main
from calibration.shapes import tiny_model_profile

REPO = Path(__file__).resolve().parents[2]


def _parse(adder, argv):
    p = argparse.ArgumentParser()
    adder(p)
    return p.parse_args(argv)


def _tiny_yaml(tmp_path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_model_profile().model_dump(mode="json")))
    return path


def test_calibrate_args_defaults_and_choices():
    a = _parse(add_calibrate_args, ["--model", "qwen3-0.6b", "--out", "x"])
    assert (a.device, a.dtype, a.grid, a.layers, a.hardware, a.cuda_graphs, a.repeats) == \
        ("cpu", "bf16", "quick", None, None, False, None)
    with pytest.raises(SystemExit):
        _parse(add_calibrate_args, ["--model", "m", "--out", "x", "--device", "tpu"])


def test_calibrate_main_end_to_end_and_resume(tmp_path, capsys):
    pytest.importorskip("torch", reason="capsim calibrate needs torch")
    argv = ["--model", str(_tiny_yaml(tmp_path)), "--device", "cpu", "--dtype", "fp32", "--grid", "tiny",
            "--out", str(tmp_path / "out"), "--threads", "1", "--repeats", "2"]
    assert calibrate_main(_parse(add_calibrate_args, argv + ["--max-points", "4"])) == 0
    out = capsys.readouterr()
    assert "4 points measured" in out.out and "rerun the same command to continue" in out.out
    assert "[   4/4]" in out.err                       # the progress line
    assert calibrate_main(_parse(add_calibrate_args, argv)) == 0
    out = capsys.readouterr()
    assert "resuming: 4 points already in" in out.err
    assert f"profile: {tmp_path / 'out' / 'cpu__tiny__fp32.yaml'}" in out.out
    assert "linear model, held-out points: MAPE" in out.out and "measured: {matmul_tflops:" in out.out
    text = (tmp_path / "out" / "cpu__tiny__fp32.yaml").read_text()
    assert text.startswith("# Fitted by `capsim calibrate --model ")


def test_calibrate_main_reports_bad_input(tmp_path, capsys):
    assert calibrate_main(_parse(add_calibrate_args, ["--model", "no-such-model", "--out", str(tmp_path)])) == 2
    assert "unknown model 'no-such-model'" in capsys.readouterr().err


def test_fit_main_on_a_log(tmp_path, capsys):
    log = tmp_path / "log.csv"
    log.write_text("duration_ms,prefill_tokens,decode_seqs,decode_context_tokens\n"
                   "100,2048,0,0\n30,0,1,2048\n31,0,4,8192\n150,2048,4,8192\n60,1024,0,0\n29,0,1,100\n")
    a = _parse(add_fit_args, [str(log), "--model", "qwen3-8b", "--out", str(tmp_path / "p.yaml")])
    assert fit_main(a) == 0
    out = capsys.readouterr().out
    assert "profile:" in out and "6 logged iterations, 6 distinct shapes" in out
    assert "no peak FLOP/s known" in out
    assert fit_main(_parse(add_fit_args, [str(log), "--model", "qwen3-8b", "--out", "x.yaml",
                                          "--columns", "bogus"])) == 2
    assert "--columns 'bogus': expected NAME=VALUE" in capsys.readouterr().err


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_cli_fit_and_logs_work_without_torch(tmp_path):
    """capsim (and capsim fit) must work where torch is not installed."""
    log = tmp_path / "log.csv"
    log.write_text("duration_s,prefill_tokens,decode_seqs\n0.1,2048,0\n0.03,0,1\n0.031,0,4\n0.06,1024,0\n")
    r = _run(f"""
        import sys
        sys.modules["torch"] = None          # import torch -> ImportError, as on a machine without it
        import argparse
        from calibration import cli, fit, logs, points, shapes, chapter_profile
        p = argparse.ArgumentParser(); cli.add_fit_args(p)
        out = {str(tmp_path / 'p.yaml')!r}
        assert cli.fit_main(p.parse_args([{str(log)!r}, "--model", "qwen3-8b", "--out", out])) == 0
        p = argparse.ArgumentParser(); cli.add_calibrate_args(p)
        rc = cli.calibrate_main(p.parse_args(["--model", "qwen3-0.6b", "--out", {str(tmp_path)!r}]))
        assert rc == 2, rc
    """)
    assert r.returncode == 0, r.stderr
    assert "capsim calibrate needs torch" in r.stderr


def test_module_boundaries():
    """calibration imports sim only through the lazy sim.api; the calibrate path never loads simpy, the engine or the schedulers;
    the torch-free half does not import torch."""
    r = _run("""
        import sys
        import calibration.cli, calibration.fit, calibration.logs, calibration.points, calibration.chapter_profile
        assert "torch" not in sys.modules, "torch imported by the torch-free modules"
        import calibration.harness, calibration.model, calibration.timing
        bad = [m for m in ("simpy", "sim.core.engine", "sim.core.schedulers", "sim.core.simulation") if m in sys.modules]
        assert not bad, bad
    """)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("flag, value", [("--peak-tflops", "-1"), ("--peak-tflops", "0"), ("--bandwidth-gbs", "nan"),
                                         ("--devices", "0"), ("--devices", "-2")])
def test_fit_peaks_and_devices_must_be_positive(flag, value, capsys):
    """A zero or negative peak is not 'no peak', and a device count below 1 is not a layout: usage errors."""
    p = argparse.ArgumentParser(prog="capsim fit")
    add_fit_args(p)
    with pytest.raises(SystemExit) as stop:
        p.parse_args(["log.csv", "--model", "qwen2.5-0.5b", "--out", "p.yaml", flag, value])
    assert stop.value.code == 2 and f"argument {flag}: expected " in capsys.readouterr().err
