"""The rough edges of calibrate, fit and validate a new user hits (issue 16)."""

from __future__ import annotations

import os

import pytest

from capsim.cli import main


def test_calibrate_on_a_missing_device_is_an_error_not_an_assertion(capsys, tmp_path):
    torch = pytest.importorskip("torch", reason="capsim calibrate needs torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the refusal cannot be seen here")
    assert main(["calibrate", "--model", "qwen2.5-0.5b", "--device", "cuda", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --device cuda: torch reports no CUDA device") and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_loaded_machine_and_huge_heldout_error_warn(monkeypatch):
    pytest.importorskip("torch", reason="calibration.harness imports torch")
    from calibration.advice import heldout_warning, loaded_machine_warning
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 8.0, 7.0))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert loaded_machine_warning("cpu", "wall") == (
        "warning: load average 9.00 8.00 7.00 on 2 cores: other processes are using the CPU; times will be noisy; "
        "--clock thread --threads 1 times the torch thread's own CPU time instead")
    assert loaded_machine_warning("cuda", "wall") is None
    monkeypatch.setattr(os, "getloadavg", lambda: (0.2, 0.2, 0.2))
    assert loaded_machine_warning("cpu", "wall") is None
    assert heldout_warning(0.688, "wall") == (
        "warning: held-out error 68.8% (> 25%): the timings are too noisy for this profile to predict anything; "
        "rerun with --clock thread --threads 1 on a shared CPU, or on an idle machine")
    assert heldout_warning(0.08, "wall") is None


