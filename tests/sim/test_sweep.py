"""capsim sweep: grid parsing, serial == Dask LocalCluster row for row, resume after a kill."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

import sim.planning.sweep as sweep
from capsim.cli import main
from sim.io.errors import ConfigError
from sim.planning.sweep import Axis, flatten, grid_points, parse_axis, point_key, run_sweep

REPO = Path(__file__).resolve().parents[2]

SCENARIO = {
    "name": "sweep-test", "seed": 5, "model": "qwen3-8b", "hardware": "rtx-pro-6000-bw-ws",
    "kv": {"block_tokens": 16, "format": "bf16", "budget": "2GiB"},
    "scheduler": {"kind": "continuous", "max_num_seqs": 8, "max_num_batched_tokens": 8192},
    "step_time": {"model": {"kind": "linear", "constant_s": 0.02622, "per_new_token_s": 30.4e-6, "per_pair_s": 3.0e-9}},
    "workload": {"kind": "synthetic", "num_requests": 120, "arrival": {"kind": "poisson", "rate_rps": 6.0},
                 "prompt_tokens": {"kind": "lognormal", "median": 500, "sigma": 0.6, "max": 3000},
                 "output_tokens": {"kind": "lognormal", "median": 40, "sigma": 0.6, "max": 200}},
    "slo": {"ttft_s": 1.0, "e2e_s": 6.0},
}
GRID = ["scheduler.max_num_seqs=4,16", "kv.format=bf16,q4_0", "workload.arrival.rate_rps=4,8"]


def write_scenario(tmp_path, name="s.yaml", **changes):
    data = json.loads(json.dumps(SCENARIO))
    data.update(changes)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# ---- parsing ----------------------------------------------------------------------------------

def test_grid_values_are_yaml_and_keep_commas_inside_mappings():
    assert parse_axis("scheduler.max_num_seqs=16,32,64") == Axis("scheduler.max_num_seqs", (16, 32, 64))
    assert parse_axis("kv.format=bf16,q8_0").values == ("bf16", "q8_0")
    assert parse_axis("kv.budget=6GiB,12GiB").values == ("6GiB", "12GiB")
    slo = parse_axis("slo={ttft_s: 1, e2e_s: 9},{ttft_s: 2}")
    assert slo.values == ({"ttft_s": 1, "e2e_s": 9}, {"ttft_s": 2})
    assert parse_axis("step_time.graph_sizes=[1,2],[1,2,4]").values == ([1, 2], [1, 2, 4])


@pytest.mark.parametrize("text, message", [
    ("scheduler.max_num_seqs", "expected dotted.key=v1,v2"),
    ("scheduler.max_num_seqs=", "at least one value"),
    ("scheduler.max_num_seqs=4,,8", "none empty"),
    ("scheduler.max_num_seqs=4,4", "value 4 given twice"),
    ("scheduler.max_num_seqs=[4", "not valid YAML"),
])
def test_bad_grid_values_are_one_clear_error(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_axis(text)


def test_points_are_the_cross_product_in_grid_order_with_stable_keys():
    axes = [parse_axis(t) for t in GRID]
    pts = grid_points(axes)
    assert len(pts) == 8
    assert pts[0] == [("scheduler.max_num_seqs", 4), ("kv.format", "bf16"), ("workload.arrival.rate_rps", 4)]
    assert pts[1][2] == ("workload.arrival.rate_rps", 8)        # the last axis varies fastest
    assert point_key(pts[3]) == '[["scheduler.max_num_seqs",4],["kv.format","q4_0"],["workload.arrival.rate_rps",8]]'
    assert point_key([("slo", {"b": 1, "a": 2})]) == point_key([("slo", {"a": 2, "b": 1})])


def test_flatten_nested_summary():
    flat = flatten({"good": 3, "ttft_s": {"p99": 1.5, "max": 2.0}, "speculative": None, "x": {"y": [1, 2]}})
    assert flat == {"good": 3, "ttft_s_p99": 1.5, "ttft_s_max": 2.0, "speculative": None, "x_y": "[1, 2]"}


# ---- running ----------------------------------------------------------------------------------

def test_sweep_on_two_dask_workers_equals_the_serial_run_row_for_row(tmp_path):
    path = write_scenario(tmp_path)
    serial = run_sweep(path, GRID, tmp_path / "serial", workers=1, progress=False)
    dask = run_sweep(path, GRID, tmp_path / "dask", workers=2, progress=False, plots=False)
    assert serial.computed == dask.computed == 8 and not serial.failed and not dask.failed
    pd.testing.assert_frame_equal(serial.rows, dask.rows)
    assert (tmp_path / "serial" / "results.csv").read_bytes() == (tmp_path / "dask" / "results.csv").read_bytes()
    rows = serial.rows
    assert rows["point"].tolist() == list(range(8))
    assert rows[["scheduler.max_num_seqs", "kv.format", "workload.arrival.rate_rps"]].values.tolist()[:3] == \
        [[4, "bf16", 4], [4, "bf16", 8], [4, "q4_0", 4]]
    for col in ("goodput_rps", "slo_attainment", "ttft_s_p99", "tpot_s_median", "e2e_s_p99", "kv_need_bytes",
                "gpu_seconds_per_good", "memory_fit"):
        assert col in rows.columns
    # each row is exactly what `capsim run --set ...` gives for that point
    from sim.api import run_scenario
    ref = run_scenario(path, ["scheduler.max_num_seqs=16", "kv.format=q4_0", "workload.arrival.rate_rps=8"]).summary
    row = rows.iloc[7]
    assert row["goodput_rps"] == ref["goodput_rps"] and row["e2e_s_p99"] == ref["e2e_s"]["p99"]
    assert row["good"] == ref["good"] and row["peak_kv_bytes"] == ref["peak_kv_bytes"]
    # the swept knobs matter here (a q4_0 cache holds more sequences in the same 2 GiB)
    assert rows["goodput_rps"].nunique() > 1
    plots = sorted(p.name for p in (tmp_path / "serial").glob("*.png"))
    assert plots == ["sweep_kv_format.png", "sweep_scheduler_max_num_seqs.png", "sweep_workload_arrival_rate_rps.png"]


def test_resume_skips_finished_points_without_running_them(tmp_path, monkeypatch):
    path = write_scenario(tmp_path)
    out = tmp_path / "out"
    full = run_sweep(path, GRID[:2], out, workers=1, progress=False, plots=False)
    assert full.computed == 4
    before = (out / "points.jsonl").read_text()
    calls = []
    real = sweep.run_point
    monkeypatch.setattr(sweep, "run_point", lambda base, task: calls.append(task["key"]) or real(base, task))
    again = run_sweep(path, GRID, out, workers=1, progress=False, plots=False)   # one more axis: 8 points, 0 of them done
    assert again.skipped == 0 and again.computed == 8 and len(calls) == 8
    calls.clear()
    grown = run_sweep(path, ["scheduler.max_num_seqs=4,16,32", GRID[1], GRID[2]], out, workers=1, progress=False,
                      plots=False)
    assert grown.skipped == 8 and grown.computed == 4 and len(calls) == 4
    assert all('["scheduler.max_num_seqs",32]' in k for k in calls)
    assert (out / "points.jsonl").read_text().startswith(before)    # appended, never rewritten


def test_killed_sweep_resumes_without_recomputing_finished_points(tmp_path):
    path = write_scenario(tmp_path, workload={**SCENARIO["workload"], "num_requests": 700})
    out = tmp_path / "out"
    grid = ["scheduler.max_num_seqs=2,4,8,16,32,64", "kv.format=bf16,q8_0"]
    cmd = [sys.executable, "-m", "capsim.cli", "sweep", str(path), *sum((["--grid", g] for g in grid), []),
           "--out", str(out), "--workers", "1", "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    jsonl = out / "points.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if jsonl.exists() and jsonl.read_text().count("\n") >= 3:
            break
        time.sleep(0.02)
    assert proc.poll() is None, f"the sweep finished before it could be killed: {proc.stderr.read().decode()}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    kept = jsonl.read_text()
    done = {json.loads(line)["key"] for line in kept.splitlines() if line.strip()}
    assert 3 <= len(done) < 12
    resumed = run_sweep(path, grid, out, workers=1, progress=False, plots=False)
    assert resumed.skipped == len(done) and resumed.computed == 12 - len(done)
    assert jsonl.read_text().startswith(kept)
    keys = [json.loads(line)["key"] for line in jsonl.read_text().splitlines()]
    assert len(keys) == len(set(keys)) == 12                        # no point ran twice
    fresh = run_sweep(path, grid, tmp_path / "fresh", workers=1, progress=False, plots=False)
    assert (out / "results.csv").read_bytes() == (tmp_path / "fresh" / "results.csv").read_bytes()


def test_a_torn_last_line_is_ignored_and_rerun(tmp_path):
    path = write_scenario(tmp_path)
    out = tmp_path / "out"
    run_sweep(path, ["scheduler.max_num_seqs=4,16"], out, workers=1, progress=False, plots=False)
    lines = (out / "points.jsonl").read_text().splitlines()
    (out / "points.jsonl").write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2])  # killed mid-write
    again = run_sweep(path, ["scheduler.max_num_seqs=4,16"], out, workers=1, progress=False, plots=False)
    assert again.skipped == 1 and again.computed == 1
    assert len(pd.read_csv(out / "results.csv")) == 2


def test_another_scenario_in_the_same_directory_is_refused(tmp_path):
    a = write_scenario(tmp_path, "a.yaml")
    b = write_scenario(tmp_path, "b.yaml", seed=6)
    run_sweep(a, ["scheduler.max_num_seqs=4"], tmp_path / "out", workers=1, progress=False, plots=False)
    with pytest.raises(ConfigError, match="another scenario"):
        run_sweep(b, ["scheduler.max_num_seqs=4"], tmp_path / "out", workers=1, progress=False)
    fresh = run_sweep(b, ["scheduler.max_num_seqs=4"], tmp_path / "out", workers=1, progress=False, plots=False,
                      fresh=True)
    assert fresh.computed == 1


def test_invalid_points_are_reported_before_anything_runs(tmp_path, capsys):
    path = write_scenario(tmp_path)
    code = main(["sweep", str(path), "--grid", "scheduler.max_num_seqs=4,0", "--grid", "kv.format=bf16,bf17",
                 "--out", str(tmp_path / "out"), "--workers", "1"])
    assert code == 2
    err = capsys.readouterr().err
    assert "point 1 (scheduler.max_num_seqs=4, kv.format=bf17)" in err and "kv.format" in err
    assert "point 2 (scheduler.max_num_seqs=0, kv.format=bf16)" in err
    assert not (tmp_path / "out").exists()


def test_a_point_that_cannot_build_is_refused_before_anything_runs(tmp_path, capsys):
    path = write_scenario(tmp_path)  # valid by the schema; its KV budget holds no block (what `run` would refuse)
    args = ["sweep", str(path), "--grid", "kv.budget=2GiB,1KiB", "--out", str(tmp_path / "out"), "--workers", "1",
            "--no-progress"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "point 1 (kv.budget=1KiB)" in err and "holds no 16-token block" in err
    assert not (tmp_path / "out").exists()


def test_a_point_failing_at_run_time_is_recorded_and_retried_on_resume(tmp_path, capsys, monkeypatch):
    from sim.planning.sweep import Base
    real = Base.simulate

    def simulate(self, extra=()):
        if dict(extra).get("scheduler.max_num_seqs") == 16:
            raise ConfigError("point broke while running")
        return real(self, extra)

    monkeypatch.setattr(Base, "simulate", simulate)
    path = write_scenario(tmp_path)
    args = ["sweep", str(path), "--grid", "scheduler.max_num_seqs=4,16", "--out", str(tmp_path / "out"),
            "--workers", "1", "--no-progress"]
    assert main(args) == 1
    captured = capsys.readouterr()
    assert "point broke while running" in captured.err
    rows = pd.read_csv(tmp_path / "out" / "results.csv")
    assert rows["error"].isna().tolist() == [True, False]
    assert main(args) == 1
    assert "1 run now, 1 already done, 1 failed" in capsys.readouterr().out


def test_cli_sweep_prints_a_table_and_progress(tmp_path, capsys):
    path = write_scenario(tmp_path)
    assert main(["sweep", str(path), "--grid", "scheduler.max_num_seqs=4,16", "--out", str(tmp_path / "o"),
                 "--workers", "1"]) == 0
    captured = capsys.readouterr()
    assert "2/2 points (100%)" in captured.err
    assert "2 points: 2 run now, 0 already done" in captured.out
    assert captured.out.splitlines()[0].split()[:3] == ["point", "scheduler.max_num_seqs", "goodput"]


def test_parquet_when_pyarrow_is_present(tmp_path):
    pytest.importorskip("pyarrow")
    path = write_scenario(tmp_path)
    run_sweep(path, ["kv.format=bf16,q8_0"], tmp_path / "o", workers=1, progress=False, plots=False)
    pq = pd.read_parquet(tmp_path / "o" / "results.parquet")
    csv = pd.read_csv(tmp_path / "o" / "results.csv")
    assert pq["goodput_rps"].tolist() == csv["goodput_rps"].tolist()


def test_relative_paths_resolve_against_the_scenario_on_workers(tmp_path):
    """A trace next to the scenario is found whatever the worker's working directory."""
    sub = tmp_path / "elsewhere"
    sub.mkdir()
    (sub / "trace.csv").write_text("arrival_s,prompt_tokens,output_tokens\n"
                                   + "".join(f"{0.2 * i},{300 + 7 * i},{20 + i % 5}\n" for i in range(60)))
    path = write_scenario(sub, workload={"kind": "trace", "path": "trace.csv", "format": "csv"})
    res = run_sweep(path, ["workload.rate_scale=1,2"], tmp_path / "o", workers=2, progress=False, plots=False)
    assert not res.failed and res.rows["requests"].tolist() == [60, 60]


