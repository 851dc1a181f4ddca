"""Digests of every shipped scenario's outputs and of the figures' data, for the byte-identity goldens.

`python -m tests.golden.outputs --write` records them (tests/golden/outputs.json); the tests compare
a fresh run with the recorded digests, so a refactor or a speed-up that changes any output byte of any
shipped scenario fails loudly. Re-record only for a change that is meant to change outputs, and say so
in the commit.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("outputs.json")
CLI = ["-m", "capsim.cli"]
OUTPUT_FILES = ("summary.json", "requests.csv", "iterations.csv")


def shipped_scenarios() -> list[Path]:
    """Every scenario under scenarios/, in a stable order."""
    return sorted((REPO / "scenarios").rglob("*.yaml"))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def scenario_digests(path: Path) -> dict[str, str]:
    """Run one scenario through the CLI (as a user would) and hash each output file."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        subprocess.run([sys.executable, *CLI, "run", str(path), "--out", str(out)],
                       check=True, cwd=REPO, capture_output=True)
        return {name: sha256(out / name) for name in OUTPUT_FILES}


def figure_digests() -> dict[str, str]:
    """Hash every figure's data CSV (PNGs are not compared: they depend on the matplotlib build)."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, *CLI, "figures", "--out", tmp], check=True, cwd=REPO,
                       capture_output=True)
        return {p.name: sha256(p) for p in sorted(Path(tmp).glob("*.csv"))}


def record() -> dict:
    rel = {str(p.relative_to(REPO)): scenario_digests(p) for p in shipped_scenarios()}
    return {"scenarios": rel, "figures": figure_digests()}


if __name__ == "__main__":
    data = record()
    if "--write" in sys.argv:
        GOLDEN.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(json.dumps(data, indent=1, sort_keys=True))
