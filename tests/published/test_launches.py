"""What InferenceX's launch scripts set that a replay follows (sim.published.launches): TensorRT-LLM's batch waiting
for its Llama-70B 1k/1k runs below TP 8, and the front end of launches with postprocess workers. Eight real rows of
the silicon sample (silicon_sample_launches_8rows.csv): Llama-3.1-70B on B200 under TensorRT-LLM (FP8 TP2 1k/1k,
FP4 TP4 1k/1k, FP8 TP8 1k/1k, FP8 TP2 8k/1k), gpt-oss-120b and DeepSeek-R1 under TensorRT-LLM (InferenceX), Qwen3-32B
under TensorRT-LLM (NVIDIA's gap-analysis runs) and Llama-3.1-70B under vLLM."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import pytest

from sim.published.engines import ENGINES
from sim.published.launches import inferencex, launch_config, launch_of, launch_scheduler, postprocess_workers
from sim.published.predict import build_case
from sim.published.report import _record
from sim.published.rows import read_published

FIXTURE = Path(__file__).parent / "silicon_sample_launches_8rows.csv"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rows():
    return read_published(FIXTURE)


def test_provenance_is_read_from_the_source_text(rows):
    assert [inferencex(r) for r in rows] == [True] * 6 + [False, True]
    assert rows[6].source.startswith("source_file=/Users/harrli/projects/aic-auto-gap-analysis/")


def test_the_llama_1k1k_launches_below_tp8_wait_for_batches(rows):
    fp8_tp2, fp4_tp4, fp8_tp8, long_prompts, gpt_oss, deepseek, gap, vllm = rows
    assert launch_scheduler(fp8_tp2) == {"batch_wait_iters": 20, "batch_wait_tokens": 14745}   # 0.9 x 16,384
    assert launch_scheduler(fp4_tp4) == {"batch_wait_iters": 20, "batch_wait_tokens": 1843}    # 0.9 x 2,048
    for other in (fp8_tp8, long_prompts, gpt_oss, deepseek, gap, vllm):
        assert launch_scheduler(other) == {}
    sched = build_case(fp8_tp2).scenario["scheduler"]
    assert (sched["batch_wait_iters"], sched["batch_wait_tokens"]) == (20, 14745)
    assert "batch_wait_iters" not in build_case(fp8_tp8).scenario["scheduler"]


def test_launches_with_postprocess_workers_take_their_own_front_end(rows):
    fp8_tp2, _, _, long_prompts, gpt_oss, deepseek, gap, vllm = rows
    assert [postprocess_workers(r) for r in rows] == [2, 2, 2, 2, 4, 0, 0, 0]
    trt = ENGINES["trtllm"]
    base, per_user = trt.frontend_postprocess_ms
    assert build_case(long_prompts).frontend_s == pytest.approx((base + per_user * 4) / 1e3)
    base, per_user = trt.frontend_ms
    assert build_case(deepseek).frontend_s == pytest.approx((base + per_user * deepseek.concurrency) / 1e3)
    assert build_case(gap).frontend_s == pytest.approx((base + per_user * gap.concurrency) / 1e3)
    base, per_user = ENGINES["vllm"].frontend_ms          # vLLM states no second pair
    assert build_case(vllm).frontend_s == pytest.approx((base + per_user * vllm.concurrency) / 1e3)
    assert build_case(long_prompts, frontend="off").frontend_s == 0.0


def test_a_report_row_says_what_its_launch_set(rows):
    fp8_tp2, _, _, _, gpt_oss, deepseek, *_ = rows
    assert _record(fp8_tp2, {"skipped": "x"})["launch"] == {"batch_wait_iters": 20, "batch_wait_tokens": 14745,
                                                            "postprocess_workers": 2}
    assert launch_of(gpt_oss) == {"postprocess_workers": 4}
    assert "launch" not in _record(deepseek, {"skipped": "x"})


def test_inferencex_vllm_launches_keep_vllms_scheduler_defaults(rows):
    """InferenceX's vLLM scripts run `vllm serve` with their own flags, not AIConfigurator's generated benchmark limits
    (max_num_seqs = the users, a budget of users + ISL + 1,500, a CUDA graph per batch size): its rows replay vLLM's
    defaults; rows of other launches keep the engine's choice."""
    vllm = rows[7]
    assert (vllm.backend, inferencex(vllm), vllm.concurrency, vllm.isl) == ("vllm", True, 64, 1024)
    assert launch_config(vllm, "aic_benchmark") == "defaults"
    assert launch_of(vllm) == {"engine_config": "defaults"}
    case = build_case(vllm).scenario
    assert case == build_case(vllm, engine_config="defaults").scenario
    assert case["scheduler"] == ENGINES["vllm"].scheduler
    assert case["step_time"]["graph_sizes"] == ENGINES["vllm"].graph_sizes
    other = replace(vllm, source="")                                          # a launch not known
    assert launch_config(other, "aic_benchmark") == "aic_benchmark"
    sched = build_case(other).scenario["scheduler"]
    assert (sched["max_num_seqs"], sched["max_num_batched_tokens"]) == (64, 64 + 1024 + 1500)
    for trt in rows[:7]:                                                      # TensorRT-LLM keeps its engine's choice
        assert launch_config(trt, "aic_benchmark") == "aic_benchmark"


