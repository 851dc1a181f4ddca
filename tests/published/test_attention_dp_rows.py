"""An attention data-parallel row of the silicon sample (MiniMax-M2.5 FP8 on 4 x B200 as 2 ranks of TP2, experts
over all 4 GPUs): its concurrency, layout and engine limits, and that it runs."""

from __future__ import annotations

from pathlib import Path

from sim.published.predict import build_case, simulate_case
from sim.published.rows import read_published

FIXTURE = Path(__file__).parent / "silicon_sample_attention_dp_1row.csv"


def test_batch_size_is_per_rank_and_the_replica_has_both_ranks():
    (row,) = read_published(FIXTURE)
    assert (row.tp, row.attention_dp, row.moe_tp, row.moe_ep) == (2, 2, 1, 4)
    assert row.concurrency == 32  # batch_size 16 per rank, silicon_concurrency=32 in its source text
    case = build_case(row, engine_config="defaults")  # vLLM's launch limits (its default here: the benchmark rules)
    sc = case.scenario
    assert sc["parallel"] == {"tp": 2, "pp": 1, "ep": 4, "attention_dp": 2}
    assert sc["workload"]["users"] == 32
    # vLLM's limits hold per rank: the replica's are twice them, and ranks pad their CUDA graphs together
    assert sc["scheduler"]["max_num_seqs"] == 2 * 1024 and sc["scheduler"]["max_num_batched_tokens"] == 2 * 8192
    assert sc["step_time"]["graph_sizes"][:3] == [2, 4, 8]
    assert sc["step_time"]["model"]["moe_kernels"] == "vllm" and sc["step_time"]["allow_extrapolation"] is True
    # MoE kernels: the engine's default (vLLM: its own, power-law routing), or the row's own engine's on request
    assert sc["step_time"]["model"]["moe_routing"] == "power_law_1.2"
    own = build_case(row, moe_kernels="own", moe_routing="balanced").scenario["step_time"]["model"]
    assert (own["moe_kernels"], own["moe_routing"]) == ("vllm", "balanced")
    out = simulate_case(None, case)
    assert out["ttft_ms"] > 0 and 0.3 < out["tpot_ms"] / row.tpot_ms < 3.0


def test_a_stated_concurrency_that_does_not_divide_the_ranks_rounds_each_ranks_batch_up(tmp_path):
    """Three users over two ranks: each rank admits two (AIConfigurator's benchmark limits per rank), so all three
    run at once, as the client sends them."""
    import csv
    with FIXTURE.open(newline="") as fh:
        (row,) = list(csv.DictReader(fh))
    row["silicon_data_source"] = row["silicon_data_source"].replace("silicon_concurrency=32", "silicon_concurrency=3")
    path = tmp_path / "dp.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, list(row), lineterminator="\n")
        w.writeheader()
        w.writerow(row)
    (parsed,) = read_published(path)
    assert parsed.concurrency == 3 and parsed.attention_dp == 2
    sc = build_case(parsed, engine_config="aic_benchmark").scenario
    assert sc["workload"]["users"] == 3 and sc["scheduler"]["max_num_seqs"] == 2 * 2


def test_tensorrt_llms_attention_dp_agg_rows_hold_prompts_for_balance_and_its_pools_do_not():
    """TensorRT-LLM's agg rows with attention DP take InferenceX's attention_dp_config (enable_balance, timeout_iters
    60: EngineDefaults.attention_dp_balance_iters); vLLM's rows, rows without attention DP, and disaggregated pools
    (whose recipes were not read for it) do not."""
    import dataclasses
    from sim.published.disagg import PoolShape
    from sim.published.engines import ENGINES
    (row,) = read_published(FIXTURE)
    assert ENGINES["trtllm"].attention_dp_balance_iters == 60
    trt = dataclasses.replace(row, backend="trtllm", backend_version="1.2.0")
    assert build_case(trt).scenario["scheduler"]["attention_dp_balance_iters"] == 60
    assert "attention_dp_balance_iters" not in build_case(row).scenario["scheduler"]
    no_dp = dataclasses.replace(trt, tp=4, attention_dp=1, moe_tp=1, moe_ep=4)
    assert "attention_dp_balance_iters" not in build_case(no_dp).scenario["scheduler"]
    wide = PoolShape(1, 2, 1, 2, 1, 4)
    dis = dataclasses.replace(trt, mode="disagg", concurrency=8, prefill=wide, decode=wide)
    d = build_case(dis, per_user=2).scenario
    assert "attention_dp_balance_iters" not in d["scheduler"]
    assert all("attention_dp_balance_iters" not in d["disaggregation"][p]["scheduler"] for p in ("prefill", "decode"))
