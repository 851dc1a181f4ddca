"""Outputs are written whole or not at all, and never over existing files without --force."""

from __future__ import annotations

import json

import pytest

from capsim.cli import main
from sim.io.errors import ConfigError
from sim.io.outputs import check_out_file, staged_output
from tests.sim.helpers import REPO_SCENARIOS

EXAMPLE = REPO_SCENARIOS / "capacity-example.yaml"
SCHEME = REPO_SCENARIOS / "chapter8" / "scheme-a.yaml"
SMALL = ["--set", "workload.num_requests=4"]


def err_lines(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error: ")]


def leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".partial-" in p.name)


def test_run_out_that_cannot_be_a_folder(capsys, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    cases = [(afile, f"error: --out {afile}: is a file, expected a folder (choose another --out or remove the file)"),
             (afile / "sub", f"error: --out {afile / 'sub'}: lies under {afile}, which is a file, not a folder")]
    for out, expected in cases:
        assert main(["run", str(EXAMPLE), *SMALL, "--out", str(out)]) == 2
        assert err_lines(capsys) == [expected]
    assert afile.read_text() == "mine"
    assert main(["run", str(EXAMPLE), *SMALL, "--out", "/proc/capsim-test/out"]) == 2
    assert err_lines(capsys)[0].startswith("error: --out /proc/capsim-test/out: cannot write in /proc")


def test_run_never_overwrites_without_force(capsys, tmp_path):
    out = tmp_path / "out"
    assert main(["run", str(EXAMPLE), *SMALL, "--out", str(out)]) == 0
    before = (out / "summary.json").read_text()
    assert main(["run", str(EXAMPLE), "--set", "workload.num_requests=5", "--out", str(out)]) == 2
    assert err_lines(capsys) == [f"error: --out {out}: already holds summary.json, requests.csv, iterations.csv; "
                                 "pass --force to overwrite, or choose another folder"]
    assert (out / "summary.json").read_text() == before
    assert main(["run", str(EXAMPLE), "--set", "workload.num_requests=5", "--out", str(out), "--force"]) == 0
    assert json.loads((out / "summary.json").read_text())["requests"] == 5
    assert leftovers(tmp_path) == []


def test_a_folder_with_other_files_is_fine_for_run(tmp_path):
    (tmp_path / "notes.txt").write_text("keep")
    assert main(["run", str(EXAMPLE), *SMALL, "--out", str(tmp_path)]) == 0
    assert (tmp_path / "notes.txt").read_text() == "keep" and (tmp_path / "summary.json").exists()


def test_a_failed_run_leaves_no_output_folder(capsys, tmp_path):
    out = tmp_path / "deep" / "out"
    assert main(["run", str(EXAMPLE), "--set", "kv.budget=0", "--out", str(out)]) == 2
    assert not (tmp_path / "deep").exists() and leftovers(tmp_path) == []


def test_staged_output_is_all_or_nothing(tmp_path):
    out = tmp_path / "o"
    with pytest.raises(RuntimeError):
        with staged_output(out) as stage:
            (stage / "a.csv").write_text("1")
            raise RuntimeError("boom")
    assert not out.exists() and leftovers(tmp_path) == []
    with pytest.raises(KeyboardInterrupt):
        with staged_output(out) as stage:
            (stage / "a.csv").write_text("1")
            raise KeyboardInterrupt
    assert not out.exists() and leftovers(tmp_path) == []
    with staged_output(out) as stage:
        (stage / "a.csv").write_text("1")
    assert (out / "a.csv").read_text() == "1" and leftovers(tmp_path) == []


def test_output_file_checks(tmp_path):
    existing = tmp_path / "p.yaml"
    existing.write_text("x")
    with pytest.raises(ConfigError, match="exists; pass --force to overwrite it"):
        check_out_file(existing)
    assert check_out_file(existing, force=True) == existing
    with pytest.raises(ConfigError, match="is a folder, expected a file name"):
        check_out_file(tmp_path)
    with pytest.raises(ConfigError, match="lies under .* which is a file"):
        check_out_file(existing / "q.yaml")


def test_plan_plane_and_figures_need_force(capsys, tmp_path):
    out = tmp_path / "pp"
    assert main(["plan-plane", str(SCHEME), "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["plan-plane", str(SCHEME), "--out", str(out)]) == 2
    assert err_lines(capsys) == [f"error: --out {out}: already holds memory_deadline_plane.png, plane.csv; pass "
                                 "--force to overwrite, or choose another folder"]
    assert main(["plan-plane", str(SCHEME), "--out", str(out), "--force"]) == 0
    fig = tmp_path / "fig"
    fig.mkdir()
    (fig / "memory-deadline-plane.csv").write_text("mine")
    assert main(["figures", "--only", "memory-deadline-plane", "--out", str(fig)]) == 2
    assert (fig / "memory-deadline-plane.csv").read_text() == "mine"
    assert leftovers(tmp_path) == []


def test_sweep_resumes_in_its_own_folder_but_refuses_others(capsys, tmp_path):
    out = tmp_path / "sw"
    argv = ["sweep", str(EXAMPLE), *SMALL, "--grid", "scheduler.max_num_seqs=8,16", "--workers", "1",
            "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    assert main(argv) == 0  # a resume: no --force needed
    assert "2 points: 0 run now, 2 already done" in capsys.readouterr().out
    (out / "sweep.json").write_text('{"scenario": "x", "scen')
    assert main(argv) == 2
    assert err_lines(capsys) == [f"error: {out / 'sweep.json'}: not valid JSON (Unterminated string starting at, "
                                 "line 1); this folder's sweep cannot be resumed: --fresh to start over, or another "
                                 "--out"]
    other = tmp_path / "other"
    other.mkdir()
    (other / "mine.txt").write_text("keep")
    assert main(argv[:-1] + [str(other)]) == 2
    assert err_lines(capsys)[0].startswith(f"error: --out {other}: already holds mine.txt; pass --force")


def test_compare_out(capsys, tmp_path):
    out = tmp_path / "cmp"
    assert main(["compare", str(SCHEME), "--out", str(out)]) == 0
    rows = json.loads((out / "compare.json").read_text())
    assert rows[0]["scenario"] == "scheme-a"
    assert (out / "compare.csv").read_text().splitlines()[0].startswith("scenario,kv_need_bytes,")
    assert main(["compare", str(SCHEME), "--out", str(out)]) == 2


def test_ctrl_c_is_one_line(capsys, monkeypatch):
    import capsim.commands.run as run_cmd

    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(run_cmd, "cmd_run", interrupted)
    assert main(["run", str(EXAMPLE)]) == 130
    assert capsys.readouterr().err.strip() == "interrupted"


def test_plane_never_fills_a_marker_outside_the_feasible_quadrant():
    from sim.planning.plane import plane_marks
    pts = [{"label": "a", "memory_ratio": 0.5, "deadline_ratio": 0.5, "feasible": True},
           {"label": "b", "memory_ratio": 1.6, "deadline_ratio": 0.7, "feasible": True},   # plan-feasible, OOM
           {"label": "c", "memory_ratio": 0.8, "deadline_ratio": 1.3, "feasible": True},
           {"label": "d", "memory_ratio": 0.5, "deadline_ratio": 0.9, "feasible": False}]
    spots, filled = plane_marks(pts, ymax=2.0)
    assert filled == {(0.5, 0.5): True, (1.6, 0.7): False, (0.8, 1.3): False, (0.5, 0.9): False}
    assert spots[(1.6, 0.7)] == ["b (meets the SLO target: requests queue for KV)"]
    assert spots[(0.8, 1.3)] == ["c (meets the SLO target; completion past the deadline)"]


def test_ctrl_c_during_a_dask_sweep_prints_no_tracebacks(tmp_path):
    """SIGINT to the whole process group (what Ctrl-C does): one 'interrupted' line, no worker tracebacks."""
    import os
    import signal
    import subprocess
    import sys
    import time
    pytest.importorskip("distributed", reason="the sweep fans out over dask.distributed")
    proc = subprocess.Popen([sys.executable, "-m", "capsim.cli", "sweep", str(EXAMPLE), "--set",
                             "workload.num_requests=20000", "--grid", "scheduler.max_num_seqs=8,16,32,64",
                             "--workers", "2", "--out", str(tmp_path / "sw")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            # Ctrl-C's default action in the child even when this test runs with SIGINT ignored
                            # (a background job of a non-interactive shell inherits SIG_IGN, and so would capsim)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # points.jsonl is opened before the cluster starts; its first record says the workers are running points
    # (a Ctrl-C while the cluster is still spawning its workers can still print a worker's traceback)
    jsonl, deadline = tmp_path / "sw" / "points.jsonl", time.monotonic() + 120
    while time.monotonic() < deadline and not (jsonl.exists() and jsonl.stat().st_size):
        time.sleep(0.1)
    time.sleep(0.5)  # three points still running or queued
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    text = err.decode()
    assert proc.returncode == 130, text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text and text.rstrip().endswith("interrupted")


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_unwritable_places_are_refused_by_every_writer(capsys, tmp_path):
    log = REPO_SCENARIOS.parent / "docs" / "examples" / "engine_log.csv"
    cases = [["fit", str(log), "--model", "qwen2.5-0.5b", "--columns", "duration_ms=iter_ms",
              "prefill_tokens=num_prefill_tokens", "decode_seqs=num_decodes", "--out", "/proc/capsim/x.yaml"],
             ["sweep", str(EXAMPLE), "--grid", "scheduler.max_num_seqs=8", "--workers", "1", "--out", "/proc/capsim"],
             ["plan-plane", str(SCHEME), "--out", "/proc/capsim"],
             ["figures", "--only", "memory-deadline-plane", "--out", "/proc/capsim"],
             ["compare", str(SCHEME), "--out", "/proc/capsim"]]
    for argv in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "error: --out /proc/capsim" in err and "cannot write in /proc" in err and "Traceback" not in err, argv


@pytest.mark.parametrize("argv", [
    ["run", str(REPO_SCENARIOS / "quickstart.yaml")],
    ["compare", str(REPO_SCENARIOS / "quickstart.yaml")],
    ["sweep", str(REPO_SCENARIOS / "quickstart.yaml"), "--grid", "scheduler.max_num_seqs=2"],
    ["profile", "compose", "--model", "qwen3-8b", "--hardware", "h100-sxm"],
])
def test_an_empty_out_is_refused_by_every_command(capsys, argv):
    """`--out "$DIR"` with DIR unset: an error, not the current folder, not silently nothing."""
    assert main(argv + ["--out", ""]) == 2
    assert "error: --out: empty path" in capsys.readouterr().err


def test_force_never_replaces_a_folder_of_the_users_with_a_file(capsys, tmp_path):
    out = tmp_path / "out"
    (out / "requests.csv").mkdir(parents=True)
    (out / "requests.csv" / "keep.txt").write_text("mine")
    assert main(["run", str(EXAMPLE), *SMALL, "--out", str(out), "--force"]) == 2
    assert err_lines(capsys) == [f"error: --out {out}: requests.csv is a folder there, where this command writes a "
                                 "file; move it or choose another folder"]
    assert (out / "requests.csv" / "keep.txt").read_text() == "mine" and not (out / "summary.json").exists()
    # the last guard, at the move: nothing is moved when any file would land on a folder
    with pytest.raises(ConfigError, match="a.csv is a folder there"):
        with staged_output(tmp_path / "o") as stage:
            (stage / "a.csv").write_text("1")
            (stage / "b.csv").write_text("1")
            (tmp_path / "o" / "a.csv").mkdir(parents=True)
    assert not (tmp_path / "o" / "b.csv").exists() and leftovers(tmp_path) == []


def test_a_worker_drops_only_the_lost_scheduler_traceback():
    """The worker preload drops the heartbeat's broken-connection record (seen on CI after a Ctrl-C), nothing else."""
    import logging
    import signal
    import sys
    before = signal.getsignal(signal.SIGINT)
    try:  # the preload makes its process ignore SIGINT: give this one its handler back
        from sim.planning.worker_signals import _drop_lost_scheduler
    finally:
        signal.signal(signal.SIGINT, before)

    def record(msg, exc):
        try:
            raise exc
        except type(exc):
            info = sys.exc_info()
        return logging.LogRecord("distributed.worker", logging.ERROR, __file__, 1, msg, None, info)
    lost = record("Failed to communicate with scheduler during heartbeat.", ConnectionError("Stream is closed"))
    assert _drop_lost_scheduler(lost) is False
    assert _drop_lost_scheduler(record("Unexpected exception during heartbeat. Closing worker.", ValueError("x")))
    assert _drop_lost_scheduler(record("Failed to write spill file", OSError("disk full")))
    assert _drop_lost_scheduler(logging.LogRecord("distributed.worker", logging.ERROR, __file__, 1, "plain", None, None))
    assert _drop_lost_scheduler in logging.getLogger("distributed.worker").filters