def test_a_broken_base_scenario_is_one_error_not_one_per_point(tmp_path, capsys):
    path = write_scenario(tmp_path)
    args = ["sweep", str(path), "--set", "kv.budget=1KiB", "--grid", "scheduler.max_num_seqs=4,8,16",
            "--out", str(tmp_path / "out"), "--workers", "1", "--no-progress"]
    assert main(args) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: every point: ") and "holds no 16-token block" in errors[0]
    assert not (tmp_path / "out").exists()


def test_resume_refuses_a_sweep_whose_trace_changed_since(tmp_path):
    """The manifest hashes the files the scenario names (here its trace): a resumed sweep would otherwise keep the
    points of the old trace beside new ones. --fresh starts over."""
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{0.2 * i},{300 + i},20\n" for i in range(30)))
    path = write_scenario(tmp_path, workload={"kind": "trace", "path": "trace.csv", "format": "csv"})
    out = tmp_path / "o"
    run_sweep(path, ["scheduler.max_num_seqs=4,16"], out, workers=1, progress=False, plots=False)
    manifest = json.loads((out / "sweep.json").read_text())
    assert list(manifest["inputs_sha256"]) == ["trace.csv"]
    again = run_sweep(path, ["scheduler.max_num_seqs=4,16"], out, workers=1, progress=False, plots=False)
    assert again.computed == 0  # same inputs: resumed
    trace.write_text(trace.read_text().replace(",20\n", ",60\n"))
    with pytest.raises(ConfigError, match=r"its sweep read other inputs \(trace.csv changed since\)"):
        run_sweep(path, ["scheduler.max_num_seqs=4,16"], out, workers=1, progress=False, plots=False)
    fresh = run_sweep(path, ["scheduler.max_num_seqs=4,16"], out, workers=1, progress=False, plots=False, fresh=True)
    assert fresh.computed == 2


def test_resume_refuses_a_sweep_whose_grid_file_changed_since(tmp_path):
    """A file named only in a --grid value (here the second of two traces) is hashed as well."""
    for name, out_tokens in (("a.csv", 20), ("b.csv", 30)):
        (tmp_path / name).write_text("arrival_s,prompt_tokens,output_tokens\n"
                                     + "".join(f"{0.2 * i},{300 + i},{out_tokens}\n" for i in range(20)))
    path = write_scenario(tmp_path, workload={"kind": "trace", "path": "a.csv", "format": "csv"})
    out, grid = tmp_path / "o", ["workload.path=a.csv,b.csv"]
    run_sweep(path, grid, out, workers=1, progress=False, plots=False)
    assert list(json.loads((out / "sweep.json").read_text())["inputs_sha256"]) == ["a.csv", "b.csv"]
    (tmp_path / "b.csv").write_text((tmp_path / "b.csv").read_text().replace(",30\n", ",40\n"))
    with pytest.raises(ConfigError, match=r"its sweep read other inputs \(b.csv changed since\)"):
        run_sweep(path, grid, out, workers=1, progress=False, plots=False)
