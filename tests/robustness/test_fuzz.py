"""Fuzz the inputs a user hands capsim: scenarios, traces, profiles and command-line arguments.

Valid files are mutated (wrong types, NaN/inf/huge/negative/zero numbers, missing, unknown and
duplicate keys, truncated or garbled text) and run in-process through `capsim.cli.main` on a small
workload under a wall-clock deadline. Every case must end in either a clean run (no NaN/Infinity in
summary.json) or clean `error:` lines that name the file, the YAML path (or line) and the bad value.
Any other exception is a traceback the user would have seen: the test fails with it.

Size: CAPSIM_FUZZ_EXAMPLES examples in all (default 320, a CI-sized run of well under a minute);
the nightly run sets CAPSIM_FUZZ_EXAMPLES=2000 or more (random seeds, not derandomized).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import shutil
import signal
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capsim.cli import main
from sim.io.profiles import profiles_dir
from tests.sim.helpers import REPO_SCENARIOS

TOTAL = int(os.environ.get("CAPSIM_FUZZ_EXAMPLES", "320"))
NIGHTLY = "CAPSIM_FUZZ_EXAMPLES" in os.environ
CASE_DEADLINE_S = 20.0  # one case: parse, validate, simulate a handful of requests (typically < 0.2 s)

FUZZ = settings(max_examples=max(TOTAL // 4, 10), deadline=None, derandomize=not NIGHTLY, database=None,
                suppress_health_check=list(HealthCheck), print_blob=True)

BAD_SCALARS = [None, True, False, "", "x", "12 parsecs", -1, 0, 1, 0.5, -0.5, 1e-300, float("nan"), float("inf"),
               float("-inf"), 1e30, 10**30, 2**63, 1.7e308, [], {}, [1, 2], {"kind": "nope"}]


class Hang(BaseException):
    """Raised by the case deadline; BaseException so that no `except Exception` swallows it."""


@contextlib.contextmanager
def deadline(seconds: float):
    def fire(signum, frame):
        raise Hang(f"case ran past its {seconds:.0f} s deadline")
    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def invoke(argv: list[str]) -> tuple[int, str, str]:
    """Run `capsim argv` in-process; return (exit code, stdout, stderr). Tracebacks propagate."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), deadline(CASE_DEADLINE_S):
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse's usage errors
            rc = exc.code if isinstance(exc.code, int) else 2
    return rc, out.getvalue(), err.getvalue()


def _no_constants(text):
    raise AssertionError(f"summary.json holds the non-standard JSON token {text}")


def check_outcome(rc: int, out: str, err: str, files: list[Path], mutation: dict | None) -> None:
    """A clean run, or error lines naming a file (or --set / the argument), a place, and the value."""
    assert rc in (0, 2), f"exit {rc}\n{err}"
    if rc == 0:
        if out.lstrip().startswith("{"):
            json.loads(out, parse_constant=_no_constants)
        return
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert lines, f"exit 2 without an error line:\n{err}"
    if err.startswith("usage:"):  # argparse: names the argument and the value itself
        assert re.search(r"error: argument [-\w/]+:", err), err
        return
    names = [str(f) for f in files]
    for line in lines:
        assert line.startswith("error: "), line
        body = line[len("error: "):]
        assert any(body.startswith(n + ":") for n in names) or body.startswith(("--set ", "--")), \
            f"error does not start with the file it is about: {line!r} (files: {names})"
        assert re.match(r"^(--set [\w.]+|\S+)(: /\S+)*: (line \d+|[\w.\[\]<>-]+)", body), f"no place named: {line!r}"
    if mutation and mutation.get("op") == "set" and mutation["file"] in names:
        _check_value_named(lines, mutation)


def _check_value_named(lines: list[str], m: dict) -> None:
    """An error exactly at the mutated path shows the value; any error shows the path or an ancestor."""
    path, value = m["path"], m["value"]
    at = [ln for ln in lines if f": {path}: " in ln]
    if at and not isinstance(value, (dict, list)) and value is not None:
        shown = {repr(value), str(value)}
        if isinstance(value, float) and math.isfinite(value):
            shown |= {f"{value:g}", f"{value:.6g}"}
        if isinstance(value, int) and not isinstance(value, bool):
            shown |= {f"{value:,}", f"{value:g}" if abs(value) < 1e300 else ""}
        shown.discard("")
        assert any(any(s in ln for s in shown) for ln in at), f"value {value!r} not shown in {at}"