def test_the_front_end_fit_gives_launches_with_postprocess_workers_a_pair_of_their_own(tmp_path):
    """TensorRT-LLM rows measured 120 ms + 1 ms per user over their prediction, those whose launch has postprocess
    workers 30 ms over: the fit finds each pair on its even lines."""
    spec = importlib.util.spec_from_file_location("published_peer_launch", ROOT / "benchmarks" / "published_peer.py")
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    out = []
    for line in range(2, 26):
        users = (4, 8, 16, 64)[line % 4]
        workers = line % 3 == 0
        over = 30.0 if workers else 120.0 + users
        out.append({"id": f"r{line}", "line": line, "backend": "trtllm", "mode": "agg", "system": "b200_sxm",
                    "concurrency": users, "measured": {"ttft_ms": 200.0 + over, "tpot_ms": 10.0},
                    "predicted": {"ttft_ms": 200.0, "tpot_ms": 10.0},
                    **({"launch": {"postprocess_workers": 2}} if workers else {})})
    (tmp_path / "report.json").write_text(json.dumps({"rows": out}))
    fits = {r["launch"]: (r["base_ms"], r["per_user_ms"]) for r in peer.frontend_fit(str(tmp_path / "report.json"))
            if r["system"] == "all"}
    assert fits == {"postprocess_workers": (30, 0), "server": (120, 1)}


SGLANG = Path(__file__).parent / "silicon_sample_launches_sglang_5rows.csv"
"""Five real SGLang agg rows: DeepSeek-R1 FP4 TP4 at 4 users and FP8 TP8 at 64 (InferenceX, B200), Qwen3.5-397B-A17B
FP4 at 4 users (InferenceX's database), Qwen3.5 BF16 at 32 from the gap-analysis file that copies InferenceX's rows,
and Qwen3-32B on H100 (NVIDIA's gap-analysis runs, not InferenceX's launch)."""


def test_sglangs_launches_take_new_requests_every_10_or_30_passes_and_spread_their_later_waves():
    from sim.published.launches import later_waves, sglang_recv_interval
    from sim.published.predict import simulate_case
    rows = read_published(SGLANG)
    assert [inferencex(r) for r in rows] == [True, True, True, True, False]
    # 10 below 16 users, 30 from 16; Qwen3.5 FP4 on B200 30 always; a launch not known: none
    assert [sglang_recv_interval(r) for r in rows] == [10, 30, 30, 30, 0]
    assert [later_waves(r, "cohort") for r in rows] == ["spread"] * 4 + ["cohort"]
    assert build_case(rows[1]).scenario["scheduler"]["recv_interval"] == 30
    assert "recv_interval" not in build_case(rows[4]).scenario["scheduler"]
    assert _record(rows[0], {"skipped": "x"})["launch"] == {"recv_interval": 10, "later_waves": "spread"}
    # the later waves: the cohort repeats the first wave's TTFT, spread ones take the steady state's
    case = build_case(rows[4], per_user=3)
    out = simulate_case(None, case)
    first, steady = out["components"]["first_wave"]["ttft_ms"], out["components"]["steady"]["ttft_ms"]
    assert out["ttft_ms"] == pytest.approx(first + case.frontend_s * 1e3)   # cohort: every wave as the first
    assert first != pytest.approx(steady)