def test_validate_warns_about_a_loaded_machine(monkeypatch, capsys, tmp_path):
    pytest.importorskip("torch", reason="capsim validate needs torch")
    import calibration.validate as validate
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 8.0, 7.0))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)

    def stop(cfg):
        raise ValueError("stopped by the test before replaying")
    monkeypatch.setattr(validate, "run_validation", stop)
    from tests.sim.helpers import REPO_SCENARIOS
    scenario = REPO_SCENARIOS / "validation" / "cpu-qwen0.5b-continuous.yaml"
    assert main(["validate", str(scenario), "--device", "cpu", "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err
    assert "warning: load average 9.00 8.00 7.00 on 2 cores" in err


LOG = """duration_ms,prefill_tokens,decode_seqs,decode_tokens,gpu
{rows}"""


def test_fit_says_which_rows_it_used_and_why_not_the_others(capsys, tmp_path):
    rows = []
    for i in range(1, 9):  # prefill iterations of growing size, decode iterations of growing batch
        rows.append(f"{20 + 0.05 * 64 * i:.3f},{64 * i},0,0,0")
        rows.append(f"{15 + 0.4 * i:.3f},0,{i},{i},0")
    rows += ["12.0,0,0,3,0", "0,128,0,0,0"]  # decode_seqs missing (only the unknown decode_tokens): dropped
    log = tmp_path / "log.csv"
    log.write_text(LOG.format(rows="\n".join(rows)) + "\n")
    out = tmp_path / "p.yaml"
    assert main(["fit", str(log), "--model", "qwen2.5-0.5b", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert ("18 rows read, 16 used; dropped: 1 with neither prefill_tokens nor decode_seqs > 0, 1 with a zero "
            "duration; columns ignored (not ours; map one with --columns OURS=THEIRS): decode_tokens, gpu") in text
    assert main(["fit", str(log), "--model", "qwen2.5-0.5b", "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith(f"error: --out {out}: exists; pass --force to overwrite it")
    assert main(["fit", str(log), "--model", "qwen2.5-0.5b", "--out", str(out), "--force"]) == 0


@pytest.mark.parametrize("body, expected", [
    ("duration_ms,prefill_tokens\n10,64\n12,64,7\n", "data row 2: 3 cells, but the header has 2 columns"),
    ("duration_ms,prefill_tokens\n10,64\nnan,64\n",
     "data row 2: column 'duration_ms': expected a finite number >= 0, got 'nan'"),
    ("duration_ms,prefill_tokens\n10,64\n12,64.5\n",
     "data row 2: column 'prefill_tokens': expected a whole number (a count of tokens or sequences), got '64.5'"),
    ("duration_ms,prefill_tokens\n10,64\n12,x\n", "data row 2: column 'prefill_tokens': not a number: 'x'"),
])
def test_fit_refuses_bad_rows(capsys, tmp_path, body, expected):
    log = tmp_path / "log.csv"
    log.write_text(body)
    assert main(["fit", str(log), "--model", "qwen2.5-0.5b", "--out", str(tmp_path / "p.yaml")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {log}: {expected}"


def test_readme_calibrate_command_does_not_collide_with_shipped_profiles():
    import shlex
    from pathlib import Path

    from capsim.cli import build_parser
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    line = next(ln for ln in readme.splitlines() if ln.startswith("capsim calibrate "))
    args = build_parser().parse_args(shlex.split(line)[1:])
    shipped = Path(__file__).resolve().parents[2] / "profiles" / "fitted"
    stem = f"{args.device}__{args.model}__{args.dtype}"
    # written as it stands, the command must start a fresh run, not meet a shipped points file of other settings
    assert not (Path(args.out) / f"{stem}.csv").exists() or Path(args.out).resolve() != shipped.resolve()
    assert not Path(args.out).resolve().is_relative_to(shipped.resolve())


def test_readme_fit_command_runs_on_the_shipped_engine_log(capsys, tmp_path):
    import shlex
    from pathlib import Path
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = readme.index("capsim fit docs/examples/engine_log.csv")
    text = readme[start:readme.index("\n", readme.index("decode_seqs=num_decodes", start))].replace("\\\n", " ")
    argv = shlex.split(text)[1:]
    argv[argv.index("--out") + 1] = str(tmp_path / "engine-fit.yaml")
    repo = Path(__file__).resolve().parents[2]
    argv[1] = str(repo / argv[1])
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "267 rows read, 267 used; columns ignored (not ours; map one with --columns OURS=THEIRS): kind, host_ms" in out
    from sim.io.profiles import load_fitted
    prof = load_fitted(tmp_path / "engine-fit.yaml")
    assert prof.fit.mape < 0.15  # a real log of a quiet-clocked engine fits within 15% held out


def test_calibrate_refuses_an_unusable_out_before_timing(capsys, tmp_path):
    pytest.importorskip("torch", reason="capsim calibrate needs torch")
    afile = tmp_path / "afile"
    afile.write_text("mine")
    assert main(["calibrate", "--model", "qwen2.5-0.5b", "--device", "cpu", "--out", str(afile / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --out {afile / 'x' / 'cpu__qwen2.5-0.5b__bf16.yaml'}: lies under {afile}, which "
                          "is a file, not a folder") and afile.read_text() == "mine"


def test_validate_refuses_an_unusable_out_before_replaying(capsys, tmp_path):
    pytest.importorskip("torch", reason="capsim validate needs torch")
    from tests.sim.helpers import REPO_SCENARIOS
    afile = tmp_path / "afile"
    afile.write_text("mine")
    scenario = REPO_SCENARIOS / "validation" / "cpu-qwen0.5b-continuous.yaml"
    assert main(["validate", str(scenario), "--device", "cpu", "--out", str(afile)]) == 2
    assert capsys.readouterr().err.startswith(f"error: --out {afile}: is a file, expected a folder")


def test_a_bad_row_is_named_by_its_place_in_the_file_whatever_where_kept(capsys, tmp_path):
    log = tmp_path / "log.csv"
    log.write_text("gpu,duration_ms,prefill_tokens\nb,10,64\na,11,64\nb,12,64\na,13,6.5\n")
    assert main(["fit", str(log), "--model", "qwen2.5-0.5b", "--where", "gpu=a", "--out", str(tmp_path / "p.yaml")]) == 2
    assert "data row 4: column 'prefill_tokens'" in capsys.readouterr().err


@pytest.mark.parametrize("body, expected", [
    ("duration_ms,prefill_tokens\n10,64\n", "not a splitwise perf_model.csv: no model, hardware, tensor_parallel"),
    ("model,hardware,tensor_parallel,batch_size,prompt_size,token_size,prompt_time,token_time\n"
     "m,h,1,1,512,128,100,20\nm,h,1,abc,512,128,100,20\n", "data row 2: column 'batch_size': not a number: 'abc'"),
    ("model,hardware,tensor_parallel,batch_size,prompt_size,token_size,prompt_time,token_time\n"
     "m,h,1,1,512,128,100,20\nm,h,1,1,512,128,,20\n", "data row 2: column 'prompt_time' missing or empty"),
    ("model,hardware,tensor_parallel,batch_size,prompt_size,token_size,prompt_time,token_time\n"
     "m,h,1,1,512,128,100,20\nm,h,1,1,512,128,inf,20\n", "data row 2: column 'prompt_time': expected a finite number"),
    ("model,hardware,tensor_parallel,batch_size,prompt_size,token_size,prompt_time,token_time\n"
     "m,h,1,1,512,128,100,20\nm,h,1,0,512,128,100,20\n", "data row 2: expected batch_size >= 1"),
])
def test_fit_splitwise_names_the_file_row_and_column(capsys, tmp_path, body, expected):
    log = tmp_path / "perf.csv"
    log.write_text(body)
    assert main(["fit", str(log), "--model", "qwen2.5-0.5b", "--format", "splitwise",
                 "--out", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {log}: ") and expected in err, err


def test_fit_names_an_unmatched_where_and_an_unknown_model_or_card(capsys, tmp_path):
    log = tmp_path / "log.csv"
    log.write_text("gpu,duration_ms,prefill_tokens\na,10,64\nb,11,64\n")
    out = str(tmp_path / "p.yaml")
    assert main(["fit", str(log), "--model", "qwen2.5-0.5b", "--where", "gpu=c", "--out", out]) == 2
    assert capsys.readouterr().err.strip() == f"error: {log}: --where gpu=c: no row matches (the file has gpu: a, b)"
    assert main(["fit", str(log), "--model", "nosuch", "--out", out]) == 2
    assert capsys.readouterr().err.startswith("error: --model: unknown model 'nosuch'; known: ")
    assert main(["fit", str(log), "--model", "qwen2.5-0.5b", "--hardware", "nosuch", "--out", out]) == 2
    assert capsys.readouterr().err.startswith("error: --hardware: unknown hardware 'nosuch'; known: ")