# ---- the valid inputs that get mutated ------------------------------------------------------------

TRACE_CSV = "arrival_s,prompt_tokens,output_tokens\n0.0,120,8\n0.05,300,4\n0.1,64,12\n0.4,900,6\n"
TRACE_JSONL = "".join(json.dumps({"arrival_s": t, "prompt_tokens": p, "output_tokens": o}) + "\n"
                      for t, p, o in ((0.0, 120, 8), (0.05, 300, 4), (0.2, 64, 12)))


def _small(data: dict) -> dict:
    data["name"] = data.get("name", "fuzz")
    wl = data["workload"]
    if wl["kind"] == "synthetic":
        wl["num_requests"] = 6
        wl["arrival"] = {"kind": "poisson", "rate_rps": 20.0}
    if wl["kind"] == "requests":
        wl["requests"] = wl["requests"][:4]
    return data


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict:
    """Small valid scenarios, a trace of each plain format, and copies of the profiles they name."""
    root = tmp_path_factory.mktemp("fuzz-valid")
    shutil.copy(profiles_dir() / "models" / "qwen3-8b.yaml", root / "qwen3-8b.yaml")
    shutil.copy(profiles_dir() / "hardware" / "rtx-pro-6000-bw-ws.yaml", root / "rtx-pro-6000-bw-ws.yaml")
    shutil.copy(profiles_dir() / "fitted" / "cpu__qwen2.5-0.5b__fp32.yaml", root / "fitted-profile.yaml")
    (root / "trace.csv").write_text(TRACE_CSV)
    (root / "trace.jsonl").write_text(TRACE_JSONL)
    scen = {}
    for name, src in (("synthetic", "capacity-example.yaml"), ("requests", "chapter8/four-requests-continuous.yaml"),
                      ("fixed", "chapter8/four-requests-fixed.yaml"), ("efficiency", "chapter8/scheme-b.yaml")):
        data = _small(yaml.safe_load((REPO_SCENARIOS / src).read_text()))
        if name == "efficiency":
            data["workload"]["requests"] = data["workload"]["requests"][:3]
        scen[name] = data
    base = scen["synthetic"]
    scen["profiles"] = {**base, "model": "qwen3-8b.yaml", "hardware": "rtx-pro-6000-bw-ws.yaml"}
    scen["trace"] = {**base, "workload": {"kind": "trace", "path": "trace.csv", "format": "csv"}}
    scen["trace-jsonl"] = {**base, "workload": {"kind": "trace", "path": "trace.jsonl", "format": "jsonl"}}
    scen["fitted"] = {**base, "model": "qwen2.5-0.5b", "hardware": "cpu-epyc-2c", "weight_format": "fp32",
                      "kv": {"budget": "2GiB"},
                      "scheduler": {"kind": "continuous", "max_num_seqs": 4, "max_num_batched_tokens": 1024},
                      "step_time": {"model": {"kind": "profile", "path": "fitted-profile.yaml"}, "allow_extrapolation": True},
                      "workload": {**base["workload"],
                                   "prompt_tokens": {"kind": "uniform", "low": 16, "high": 200},
                                   "output_tokens": {"kind": "fixed", "value": 4}}}
    for name, data in scen.items():
        (root / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    # every base input must run cleanly, or the fuzz would test nothing
    for name in scen:
        rc, _, err = invoke(["run", str(root / f"{name}.yaml"), "--json"])
        assert rc == 0, f"{name}: {err}"
    return {"root": root, "scenarios": sorted(scen)}


# ---- mutations ------------------------------------------------------------------------------------


def _paths(node, prefix=()) -> list[tuple]:
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            out.append(prefix + (k,))
            out.extend(_paths(v, prefix + (k,)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.append(prefix + (i,))
            out.extend(_paths(v, prefix + (i,)))
    return out


def _parent(tree, path):
    node = tree
    for k in path[:-1]:
        node = node[k]
    return node


def mutate_tree(draw, tree: dict, file: Path) -> dict:
    """Change one node of a parsed YAML/JSON tree in place; describe the change."""
    path = draw(st.sampled_from(_paths(tree)))
    parent, key = _parent(tree, path), path[-1]
    op = draw(st.sampled_from(["set", "set", "set", "delete", "unknown", "scale"]))
    dotted = ".".join(str(p) for p in path)
    if op == "delete" and isinstance(parent, dict):
        del parent[key]
        return {"op": "delete", "path": dotted, "file": str(file)}
    if op == "unknown" and isinstance(parent, dict):
        parent[key + "_x" if isinstance(key, str) else "x"] = 1
        return {"op": "unknown", "path": dotted, "file": str(file)}
    if op == "scale" and isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
        factor = draw(st.sampled_from([-1, 0, 1000, 1e6]))
        parent[key] = parent[key] * factor
        return {"op": "set", "path": dotted, "value": parent[key], "file": str(file)}
    value = draw(st.sampled_from(BAD_SCALARS))
    parent[key] = value
    return {"op": "set", "path": dotted, "value": value, "file": str(file)}


def mutate_text(draw, text: str) -> str:
    """Text-level damage: truncation, a duplicated line (duplicate key), garbage, a stray tab."""
    op = draw(st.sampled_from(["truncate", "duplicate", "garbage", "tab"]))
    lines = text.splitlines(keepends=True)
    if op == "truncate":
        return text[:draw(st.integers(0, max(len(text) - 1, 0)))]
    i = draw(st.integers(0, max(len(lines) - 1, 0)))
    if op == "duplicate":
        return "".join(lines[:i + 1] + lines[i:])
    if op == "garbage":
        junk = draw(st.sampled_from(["\x00\x01", "{{", "]]", ": :", "\ufffd", "- - -", "&a *b", "!!python/object:os.system"]))
        return "".join(lines[:i] + [junk + "\n"] + lines[i:])
    return "".join(lines[:i] + ["\t" + ln for ln in lines[i:i + 1]] + lines[i + 1:])


def _dump(tree) -> str:
    return yaml.safe_dump(tree, sort_keys=False, allow_unicode=True)


def _fresh_copy(inputs, tmp) -> Path:
    for f in inputs["root"].iterdir():
        shutil.copy(f, tmp / f.name)
    return tmp


def _mutate_file(data, path: Path):
    """Mutate a YAML file in place, either as a tree (a key or value changed; returns that mutation)
    or as text (truncated, bytes changed; returns None)."""
    if data.draw(st.booleans(), label="tree-level"):
        tree = yaml.safe_load(path.read_text())
        mutation = mutate_tree(data.draw, tree, path)
        path.write_text(_dump(tree))
        return mutation
    path.write_text(mutate_text(data.draw, path.read_text()))
    return None


# ---- the fuzz tests -------------------------------------------------------------------------------


@FUZZ
@given(data=st.data())
def test_fuzz_scenarios(inputs, tmp_path_factory, data):
    work = _fresh_copy(inputs, tmp_path_factory.mktemp("s"))
    name = data.draw(st.sampled_from(inputs["scenarios"]))
    path = work / f"{name}.yaml"
    mutation = _mutate_file(data, path)
    rc, out, err = invoke(["run", str(path), "--json"])
    check_outcome(rc, out, err, [path], mutation)


@FUZZ
@given(data=st.data())
def test_fuzz_traces(inputs, tmp_path_factory, data):
    work = _fresh_copy(inputs, tmp_path_factory.mktemp("t"))
    fmt = data.draw(st.sampled_from(["csv", "jsonl"]))
    trace = work / f"trace.{fmt}"
    text = trace.read_text()
    how = data.draw(st.sampled_from(["cell", "text", "row"]))
    if how == "cell":
        cell = data.draw(st.sampled_from(["nan", "inf", "-1", "0", "1e30", "", "abc", "1.5", "true", "null",
                                          "99999999999999999999999", "-0.0", "1e-9"]))
        lines = text.splitlines()
        i = data.draw(st.integers(1, len(lines) - 1))
        if fmt == "csv":
            cells = lines[i].split(",")
            cells[data.draw(st.integers(0, len(cells) - 1))] = cell
            lines[i] = ",".join(cells)
        else:
            row = json.loads(lines[i])
            key = data.draw(st.sampled_from(sorted(row)))
            row[key] = json.loads(cell) if cell in ("true", "null", "1.5", "-1", "0", "1e30") else cell
            lines[i] = json.dumps(row)
        text = "\n".join(lines) + "\n"
    elif how == "row":
        extra = data.draw(st.sampled_from(["0.5,10", "0.5,10,3,4", "0.5", ",,,", "1,2,3\r", '{"a": 1}', "[1,2,3]"]))
        text += extra + "\n"
    else:
        text = mutate_text(data.draw, text)
    trace.write_text(text)
    path = work / ("trace.yaml" if fmt == "csv" else "trace-jsonl.yaml")
    rc, out, err = invoke(["run", str(path), "--json"])
    check_outcome(rc, out, err, [path, trace], None)


@FUZZ
@given(data=st.data())
def test_fuzz_profiles(inputs, tmp_path_factory, data):
    """Mutated hardware, model and fitted step-time profiles, named by a scenario."""
    work = _fresh_copy(inputs, tmp_path_factory.mktemp("p"))
    which = data.draw(st.sampled_from(["qwen3-8b.yaml", "rtx-pro-6000-bw-ws.yaml", "fitted-profile.yaml"]))
    prof = work / which
    mutation = _mutate_file(data, prof)
    scenario = work / ("fitted.yaml" if which == "fitted-profile.yaml" else "profiles.yaml")
    rc, out, err = invoke(["run", str(scenario), "--json"])
    check_outcome(rc, out, err, [scenario, prof], mutation)


ARG_VALUES = ["0", "-5", "2", "1.5", "nan", "inf", "-inf", "1e30", "abc", "", "99999999999999999999", "12GiB", "0.5"]


@FUZZ
@given(data=st.data())
def test_fuzz_command_line(inputs, tmp_path_factory, data):
    """`capsim memory` flags and `capsim run --set` values."""
    if data.draw(st.booleans(), label="memory"):
        flags = ["--prompt", "--output", "--requests", "--shared-prefix", "--block-size", "--kv-budget",
                 "--gpu-memory-utilization", "--activation", "--context", "--batch", "--kv-format", "--weight-format"]
        argv = ["memory", "--model", data.draw(st.sampled_from(["qwen3-8b", "deepseek-v3", "nosuch", "/bin/ls"]))]
        for flag in data.draw(st.lists(st.sampled_from(flags), min_size=1, max_size=4, unique=True)):
            argv += [flag, data.draw(st.sampled_from(ARG_VALUES))]
        if "--gpu-memory-utilization" in argv or data.draw(st.booleans()):
            argv += ["--hardware", data.draw(st.sampled_from(["h100-sxm", "l4", "nosuch"]))]
        rc, out, err = invoke(argv + ["--json"])
        assert rc in (0, 2), f"exit {rc}\n{err}"
        if rc == 0:
            json.loads(out, parse_constant=_no_constants)
        elif not err.startswith("usage:"):  # argparse's own: checked in check_outcome
            named = [a for a in argv[1:] if a.startswith("--")] + [a for a in argv[1:] if not a.startswith("--")]
            for line in (ln for ln in err.splitlines() if ln.startswith("error: ")):
                assert any(a and a in line for a in named), f"names no flag nor value: {line!r}"
        else:
            check_outcome(rc, out, err, [], None)
        return
    scenario = inputs["root"] / f"{data.draw(st.sampled_from(inputs['scenarios']))}.yaml"
    tree = yaml.safe_load(scenario.read_text())
    path = ".".join(str(p) for p in data.draw(st.sampled_from([p for p in _paths(tree) if all(
        isinstance(k, str) for k in p)])))
    value = data.draw(st.sampled_from(ARG_VALUES + [".nan", ".inf", "true", "[1", "{a: 1}", "~"]))
    rc, out, err = invoke(["run", str(scenario), "--json", "--set", f"{path}={value}"])
    check_outcome(rc, out, err, [scenario], None)


def test_a_budget_beyond_any_card_is_no_hang(inputs):
    """Issue 16's hang: kv.budget 1e15 B (the largest number an input may hold) runs in a blink now."""
    rc, out, _ = invoke(["run", str(inputs["root"] / "synthetic.yaml"), "--json", "--set", "kv.budget=1.0e+15"])
    assert rc == 0 and json.loads(out)["kv_budget_bytes"] == 10**15
