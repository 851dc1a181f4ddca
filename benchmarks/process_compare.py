"""Whole-process comparison of capsim checkouts, as a user runs them: `<cli> run SCENARIO --out DIR --progress`
in a fresh process, timed by the kernel (wait4: user + system CPU seconds of the whole process, imports,
reading the trace, simulating, writing the three output files; ru_maxrss for the peak).

Resident memory is read from /proc/PID/statm every 0.05 s and paired with the `--progress` count of
finished requests the process prints on stderr, so the growth per finished request is measured within
the run (between 25 % and 100 % of the requests finished, before the result tables are built).

Runs alternate between checkouts (A B A B ...) so a change in the machine's speed hits both alike;
the ratio of CPU seconds is taken within one invocation. The three output files of every run are
hashed: equal hashes mean byte-identical outputs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

PAGE = os.sysconf("SC_PAGE_SIZE")
PROGRESS = re.compile(r"(\d+)/(\d+) requests done")
OUTPUTS = ("summary.json", "requests.csv", "iterations.csv")


def cli_of(tree: Path) -> list[str]:
    """The command-line module of a checkout: capsim.cli after the package move, sim.cli before it."""
    if (tree / "capsim" / "cli.py").is_file():
        return [sys.executable, "-m", "capsim.cli"]
    if (tree / "sim" / "cli.py").is_file():
        return [sys.executable, "-m", "sim.cli"]
    raise SystemExit(f"bench_sim: {tree} is not a capsim checkout (no capsim/cli.py or sim/cli.py)")


def _rss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return None


def run_once(tree: Path, scenario: Path) -> dict:
    """One `run` of `scenario` with the checkout `tree` in a fresh process; CPU, memory, output hashes."""
    out = Path(tempfile.mkdtemp(prefix="bench_out_")) / "out"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cli_of(tree) + ["run", str(scenario), "--out", str(out), "--progress"], cwd=tree,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    state = {"done": 0, "total": 0, "marks": [], "samples": [], "tail": b""}

    def read_progress() -> None:
        while True:
            chunk = os.read(proc.stderr.fileno(), 4096)
            if not chunk:
                return
            text = state["tail"] + chunk
            parts = re.split(rb"[\r\n]", text)
            state["tail"] = parts[-1][-2000:]
            for part in parts[:-1]:
                m = PROGRESS.search(part.decode(errors="replace"))
                if m:
                    state["done"], state["total"] = int(m.group(1)), int(m.group(2))
                    r = _rss(proc.pid)
                    if r is not None:
                        state["marks"].append((state["done"], r, time.perf_counter() - t0))

    reader = threading.Thread(target=read_progress, daemon=True)
    reader.start()
    peak, usage = 0, None
    while True:  # wait4 with WNOHANG: the child's own rusage, and nobody else reaps it
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            break
        r = _rss(proc.pid)
        if r is not None:
            peak = max(peak, r)
            state["samples"].append((time.perf_counter() - t0, state["done"], r))
        time.sleep(0.05)
    reader.join(timeout=5)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"bench_sim: {tree}: run {scenario} failed: {state['tail'].decode(errors='replace')}")
    hashes = {name: hashlib.sha256((out / name).read_bytes()).hexdigest() for name in OUTPUTS}
    summary = json.loads((out / "summary.json").read_text())
    for name in OUTPUTS:
        (out / name).unlink()
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "user_s": usage.ru_utime, "sys_s": usage.ru_stime,
            "wall_s": wall, "ru_maxrss": usage.ru_maxrss * 1024, "rss_peak_sampled": peak,
            "growth_b_per_request": _growth(state["marks"], state["total"]), "requests": state["total"],
            "marks": _thin(state["marks"]), "hashes": hashes, "summary": summary}


def _growth(marks: list[tuple], total: int) -> float | None:
    """Resident bytes added per finished request between 25 % and 100 % finished (None: too few marks)."""
    if total < 1000 or not marks:
        return None
    q1 = min(marks, key=lambda m: abs(m[0] - 0.25 * total))
    q4 = max(marks, key=lambda m: m[0])
    if q4[0] - q1[0] < 0.5 * total:
        return None
    return (q4[1] - q1[1]) / (q4[0] - q1[0])


def _thin(marks: list[tuple], keep: int = 21) -> list[dict]:
    step = max(1, len(marks) // (keep - 1))
    picked = marks[::step] + ([marks[-1]] if marks and marks[-1] is not marks[::step][-1] else [])
    return [{"done": d, "rss": r, "wall_s": t} for d, r, t in picked]


def flat_differences(a: dict, b: dict, prefix: str = "") -> dict[str, tuple]:
    """Dotted keys present in both summaries whose values differ: key -> (value in a, value in b)."""
    out = {}
    for k in a.keys() & b.keys():
        if isinstance(a[k], dict) and isinstance(b[k], dict):
            out.update(flat_differences(a[k], b[k], f"{prefix}{k}."))
        elif a[k] != b[k]:
            out[prefix + k] = (a[k], b[k])
    return dict(sorted(out.items()))


def run_case(tree: Path, scenario: Path) -> dict:
    """One measured run (see run_once)."""
    return run_once(tree, scenario)


def write_scenarios(folder: Path, cases: dict[str, dict]) -> dict[str, Path]:
    """Each case's scenario as a YAML file (the same file for every checkout)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, sc in cases.items():
        paths[name] = folder / f"{name}.yaml"
        paths[name].write_text(yaml.safe_dump(sc, sort_keys=False))
    return paths


