"""TensorRT-LLM's batch waiting: new prompts held while others decode, until enough tokens or passes
(scheduler.batch_wait_iters, batch_wait_tokens; sim.core.engine.BatchWaitGate)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from sim.core.engine import BatchWaitGate
from sim.core.step import StepPlan
from sim.io.config import load_scenario
from sim.io.errors import ConfigError
from tests.sim.helpers import closed_loop_yaml, run_file as _run


def _scenario(tmp_path: Path, wait: str, name: str = "s", users: int = 8) -> Path:
    p = tmp_path / f"{name}.yaml"
    p.write_text(f"""name: {name}
seed: 5
model: llama-3.1-70b
hardware: h100-sxm
weight_format: fp8
parallel: {{tp: 4}}
kv: {{budget: {{gpu_memory_utilization: 0.9}}}}
scheduler: {{kind: continuous, max_num_seqs: 64, max_num_batched_tokens: 16384{wait}}}
step_time: {{model: {{kind: ops}}, allow_extrapolation: true}}
{closed_loop_yaml(users, 2, 64, 1024, 128)}""")
    return p


def _plan(decodes: int, positions: int | None = None) -> StepPlan:
    plan = StepPlan()
    plan.decode_seqs, plan.decode_positions = decodes, decodes if positions is None else positions
    return plan


def _prompts(*tokens: int) -> list:
    return [SimpleNamespace(prompt_tokens=t) for t in tokens]


def test_the_gate_holds_prompts_for_its_passes_or_until_its_tokens():
    held, running = [], {1: None, 2: None, 3: None}   # three sequences decode
    gate = BatchWaitGate(3, 2000, held, running)
    busy = _plan(3)
    assert gate.passed(busy) and gate.waited == 0      # nothing held: nothing counts
    held.extend(_prompts(1000))                        # 1,000 + 3 tokens < 2,000
    assert [gate.passed(busy) for _ in range(3)] == [False, False, False]
    assert gate.passed(busy) and gate.waited == 0      # three passes held: the fourth takes them
    assert not gate.passed(busy)                       # counting again
    held.extend(_prompts(997))                         # 1,997 + 3 decode tokens reach 2,000
    assert gate.passed(busy) and gate.waited == 0
    held[:] = _prompts(1000)
    assert not gate.passed(_plan(3, positions=9))      # 1,000 + 3 x 3 (two drafts each): still short
    assert gate.passed(_plan(3, positions=3000))       # 1,000 + 3 x 1,000 positions a sequence
    running.clear()
    assert gate.passed(busy)                           # nothing decodes: taken at once
    assert gate.opened()


def test_held_prompts_wait_the_passes_then_prefill_together(tmp_path):
    """Eight users: a prompt arriving while the others decode waits up to 20 passes (its TTFT grows by about 20
    decode steps), unless 8 prompts' tokens reach the threshold sooner."""
    off = _run(_scenario(tmp_path, "", "free"))
    on = _run(_scenario(tmp_path, ", batch_wait_iters: 20, batch_wait_tokens: 14000", "held"))
    step = off.requests["tpot_s"].median()
    grew = on.requests["ttft_s"].median() - off.requests["ttft_s"].median()
    assert 8 * step < grew < 22 * step
    assert on.summary["completed"] == off.summary["completed"] == 64
    assert _run(_scenario(tmp_path, ", batch_wait_iters: 20, batch_wait_tokens: 14000", "held")).requests.equals(
        on.requests)
    soon = _run(_scenario(tmp_path, ", batch_wait_iters: 20, batch_wait_tokens: 1000", "soon"))
    assert soon.requests.equals(off.requests)          # one prompt reaches 1,000 tokens: never held


@pytest.mark.parametrize("extra, message", [
    (", batch_wait_iters: 20", "set both or neither"),
    (", batch_wait_tokens: 100", "set both or neither"),
    (", batch_wait_iters: 20, batch_wait_tokens: 100, recv_interval: 4", "recv_interval and batch_wait_iters each "
                                                                          "gate arrivals"),
])
def test_half_a_setting_or_two_gates_are_refused(tmp_path, extra, message):
    with pytest.raises(ConfigError, match=message):
        load_scenario(_scenario(tmp_path, extra))
