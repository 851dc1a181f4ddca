"""Builders for small scenarios used across simulator tests."""

from __future__ import annotations

import copy

from sim.io.config import Scenario
from sim.core.simulation import Simulation

CHAPTER_FIT = {"kind": "linear", "constant_s": 0.02622, "per_new_token_s": 30.4e-6, "per_pair_s": 3.0e-9}


def scenario(**overrides) -> Scenario:
    base = {
        "name": "test",
        "seed": 7,
        "model": "qwen3-8b",
        "hardware": "rtx-pro-6000-bw-ws",
        "kv": {"block_tokens": 16, "format": "bf16", "budget": "12GiB"},
        "scheduler": {"kind": "continuous", "max_num_seqs": 32, "max_num_batched_tokens": 8192},
        "step_time": {"model": dict(CHAPTER_FIT)},
        "workload": {"kind": "synthetic", "num_requests": 300,
                     "arrival": {"kind": "poisson", "rate_rps": 4.0},
                     "prompt_tokens": {"kind": "lognormal", "median": 600, "sigma": 0.7, "max": 4000},
                     "output_tokens": {"kind": "lognormal", "median": 60, "sigma": 0.7, "max": 400}},
    }
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        node = merged
        parts = key.split("__")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return Scenario.model_validate(merged)


def run(sc: Scenario):
    return Simulation(sc, ".").run()

from pathlib import Path  # noqa: E402

REPO_SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def closed_loop_yaml(users: int, ramp_up_s: float, num_requests: int, prompt: int, output: int) -> str:
    """A scenario file's `workload` block: a closed loop of `users` ramped up over `ramp_up_s`, fixed lengths."""
    return f"""workload:
  kind: closed_loop
  users: {users}
  ramp_up_s: {ramp_up_s}
  num_requests: {num_requests}
  prompt_tokens: {{kind: fixed, value: {prompt}}}
  output_tokens: {{kind: fixed, value: {output}}}
"""


def run_file(path):
    """Load the scenario file at `path` and run it."""
    from sim.io.config import load_scenario
    sc, base = load_scenario(path)
    return Simulation(sc, base).run()
