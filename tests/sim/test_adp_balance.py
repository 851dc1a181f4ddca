"""TensorRT-LLM's attention-DP balance: new prompts held until every rank has one (scheduler.attention_dp_balance_iters,
sim.core.engine.BalanceGate)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.core.engine import BalanceGate
from sim.core.step import StepPlan
from sim.io.config import load_scenario
from sim.io.errors import ConfigError
from tests.sim.helpers import closed_loop_yaml, run_file as _run


def _scenario(tmp_path: Path, balance: int, name: str = "s", extra: str = "") -> Path:
    p = tmp_path / f"{name}.yaml"
    p.write_text(f"""name: {name}
seed: 3
model: qwen3-235b-a22b
hardware: h100-sxm
weight_format: fp8
parallel: {{tp: 1, ep: 8, attention_dp: 8}}
kv: {{budget: {{gpu_memory_utilization: 0.9}}}}
scheduler: {{kind: chunked, max_num_seqs: 256, max_num_batched_tokens: 32768, chunk_tokens: 8192,
             attention_dp_balance_iters: {balance}{extra}}}
step_time: {{model: {{kind: ops}}, allow_extrapolation: true}}
{closed_loop_yaml(32, 20, 128, 4096, 256)}""")
    return p


def _plan(decodes: int) -> StepPlan:
    plan = StepPlan()
    plan.decode_seqs = decodes
    return plan


def test_the_gate_takes_arrivals_when_there_is_one_a_rank_or_after_its_passes():
    held: list = []
    gate = BalanceGate(4, 3, held)
    busy = _plan(8)                       # every rank decodes
    held.extend([1, 2])
    assert [gate.passed(busy), gate.passed(busy)] == [False, False]
    assert gate.passed(busy)              # the third pass holding them: timeout_iters reached
    assert not gate.passed(busy)          # counting again
    held.extend([3, 4])                   # four held, one a rank
    assert gate.passed(busy)
    assert gate.passed(_plan(3))          # fewer decodes than ranks: some rank idles, take them
    held.clear()
    assert not gate.passed(busy) and gate.waited == 0   # nothing held: nothing counts


def test_held_prompts_come_later_and_together_so_decodes_stall_less(tmp_path):
    """32 users spread over 20 s on 8 ranks: held until eight have arrived (or 60 passes), the prompts wait longer
    (TTFT up) and prefill together, so the decodes are interrupted less often (TPOT down)."""
    off, on = _run(_scenario(tmp_path, 0, "free")), _run(_scenario(tmp_path, 60, "held"))
    assert on.requests["ttft_s"].mean() > 1.5 * off.requests["ttft_s"].mean()
    assert on.requests["tpot_s"].mean() < off.requests["tpot_s"].mean()
    again = _run(_scenario(tmp_path, 60, "held"))
    assert again.requests.equals(on.requests)


def test_one_rank_or_no_balance_leaves_the_run_as_it_was(tmp_path):
    base = _run(_scenario(tmp_path, 0, "base"))
    single = _scenario(tmp_path, 60, "single")
    single.write_text(single.read_text().replace("tp: 1, ep: 8, attention_dp: 8", "tp: 8, ep: 8"))
    plain = _scenario(tmp_path, 0, "plain")
    plain.write_text(plain.read_text().replace("tp: 1, ep: 8, attention_dp: 8", "tp: 8, ep: 8"))
    assert _run(single).requests.equals(_run(plain).requests)
    assert base.summary["completed"] == 128


def test_it_cannot_be_set_with_a_receive_interval(tmp_path):
    with pytest.raises(ConfigError, match="recv_interval and attention_dp_balance_iters each gate arrivals"):
        load_scenario(_scenario(tmp_path, 60, extra=", recv_interval: 10"))