def compare(trees: list[tuple[str, Path]], scenarios: dict[str, Path | dict[str, Path]], repeat: dict[str, int],
            log=print) -> dict:
    """Alternate the checkouts on every case; min and median CPU, peak memory, growth, output equality.
    A case's scenario is one file for every checkout, or a file per checkout label."""
    result = {}
    for case, path in scenarios.items():
        runs: dict[str, list[dict]] = {label: [] for label, _ in trees}
        for k in range(repeat.get(case, 1)):
            for label, tree in trees:
                r = run_case(tree, path[label] if isinstance(path, dict) else path)
                runs[label].append(r)
                log(f"  {case} #{k + 1} {label}: CPU {r['cpu_s']:.2f} s, wall {r['wall_s']:.1f} s, "
                    f"peak {r['ru_maxrss'] / 2**20:,.0f} MiB")
        summary = {}
        for label, rs in runs.items():
            cpus = [r["cpu_s"] for r in rs]
            summary[label] = {"cpu_min_s": min(cpus), "cpu_median_s": statistics.median(cpus), "cpu_all_s": cpus,
                              "wall_all_s": [r["wall_s"] for r in rs],
                              "ru_maxrss_max": max(r["ru_maxrss"] for r in rs),
                              "growth_b_per_request": [r["growth_b_per_request"] for r in rs],
                              "requests": rs[0]["requests"], "hashes": rs[0]["hashes"],
                              "same_outputs_every_run": all(r["hashes"] == rs[0]["hashes"] for r in rs),
                              "runs": rs}
        first = trees[0][0]
        for label in summary:
            s = summary[label]
            s["cpu_min_ratio_to_first"] = s["cpu_min_s"] / summary[first]["cpu_min_s"]
            s["cpu_median_ratio_to_first"] = s["cpu_median_s"] / summary[first]["cpu_median_s"]
            s["outputs_equal_first"] = s["hashes"] == summary[first]["hashes"]
            mine, theirs = summary[first]["runs"][0]["summary"], s["runs"][0]["summary"]
            common = sorted(set(mine) & set(theirs))
            s["csv_equal_first"] = all(s["hashes"][f] == summary[first]["hashes"][f] for f in OUTPUTS[1:])
            s["summary_common_keys_equal_first"] = all(mine[k] == theirs[k] for k in common)
            s["summary_keys_only_in_first"] = sorted(set(mine) - set(theirs))
            s["summary_keys_only_here"] = sorted(set(theirs) - set(mine))
        name = {k: str(v.relative_to(v.parents[1])) for k, v in path.items()} if isinstance(path, dict) else path.name
        result[case] = {"scenario": name, "repeat": repeat.get(case, 1), "trees": summary}
    return result
