"""Multi-GPU replicas (issue 15): memory per GPU against hand computation for the shipped examples,
layouts refused with the field and allowed values, distinct experts, pipeline bubble, GPU counting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.io.config import load_scenario
from sim.io.errors import ConfigError
from sim.io.profiles import load_hardware, load_model
from sim.models.parallel import (Layout, distinct_experts, kv_bytes_per_token_per_gpu, layout_problems,
                                 smallest_fitting_layout, stage_weights, weights_per_gpu)
from sim.models.spec import ModelSpec

REPO = Path(__file__).resolve().parents[2]
GIB = 1 << 30

# ---- hand computations (parameters from profiles/models, written out) ------------------------

def _llama70_by_hand(tp: int) -> dict:
    """Llama-3.1-70B in BF16 over tp GPUs: h 8192, 80 layers, 64 heads and 8 KV heads (64 / tp and 8 / tp per GPU),
    head 128, FFN 28672 (28672 / tp per GPU), vocab 128256 (128256 / tp rows per GPU), 2 B a value."""
    heads, kv, ffn, rows = 64 // tp, 8 // tp, 28672 // tp, 128256 // tp
    return {
        "attention": 80 * (8192 * heads * 128 + 2 * 8192 * kv * 128 + heads * 128 * 8192) * 2,
        "ffn": 80 * (3 * 8192 * ffn) * 2,
        "embedding": rows * 8192 * 2, "lm_head": rows * 8192 * 2,
        "norms": (80 * (8192 + 8192) + 8192) * 2,
        "kv_per_token": 80 * kv * 2 * 128 * 2,
    }


LLAMA70_TP4 = _llama70_by_hand(4)   # 16 heads, 2 KV heads, FFN 7168, 32064 vocab rows per GPU
LLAMA70_TP8 = _llama70_by_hand(8)   # 8 heads, 1 KV head, FFN 3584, 16032 vocab rows per GPU
# Mixtral-8x7B, TP2, BF16: h 4096, 32 layers, 32 heads (16), 8 KV heads (4), router 4096 x 8 replicated,
# 8 experts of 3 x 4096 x 14336 each split two ways, vocab 32000 (16000 rows)
MIXTRAL_TP2 = {
    "attention": 32 * (4096 * 16 * 128 + 2 * 4096 * 4 * 128 + 16 * 128 * 4096) * 2,
    "ffn": 32 * (4096 * 8 + 8 * 3 * 4096 * 14336 // 2) * 2,
    "embedding": 16000 * 4096 * 2, "lm_head": 16000 * 4096 * 2,
    "norms": (32 * (4096 + 4096) + 4096) * 2,
    "kv_per_token": 32 * 2 * 4 * 128 * 2,
}
# Qwen3-235B-A22B, TP8 EP8, BF16: h 4096, 94 layers, 64 heads (8), 4 KV heads (1 per GPU: each kept
# twice), QK norms (2 x 128), router 4096 x 128, 16 whole experts of 3 x 4096 x 1536 per GPU,
# vocab 151936 (18992 rows)
QWEN235_EP8 = {
    "attention": 94 * (4096 * 8 * 128 + 2 * 4096 * 1 * 128 + 8 * 128 * 4096) * 2,
    "ffn": 94 * (4096 * 128 + 16 * 3 * 4096 * 1536) * 2,
    "embedding": 18992 * 4096 * 2, "lm_head": 18992 * 4096 * 2,
    "norms": (94 * (4096 + 2 * 128 + 4096) + 4096) * 2,
    "kv_per_token": 94 * 2 * 1 * 128 * 2,
}
# DeepSeek-V3, TP8 EP8, FP8 layer matrices (1 B), BF16 embeddings and norms: h 7168, 61 layers (3 dense),
# 128 heads (16 per GPU); MLA q_a 7168 x 1536 and kv_a 7168 x 576 replicated, q_b 1536 x 16 x 192,
# kv_b 512 x 16 x 256, O 16 x 128 x 7168; dense FFN 3 x 7168 x 18432 / 8; MoE: router 7168 x 256,
# 32 whole experts of 3 x 7168 x 2048, the shared expert split 8 ways; vocab 129280 (16160 rows);
# KV: the 512 + 64 latent of every layer on every GPU
DSV3_EP8 = {
    "attention": 61 * (7168 * 1536 + 1536 * 16 * 192 + 7168 * 576 + 512 * 16 * 256 + 16 * 128 * 7168),
    "ffn": 3 * (3 * 7168 * 18432 // 8) + 58 * (7168 * 256 + 32 * 3 * 7168 * 2048 + 3 * 7168 * 2048 // 8),
    "embedding": 16160 * 7168 * 2, "lm_head": 16160 * 7168 * 2,
    "norms": (61 * (7168 + 512 + 1536 + 7168) + 7168) * 2,
    "kv_per_token": 61 * (512 + 64) * 2,
}
CASES = [
    ("llama-3.1-70b-tp4-h100", "llama-3.1-70b", Layout(tp=4), "bf16", LLAMA70_TP4),
    ("mixtral-8x7b-tp2-h100", "mixtral-8x7b", Layout(tp=2), "bf16", MIXTRAL_TP2),
    ("qwen3-235b-a22b-ep8-h200", "qwen3-235b-a22b", Layout(tp=8, ep=8), "bf16", QWEN235_EP8),
    ("deepseek-v3-fp8-8xh200", "deepseek-v3", Layout(tp=8, ep=8), "fp8", DSV3_EP8),
]


@pytest.mark.parametrize("scenario, model, layout, fmt, hand", CASES, ids=[c[0] for c in CASES])
def test_memory_per_gpu_is_exact(scenario, model, layout, fmt, hand):
    spec = ModelSpec(load_model(model))
    w = weights_per_gpu(spec, layout, fmt)
    for part in ("attention", "ffn", "embedding", "lm_head", "norms"):
        assert getattr(w, part) == hand[part], part
    total = sum(hand[p] for p in ("attention", "ffn", "embedding", "lm_head", "norms"))
    assert w.total == total
    assert kv_bytes_per_token_per_gpu(spec, layout, "bf16") == hand["kv_per_token"]
    # the shipped scenario sizes its replica with the same numbers: 0.9 x card - weights - 2 GiB per GPU
    from sim.core.simulation import Simulation
    sc, base = load_scenario(REPO / "scenarios" / "parallel" / f"{scenario}.yaml")
    mem = Simulation(sc, base).memory
    hw = load_hardware(sc.hardware)
    assert mem.gpus == layout.gpus
    assert mem.weight_bytes_per_gpu == total
    assert mem.kv_budget_bytes_per_gpu == int(0.9 * hw.memory_bytes) - total - 2 * GIB
    assert mem.kv_bytes_per_token_per_gpu == hand["kv_per_token"]
    assert mem.num_blocks == mem.kv_budget_bytes_per_gpu // (16 * hand["kv_per_token"])


def test_disaggregated_pools_memory_per_gpu_is_exact(tmp_path):
    """The shipped disaggregated deployment (docs/disaggregation.md's table): each pool's replica sized by hand."""
    from capsim.cli import main
    out = tmp_path / "d"
    assert main(["run", str(REPO / "scenarios" / "disagg-llama-3.1-70b-h100.yaml"), "--out", str(out),
                 "--set", "workload.num_requests=4"]) == 0
    pools = json.loads((out / "summary.json").read_text())["disaggregation"]
    card = int(0.9 * load_hardware("h100-sxm").memory_bytes)
    for pool, hand, gpus in (("prefill", LLAMA70_TP4, 4), ("decode", LLAMA70_TP8, 8)):
        par = pools[pool]["parallel"]
        total = sum(hand[p] for p in ("attention", "ffn", "embedding", "lm_head", "norms"))
        assert par["gpus_per_replica"] == gpus and par["weights_bytes_per_gpu"] == total
        assert par["kv_bytes_per_token_per_gpu"] == hand["kv_per_token"]
        assert par["activation_bytes_per_gpu"] == 2 * GIB
        assert par["kv_budget_bytes_per_gpu"] == card - total - 2 * GIB
        assert pools[pool]["kv_capacity_blocks"] == par["kv_budget_bytes_per_gpu"] // (16 * hand["kv_per_token"])
    assert (pools["prefill"]["kv_capacity_blocks"], pools["decode"]["kv_capacity_blocks"]) == (26_377, 79_668)


@pytest.mark.parametrize("model", ["llama-3.1-8b", "qwen3-8b", "mixtral-8x7b", "deepseek-v3", "qwen3-235b-a22b",
                                   "minimax-m2.5", "kimi-k2.5", "llama-3.1-405b"])
@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_one_gpu_layout_is_the_whole_model(model, fmt):
    spec = ModelSpec(load_model(model))
    assert weights_per_gpu(spec, Layout(), fmt).total == spec.weight_bytes(fmt)
    assert stage_weights(spec, Layout(), fmt)[0].total == spec.weight_bytes(fmt)
    assert kv_bytes_per_token_per_gpu(spec, Layout(), "bf16") == spec.kv_bytes_per_token("bf16")


def test_minimax_m2_5_counts_by_hand():
    """MiniMax-M2.5 (every layer MoE, 256 experts top-8 of width 1536, GQA 48 / 8 heads of 128): its model
    card's 230B total / 10B active, here exactly from its config."""
    spec = ModelSpec(load_model("minimax-m2.5"))
    h, layers, vocab = 3072, 62, 200064
    attn = h * 48 * 128 + 2 * h * 8 * 128 + 48 * 128 * h
    expert, router = 3 * h * 1536, h * 256
    norms = layers * (h + 2 * 128 + h) + h  # input norm, q/k norms (per head), post-attention norm; final norm
    assert spec.total_params == layers * (attn + router + 256 * expert) + norms + 2 * vocab * h
    assert spec.active_params == layers * (attn + router + 8 * expert) + norms + 2 * vocab * h
    assert round(spec.total_params / 1e9, 1) == 228.7 and round(spec.active_params / 1e9, 1) == 11.0
    # TP4 with EP4: experts split four ways, attention over 4 GPUs, KV heads 8 / 4 per GPU
    w = weights_per_gpu(spec, Layout(tp=4, ep=4), "fp8")
    assert w.ffn == layers * (256 * expert // 4 + router)  # fp8 experts (1 B each) split, the router replicated
    assert kv_bytes_per_token_per_gpu(spec, Layout(tp=4, ep=4), "bf16") == layers * 2 * 2 * 128 * 2


def test_kimi_k2_5_counts_by_hand():
    """Kimi-K2.5 (DeepSeek-V3's architecture with 64 MLA heads, 384 experts top-8 of width 2048, one shared
    expert, one dense layer first): its model card's 1T total / 32B active, here exactly from its config."""
    spec = ModelSpec(load_model("kimi-k2.5"))
    h, layers, heads, vocab = 7168, 61, 64, 163840
    attn = h * 1536 + 1536 * heads * 192 + h * 576 + 512 * heads * 256 + heads * 128 * h
    norms = layers * (h + 512 + 1536 + h) + h   # input, kv latent, q latent, post-attention norms; final norm
    dense, expert, router = 3 * h * 18432, 3 * h * 2048, h * 384
    moe_total, moe_active = router + 385 * expert, router + 9 * expert   # 384 routed + 1 shared; 8 + 1 active
    assert spec.total_params == layers * attn + dense + 60 * moe_total + norms + 2 * vocab * h
    assert spec.active_params == layers * attn + dense + 60 * moe_active + norms + 2 * vocab * h
    assert round(spec.total_params / 1e12, 2) == 1.03 and round(spec.active_params / 1e9) == 33
    # MLA caches the latent: 512 + 64 values a layer a token, the same on every GPU of a TP group
    assert kv_bytes_per_token_per_gpu(spec, Layout(tp=4), "bf16") == layers * 576 * 2


def test_pipeline_stages_split_layers_and_edges():
    spec = ModelSpec(load_model("llama-3.1-70b"))
    stages = stage_weights(spec, Layout(tp=1, pp=3), "bf16")
    assert [s.embedding > 0 for s in stages] == [True, False, False]
    assert [s.lm_head > 0 for s in stages] == [False, False, True]
    # 80 layers over 3 stages: 27, 27, 26; the KV per token per GPU is the fullest stage's
    assert kv_bytes_per_token_per_gpu(spec, Layout(pp=3), "bf16") == 27 * 2 * 8 * 128 * 2


@pytest.mark.parametrize("model, layout, field, allowed", [
    ("llama-3.1-70b", Layout(tp=3), "parallel.tp", "allowed: [1, 2, 4, 8, 16, 32, 64]"),
    ("llama-3.1-70b", Layout(tp=2, ep=2), "parallel.ep", "dense model without experts (allowed: 1)"),
    ("llama-3.1-70b", Layout(pp=81), "parallel.pp", "allowed: 1..80"),
    ("mixtral-8x7b", Layout(tp=16, ep=16), "parallel.ep", "16 does not divide mixtral-8x7b's 8 experts"),
])
def test_layouts_the_model_cannot_take(model, layout, field, allowed):
    problems = layout_problems(ModelSpec(load_model(model)), layout)
    assert problems and problems[0].startswith(field + ":") and allowed in problems[0]


def test_a_wrong_tp_is_not_blamed_on_ep():
    """tp 3 on Mixtral: the heads say why; ep, left at 1, had been blamed too (its expert width over 3 GPUs), with an ep
    of 3 offered that does not divide the 8 experts."""
    spec = ModelSpec(load_model("mixtral-8x7b"))
    assert layout_problems(spec, Layout(tp=3)) == [
        "parallel.tp: 3 does not divide mixtral-8x7b's 32 attention heads (allowed: [1, 2, 4, 8, 16, 32])"]


def _scenario(tmp_path, parallel: str, model="llama-3.1-8b", step="{kind: ops}", extra="", hardware="h100-sxm",
              name="s") -> Path:
    p = tmp_path / f"{name}.yaml"
    p.write_text(f"""name: p
model: {model}
hardware: {hardware}
{parallel}
kv: {{budget: {{gpu_memory_utilization: 0.9}}}}
scheduler: {{kind: chunked, max_num_seqs: 64, max_num_batched_tokens: 4096, chunk_tokens: 4096}}
step_time: {{model: {step}}}
workload:
  kind: synthetic
  num_requests: 40
  arrival: {{kind: poisson, rate_rps: 5}}
  prompt_tokens: {{kind: fixed, value: 512}}
  output_tokens: {{kind: fixed, value: 64}}
{extra}""")
    return p


def _run(path: Path):
    from sim.core.simulation import Simulation
    sc, base = load_scenario(path)
    return Simulation(sc, base)


def test_scenario_refuses_a_layout_naming_field_and_allowed(tmp_path):
    with pytest.raises(ConfigError, match=r"parallel\.tp: 3 does not divide .* \(allowed: \[1, 2, 4, 8, 16, 32\]\)"):
        _run(_scenario(tmp_path, "parallel: {tp: 3}"))
    with pytest.raises(ConfigError, match=r"parallel\.ep: ep \(3\) must divide tp \(4\).*allowed ep for tp 4: "
                                          r"\[1, 2, 4\]"):
        load_scenario(_scenario(tmp_path, "parallel: {tp: 4, ep: 3}"))
    with pytest.raises(ConfigError, match=r"parallel\.ep: ep \(3\) must divide attention_dp x tp \(8\)"):
        load_scenario(_scenario(tmp_path, "parallel: {tp: 4, ep: 3, attention_dp: 2}"))
    with pytest.raises(ConfigError, match=r"parallel\.ep_communication: ep_communication all_to_all moves tokens "
                                          r"between expert-parallel GPUs, and ep 1 has none"):
        load_scenario(_scenario(tmp_path, "parallel: {tp: 4, ep_communication: all_to_all}"))
    with pytest.raises(ConfigError, match=r"parallel\.micro_batches: micro_batches \(2\) needs pp > 1"):
        load_scenario(_scenario(tmp_path, "parallel: {tp: 2, micro_batches: 2}"))
    with pytest.raises(ConfigError, match=r"step_time\.model\.tp: 4 differs from parallel\.tp \(2\)"):
        _run(_scenario(tmp_path, "parallel: {tp: 2}", step="{kind: ops, tp: 4}"))


def test_every_gpu_counts_and_one_gpu_summaries_are_unchanged(tmp_path):
    lin = "{kind: linear, constant_s: 0.01, per_new_token_s: 0.0001, per_pair_s: 0.0}"
    one = _run(_scenario(tmp_path, "", step=lin)).run().summary
    four = _run(_scenario(tmp_path, "parallel: {tp: 4}", step=lin)).run().summary
    assert "parallel" not in one
    assert four["parallel"]["gpus"] == 4 and four["parallel"]["gpus_per_replica"] == 4
    assert four["makespan_s"] == one["makespan_s"]  # same step times: only the GPU count differs
    assert four["gpu_seconds"] == pytest.approx(4 * one["gpu_seconds"])
    assert four["energy_j"] == pytest.approx(4 * one["energy_j"])


def test_distinct_experts():
    assert distinct_experts(8, 2, 1) == pytest.approx(2.0)
    assert distinct_experts(128, 8, 64) == pytest.approx(128 * (1 - (1 - 8 / 128) ** 64))
    assert distinct_experts(128, 8, 10_000) == pytest.approx(128.0)
    assert distinct_experts(128, 8, 16, skew=1.0) < distinct_experts(128, 8, 16)
    assert distinct_experts(128, 8, 0) == 0.0


def _ops(tmp_path, parallel: str, model="llama-3.1-70b", step="{kind: ops}"):
    return _run(_scenario(tmp_path, parallel, model=model, step=step)).step_time


def test_pipeline_bubble_shows_in_iteration_time(tmp_path):
    from sim.models.ops_compose import decode_plan, prefill_plan
    one = _ops(tmp_path, "parallel: {tp: 2}")
    pp1 = _ops(tmp_path, "parallel: {tp: 2, pp: 2}")
    pp4 = _ops(tmp_path, "parallel: {tp: 2, pp: 2, micro_batches: 4}")
    plan = decode_plan(64, 2048)
    # one micro-batch: the stages run one after the other (no gain, plus the hand-over)
    hop = pp1.net.at("send_recv", 2, 64 * 8192 * 2)
    stages = [pp1.stage_s(s, 64, pp1.busiest_rank(64, 0, 0, 64, 64 * 2048, 64)) for s in range(2)]
    assert pp1.step_s(plan) == pytest.approx(pp1.host_s + sum(stages) + hop)
    assert pp1.step_s(plan) > one.step_s(plan) * 0.95
    # four micro-batches: sum of the stages' micro-batch times plus three more of the slowest
    m = [pp4.stage_s(s, 16, pp4.busiest_rank(16, 0, 0, 16, 16 * 2048, 16)) for s in range(2)]
    hop4 = pp4.net.at("send_recv", 2, 16 * 8192 * 2)
    assert pp4.step_s(plan) == pytest.approx(pp4.host_s + sum(m) + 3 * max(m) + hop4)
    # a weight-bound decode pays for reading the weights once per micro-batch; a compute-bound prefill
    # gains from filling the pipeline
    assert pp4.step_s(plan) > pp1.step_s(plan)
    big = prefill_plan(2, 1024)
    assert pp4.step_s(big) < pp1.step_s(big)


def test_collectives_beyond_the_largest_message_take_its_bandwidth(tmp_path):
    """A 70B prefill pass of 8,192 tokens sends 134 MB between stages, twice the largest measured send: the
    largest message's time in proportion to the bytes (its bus bandwidth), where it had stopped the run."""
    from sim.models.ops_compose import prefill_plan
    pp = _ops(tmp_path, "parallel: {tp: 2, pp: 2}", model="llama-3.1-70b")
    for table, op in ((pp.net, "send_recv"), (pp.nccl, "all_reduce")):
        xs, ys = table.table.series[(op, 2)]
        assert table.at(op, 2, xs[-1]) == pytest.approx(ys[-1])
        assert table.at(op, 2, 3 * xs[-1]) == pytest.approx(3 * ys[-1])
        assert table.at(op, 2, 0.5 * xs[-1]) < ys[-1]
    assert 8192 * 8192 * 2 > pp.net.table.series[("send_recv", 2)][0][-1]
    assert pp.step_s(prefill_plan(2, 4096)) > pp.step_s(prefill_plan(2, 2048))


def test_moe_reads_only_touched_experts(tmp_path):
    """The composition from GEMMs (`moe_kernels: composed`; the measured fused-MoE table is
    tests/sim/test_moe_tables.py's)."""
    composed = "{kind: ops, moe_kernels: composed}"
    m = _ops(tmp_path, "parallel: {tp: 2}", model="mixtral-8x7b", step=composed)
    assert m.moe_kernel is None
    g = m.moe_gemms
    # one token touches 2 of 8 experts: a quarter of the grouped GEMM's bytes at M = 1
    expert_part = m._moe_ffn_s(1) - m._look(g["router"].at, 1) - m._all_reduce(2, 1) - m._small_s(1, 2 * 14336 / 2)
    assert expert_part == pytest.approx(0.25 * (g["experts_gate_up"].at(1) + g["experts_down"].at(1)))
    ep = _ops(tmp_path, "parallel: {tp: 8, ep: 8}", model="qwen3-235b-a22b", step=composed)
    skew = _ops(tmp_path, "parallel: {tp: 8, ep: 8, routing_skew: 1.2}", model="qwen3-235b-a22b", step=composed)
    assert skew.layer_linear_s(8, True) < ep.layer_linear_s(8, True)
    imb = _ops(tmp_path, "parallel: {tp: 8, ep: 8, expert_imbalance: 1.5}", model="qwen3-235b-a22b", step=composed)
    assert imb.layer_linear_s(512, True) > ep.layer_linear_s(512, True)
    # the combine: an all-reduce over tp (default), or all-to-all dispatch + combine of T k / ep vectors
    a2a = _ops(tmp_path, "parallel: {tp: 8, ep: 8, ep_communication: all_to_all}", model="qwen3-235b-a22b", step=composed)
    diff = a2a._moe_ffn_s(64) - ep._moe_ffn_s(64)
    assert diff == pytest.approx(2 * a2a.net.at("alltoall", 8, 64 * 8 * 4096 * 2 / 8) - ep._all_reduce(8, 64))


def test_memory_command_per_gpu_and_smallest_layout(capsys):
    from capsim.cli import main
    assert main(["memory", "--model", "llama-3.1-70b", "--hardware", "h100-sxm", "--tp", "4",
                 "--gpu-memory-utilization", "0.9", "--activation", "2GiB", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    total = sum(LLAMA70_TP4[p] for p in ("attention", "ffn", "embedding", "lm_head", "norms"))
    assert out["parallel"]["weights_per_gpu"]["total"] == total
    assert out["parallel"]["kv_budget_bytes_per_gpu"] == int(0.9 * 80e9) - total - 2 * GIB
    assert out["parallel"]["kv_budget_bytes_per_replica"] == 4 * out["parallel"]["kv_budget_bytes_per_gpu"]
    assert out["parallel"]["fits_per_gpu"] is True
    # without --activation nothing is reserved, and the text says so rather than showing a computed-looking 0
    assert main(["memory", "--model", "llama-3.1-70b", "--hardware", "h100-sxm", "--tp", "4"]) == 0
    assert "activations per GPU          0 B (none reserved: --activation sets" in capsys.readouterr().out
    assert main(["memory", "--model", "deepseek-v3", "--hardware", "h200-sxm"]) == 2
    err = capsys.readouterr().err
    assert "deepseek-v3 (bf16) does not fit one h200-sxm" in err and "the smallest layout that fits is" in err
    assert main(["memory", "--model", "qwen3-235b-a22b", "--tp", "6"]) == 2
    assert "--tp: 6 does not divide" in capsys.readouterr().err
    # attention data parallelism: 64 requests over 8 ranks, a GPU holds its rank's 8
    args = ["memory", "--model", "deepseek-v3", "--hardware", "b200", "--weight-format", "fp8", "--tp", "1",
            "--prompt", "1024", "--output", "256", "--requests", "64", "--json"]
    assert main(args + ["--ep", "8", "--attention-dp", "8"]) == 0
    par = json.loads(capsys.readouterr().out)["parallel"]
    assert par["attention_dp"] == 8 and par["gpus"] == 8
    assert par["kv_bytes_per_gpu"] == 8 * 80 * 16 * par["kv_bytes_per_token_per_gpu"]  # 1280 tokens = 80 blocks each
    assert main(args + ["--ep", "3", "--attention-dp", "8"]) == 2
    assert "--ep: 3 must divide --attention-dp x --tp (8); allowed: [1, 2, 4, 8]" in capsys.readouterr().err
    # NVFP4 (4.5 bits a weight): Kimi-K2.5's 1.03T parameters fit 4 B200s, whose 180 GB each FP8 would overflow
    nvfp4 = ["memory", "--model", "kimi-k2.5", "--hardware", "b200", "--tp", "4", "--ep", "4", "--json"]
    assert main(nvfp4 + ["--weight-format", "nvfp4"]) == 0
    out = json.loads(capsys.readouterr().out)
    spec = ModelSpec(load_model("kimi-k2.5"))
    assert out["parallel"]["fits_per_gpu"] is True
    assert out["parallel"]["weights_per_gpu"]["total"] == weights_per_gpu(spec, Layout(tp=4, ep=4), "nvfp4").total
    assert main(nvfp4 + ["--weight-format", "fp8"]) == 2
    assert "kimi-k2.5 (fp8) does not fit tp4 ep4 (4 x b200)" in capsys.readouterr().err
    # NVIDIA's experts-only NVFP4 checkpoint: the routed experts NVFP4, the rest BF16 (more bytes than all-NVFP4)
    assert main(nvfp4 + ["--weight-format", "bf16", "--expert-weight-format", "nvfp4"]) == 0
    out = json.loads(capsys.readouterr().out)
    mixed = ModelSpec(load_model("kimi-k2.5"), expert_format="nvfp4")
    assert out["expert_weight_format"] == "nvfp4" and out["weight_bytes"] == mixed.weight_bytes("bf16")
    assert out["parallel"]["weights_per_gpu"]["total"] == weights_per_gpu(mixed, Layout(tp=4, ep=4), "bf16").total
    assert mixed.weight_bytes("bf16") > spec.weight_bytes("nvfp4")
    assert main(["memory", "--model", "llama-3.1-8b", "--expert-weight-format", "nvfp4"]) == 2
    assert "--expert-weight-format: llama-3.1-8b has no routed experts" in capsys.readouterr().err
    # NVIDIA's DeepSeek NVFP4 checkpoints: attention in BF16, the rest NVFP4
    ds = ["memory", "--model", "deepseek-v3", "--hardware", "b200", "--tp", "4", "--ep", "4", "--json",
          "--weight-format", "nvfp4"]
    assert main(ds + ["--attention-weight-format", "bf16"]) == 0
    out = json.loads(capsys.readouterr().out)
    kept = ModelSpec(load_model("deepseek-v3"), attention_format="bf16")
    assert out["attention_weight_format"] == "bf16" and out["weight_bytes"] == kept.weight_bytes("nvfp4")
    assert out["parallel"]["weights_per_gpu"]["total"] == weights_per_gpu(kept, Layout(tp=4, ep=4), "nvfp4").total


def test_smallest_layout_fits_and_nothing_smaller_does():
    spec = ModelSpec(load_model("deepseek-v3"))
    hw = load_hardware("h200-sxm")
    best = smallest_fitting_layout(spec, hw.memory_bytes, "fp8")
    assert weights_per_gpu(spec, best, "fp8").total <= 0.8 * hw.memory_bytes
    for tp in (1, 2, 4, 8):
        for pp in range(1, best.gpus // tp):
            if tp * pp < best.gpus:
                assert weights_per_gpu(spec, Layout(tp, pp, tp), "fp8").total > 0.8 * hw.memory_bytes


def test_tp1_layout_gives_exactly_the_one_gpu_outputs():
    from sim.core.simulation import Simulation
    from sim.io.parallel_schema import ParallelConfig
    folder = REPO / "scenarios" / "chapter8"
    base, _ = load_scenario(folder / "four-requests-chunked.yaml")
    assert base.parallel is None
    tp1 = base.model_copy(update={"parallel": ParallelConfig(tp=1, pp=1, ep=1)})
    a, b = Simulation(tp1, folder).run(), Simulation(base, folder).run()
    assert a.summary["setup"].pop("scenario_sha256") != b.summary["setup"].pop("scenario_sha256")  # two scenarios
    assert a.digest() == b.digest()  # the same outputs otherwise


def test_mla_attention_is_scaled_from_measured_kernels(tmp_path):
    from sim.models.parallel_ops import MLA_CONTEXT_SCALE, MLA_GENERATION_SCALE
    sc = tmp_path / "ds.yaml"
    sc.write_text(_scenario(tmp_path, "parallel: {tp: 8, ep: 8}", model="deepseek-v3",
                            step="{kind: ops, dtype: bf16}").read_text().replace("hardware: h100-sxm", "hardware: h200-sxm")
                  + "weight_format: fp8\n")
    m = _run(sc).step_time
    assert m.heads == 16 and m.kv_heads == 1
    # decode attention: MQA of the GPU's 16 heads (one KV head, dim 128) over 2.25 x the cached tokens (the
    # 576-value latent's bytes): the bytes read scale, the kernel's per-launch time does not
    assert m.generation_attention_s(32, 32 * 4096) == pytest.approx(m.generation.at(32, MLA_GENERATION_SCALE * 4096))
    assert m.generation_attention_s(1, 16) == pytest.approx(m.generation.at(1, 36))
    assert m.generation_attention_s(1, 16) < 1.1 * m.generation.at(1, 16) < MLA_GENERATION_SCALE * m.generation.at(1, 16)
    assert m.context_attention_s(2, 2 * 1024 * 1025 // 2) == pytest.approx(MLA_CONTEXT_SCALE * m.context.at(2, 1024))
    # three dense layers, 58 MoE layers, one stage
    assert m.stage_kinds == [(3, 58)]


def test_moe_iteration_reads_the_touched_experts():
    spec = ModelSpec(load_model("qwen3-235b-a22b"))
    expert = 3 * 4096 * 1536 * 2
    one = spec.weight_read_bytes() - 94 * (128 - 8) * expert  # one token: its 8 experts in each of 94 layers
    assert spec.weight_read_bytes_at(1) == one
    assert spec.weight_read_bytes_at(100_000) == spec.weight_read_bytes()
    dense = ModelSpec(load_model("qwen3-8b"))
    assert dense.weight_read_bytes_at(1) == dense.weight_read_bytes()
    from sim.models.roofline import decode_reads
    assert decode_reads(spec, 1, 1024).weight_bytes_per_output_token == one


def test_attention_data_parallel_memory_by_hand():
    """Qwen3-235B-A22B on 8 GPUs as 8 attention data-parallel ranks of one GPU (tp 1) with the 128 experts
    spread 16 per GPU (ep 8): each GPU holds the whole attention, router, embedding and lm_head, and its
    16 experts; a request's KV lives on one rank, all 4 KV heads of it."""
    spec = ModelSpec(load_model("qwen3-235b-a22b"))
    layout = Layout(tp=1, ep=8, attention_dp=8)
    assert (layout.gpus, layout.rank_gpus, layout.expert_gpus, layout.moe_tp) == (8, 1, 8, 1)
    h, L, V = 4096, 94, 151936
    w = weights_per_gpu(spec, layout, "bf16")
    assert w.attention == L * (h * 64 * 128 + 2 * h * 4 * 128 + 64 * 128 * h) * 2
    assert w.ffn == L * (16 * 3 * h * 1536 + h * 128) * 2
    assert w.embedding == w.lm_head == V * h * 2
    assert w.norms == (L * (h + 2 * 128 + h) + h) * 2
    assert kv_bytes_per_token_per_gpu(spec, layout, "bf16") == L * 4 * 128 * 2 * 2
    assert layout.describe() == "dp8 tp1 ep8"
    # attention_dp on a dense model is refused, naming the field
    assert any("parallel.attention_dp: 2 on llama-3.1-70b" in p
               for p in layout_problems(ModelSpec(load_model("llama-3.1-70b")), Layout(tp=2, attention_dp=2)))


def test_attention_data_parallel_replica_holds_dp_times_the_blocks(tmp_path):
    """Same GPUs per rank, twice the ranks: twice the KV blocks; the summary says attention_dp."""
    one = _run(_scenario(tmp_path, "parallel: {tp: 4, ep: 4}", model="qwen3-235b-a22b",
                         extra="weight_format: fp8\n"))
    two_dir = tmp_path / "two"
    two_dir.mkdir()
    two = _run(_scenario(two_dir, "parallel: {tp: 4, ep: 8, attention_dp: 2}", model="qwen3-235b-a22b",
                         extra="weight_format: fp8\n"))
    m1, m2 = one.memory, two.memory
    assert m2.gpus == 8 and m2.kv_bytes_per_token_per_gpu == m1.kv_bytes_per_token_per_gpu
    per_rank_blocks = m2.kv_budget_bytes_per_gpu * 4 // (16 * m2.kv_bytes_per_token_per_gpu * 4)
    assert m2.num_blocks == pytest.approx(2 * per_rank_blocks, abs=2)
    assert m2.per_gpu()["attention_dp"] == 2 and "attention_dp" not in m1.per_gpu()
    summary = two.run().summary
    assert summary["parallel"]["attention_dp"] == 2 and summary["parallel"]["gpus"] == 8
    assert summary["completed"] == 40
    with pytest.raises(ConfigError, match=r"ep \(3\) must divide attention_dp x tp \(4\)"):
        load_scenario(_scenario(tmp_path, "parallel: {tp: 2, ep: 3, attention_dp: 2}", model="qwen3-235b-a22b"))


def test_attention_data_parallel_step(tmp_path):
    """Attention, its GEMMs and lm_head run on each rank's share of the tokens; the routed experts see every
    rank's tokens, gathered to the expert GPUs and scattered back (two all-gathers of T x hidden x 2 B)."""
    m = _run(_scenario(tmp_path, "parallel: {tp: 1, ep: 8, attention_dp: 8}", model="qwen3-235b-a22b",
                       extra="weight_format: fp8\n")).step_time
    assert m.dp == 8 and m.moe_kernel is not None
    g = m.moe_gemms
    gather = m.nccl.at("all_gather", 8, 64 * 4096 * 2)
    assert m._moe_ffn_s(64) == pytest.approx(m._look(g["router"].at, 8) + m.moe_kernel.at(64) + 2 * gather
                                             + m._small_s(8, 0.0))
    att = sum(c.at(8) for c in m.att_gemms.values())
    assert m.layer_linear_s(64, True) == pytest.approx(att + m._moe_ffn_s(64))
    # a decode of 64 sequences: per rank 8 sequences' attention
    stage = m.stage_s(0, 64, m.busiest_rank(64, 0, 0, 64, 64 * 1024, 64))
    per_layer = m.layer_linear_s(64, True) + m.generation_attention_s(8, 8 * 1024)
    assert stage == pytest.approx(94 * per_layer + m.head_s(8))


def test_sglang_sum_len_gather_all_reduces_in_passes_with_a_prefill(tmp_path):
    """dp_prefill_gather all_reduce (SGLang's SUM_LEN padding, chosen for every batch with a prefill): a MoE layer's
    gather and combine are two all-reduces of T x hidden x 2 B over the expert GPUs in a pass with a prefill, and
    stay two all-gathers in a decode-only pass; the default (all_gather) is the same in both."""
    step = "{kind: ops, dp_prefill_gather: all_reduce}"
    m = _run(_scenario(tmp_path, "parallel: {tp: 1, ep: 8, attention_dp: 8}", model="qwen3-235b-a22b",
                       extra="weight_format: fp8\n", step=step)).step_time
    nbytes = 4096 * 4096 * 2
    reduce, gather = m.ar.at("all_reduce", 8, nbytes), m.nccl.at("all_gather", 8, nbytes)
    assert reduce > gather
    assert m._combine_s(4096) == pytest.approx(2 * reduce)
    assert m._combine_s(4096, decode_only=True) == pytest.approx(2 * gather)
    assert m.layer_linear_s(4096, True) - m.layer_linear_s(4096, True, True) == pytest.approx(2 * reduce - 2 * gather)
    base_dir = tmp_path / "default"
    base_dir.mkdir()
    base = _run(_scenario(base_dir, "parallel: {tp: 1, ep: 8, attention_dp: 8}", model="qwen3-235b-a22b",
                          extra="weight_format: fp8\n")).step_time
    assert base._combine_s(4096) == base._combine_s(4096, decode_only=True) == pytest.approx(2 * gather)
    # a whole prefill pass: 94 MoE layers, each two all-reduces where the default has two all-gathers
    pre = (4096, 8, 8 * 512 * 513 // 2, 0, 0, 8)
    assert m.pass_s(*pre) - base.pass_s(*pre) == pytest.approx(94 * 2 * (reduce - gather))
    dec = (64, 0, 0, 64, 64 * 1024, 64)
    assert m.pass_s(*dec) == pytest.approx(base.pass_s(*dec))


def test_attention_data_parallel_waits_for_its_busiest_rank(tmp_path):
    """A sequence runs on one rank: one 4,096-token prompt on dp8 is one rank's whole prompt (its attention and
    GEMMs on all 4,096 tokens, not an eighth of them), while the routed experts still see the pass's tokens;
    9 decodes over 8 ranks put 2 on the busiest one; 16 split evenly as before."""
    m = _run(_scenario(tmp_path, "parallel: {tp: 1, ep: 8, attention_dp: 8}", model="qwen3-235b-a22b",
                       extra="weight_format: fp8\n")).step_time
    one = m.busiest_rank(4096, 1, 4096 * 4097 // 2, 0, 0, 1)
    assert (one.tokens, one.pre_seqs, one.pre_pairs, one.logits) == (4096, 1, 4096 * 4097 // 2, 1)
    stage = m.stage_s(0, 4096, one)
    per_layer = m.layer_linear_s(4096, True, False, 4096) + m.context_attention_s(1, 4096 * 4097 // 2)
    assert stage == pytest.approx(94 * per_layer + m.head_s(1))
    assert m.pass_s(4096, 1, 4096 * 4097 // 2, 0, 0, 1) > m.pass_s(4096, 8, 8 * 512 * 513 // 2, 0, 0, 8)
    nine = m.busiest_rank(9, 0, 0, 9, 9 * 1000, 9)
    assert (nine.tokens, nine.dec_seqs, nine.dec_kv, nine.logits) == (2, 2, 2000, 2)
    even = m.busiest_rank(16, 0, 0, 16, 16 * 1000, 16)
    assert (even.tokens, even.dec_seqs, even.dec_kv) == (2, 2, 2000)
    # a mixed pass: 3 prompts of 1,000 tokens and 8 decodes over 8 ranks: one prompt and one decode
    mixed = m.busiest_rank(3008, 3, 3 * 500_500, 8, 8 * 2000, 11, dec_tokens=8)
    assert (mixed.tokens, mixed.pre_seqs, mixed.pre_pairs, mixed.dec_seqs) == (1001, 1, 500_500, 1)


def test_a_layer_wide_qk_norm_adds_one_small_all_reduce_per_layer(tmp_path):
    """MiniMax-M2's q / k norm spans all heads (qk_norm_span: layer): under TP4 every layer all-reduces each
    token's two FP32 sums of squares (vLLM's MiniMaxText01RMSNormTP), beside the two hidden-wide all-reduces."""
    m = _run(_scenario(tmp_path, "parallel: {tp: 4, ep: 4}", model="minimax-m2.5", extra="weight_format: fp8\n",
                       step="{kind: ops, all_reduce: vllm}")).step_time
    assert m.spec.profile.qk_norm_span == "layer"
    att = sum(c.at(16) for c in m.att_gemms.values())
    norm = m.ar.at("all_reduce", 4, 16 * 2 * 4)
    assert m.layer_linear_s(16, True) == pytest.approx(att + m.ar.at("all_reduce", 4, 16 * 3072 * 2) + norm
                                                      + m._moe_ffn_s(16))
    assert norm < m.nccl.at("all_reduce", 4, 16 * 2 * 4)  # vLLM's own kernel for the tiny message
    # a per-head norm (Qwen3's) needs none
    q = _run(_scenario(tmp_path, "parallel: {tp: 4, ep: 4}", model="qwen3-235b-a22b", extra="weight_format: fp8\n")
             ).step_time
    assert q.spec.profile.qk_norm and q._qk_norm_s(16) == 0.0


def test_mla_adds_its_two_latent_norms_to_each_layer_by_hand(tmp_path):
    """An MLA layer runs two RMSNorms a GQA layer has not: q_a_layernorm over the q latent (q_lora_rank values a
    token) and kv_a_layernorm over the kv latent (kv_lora_rank); each costs SMALL_OPS' rms_norm (its constant, and its
    per-value slope at the card's bandwidth scale) beside the layer's two hidden-wide norms, RoPE and SiLU."""
    from sim.models.ops import SMALL_OPS
    m = _run(_scenario(tmp_path, "parallel: {tp: 8, ep: 8}", model="deepseek-v3", hardware="b200",
                       extra="weight_format: fp8\n")).step_time
    p = m.spec.profile
    assert (p.mla.q_lora_rank, p.mla.kv_lora_rank) == (1536, 512)
    (n_norm, a_norm, b_norm, _), (_, a_rope, b_rope, _), (_, a_silu, b_silu, _) = (
        SMALL_OPS["rms_norm"], SMALL_OPS["rope"], SMALL_OPS["silu_and_mul"])
    for tokens, width in ((1, 2048), (64, 256), (4096, 256)):
        by_hand = (n_norm * a_norm + a_rope + a_silu + 2 * a_norm
                   + tokens * m._scale * (n_norm * b_norm * 7168 + b_rope * (16 + 1) * 64 + b_silu * width
                                          + b_norm * (1536 + 512)))
        assert m._small_s(tokens, width) == pytest.approx(by_hand, rel=1e-12)
    # a GQA MoE model (Mixtral: 32 heads, 8 KV heads, no q / k norm) runs none of them
    g = _run(_scenario(tmp_path, "parallel: {tp: 2, ep: 2}", model="mixtral-8x7b", name="g")).step_time
    assert g.spec.profile.mla is None and not g.spec.profile.qk_norm
    assert g._small_s(8, 7168) == pytest.approx(
        n_norm * a_norm + a_rope + a_silu
        + 8 * g._scale * (n_norm * b_norm * 4096 + b_rope * (32 // 2 + 8 // 2) * 128 + b_silu * 7168), rel=1e-12)


def test_experts_only_nvfp4_counts_by_hand(tmp_path):
    """An NVFP4 checkpoint that quantizes its routed experts only (ModelOpt's nvfp4_experts_only: MiniMax-M2.5,
    Kimi-K2.x): the experts at 4.5 bits, the rest at weight_format's width, by hand; a dense model refuses the field."""
    from fractions import Fraction
    from sim.models.spec import scenario_spec
    from types import SimpleNamespace
    prof = load_model("minimax-m2.5")
    mixed, bf16 = ModelSpec(prof, expert_format="nvfp4"), ModelSpec(prof)
    h, layers = 3072, 62
    routed = layers * 256 * 3 * h * 1536
    assert mixed.routed_expert_params == routed
    fp4 = Fraction(1, 2) + Fraction(1, 16)
    assert mixed.weight_bytes("bf16") == bf16.weight_bytes("bf16") - routed * 2 + int(routed * fp4)
    # TP4 EP4: each GPU holds a quarter of the experts in NVFP4, the replicated router in BF16
    w = weights_per_gpu(mixed, Layout(tp=4, ep=4), "bf16")
    assert w.ffn == int(layers * (256 * 3 * h * 1536 // 4) * fp4) + layers * h * 256 * 2
    assert w.attention == weights_per_gpu(bf16, Layout(tp=4, ep=4), "bf16").attention
    # an iteration that touches no expert reads the rest in BF16 and no expert bytes
    assert mixed.weight_read_bytes_at(0, "bf16") == bf16.weight_read_bytes_at(0, "bf16")
    assert mixed.weight_read_bytes("bf16") - mixed.weight_read_bytes_at(0, "bf16") == int(routed * fp4)
    with pytest.raises(ConfigError, match=r"expert_weight_format: llama-3.1-8b has no routed experts"):
        scenario_spec(SimpleNamespace(expert_weight_format="nvfp4"), load_model("llama-3.1-8b"))
    with pytest.raises(ConfigError, match="expert_weight_format"):
        _run(_scenario(tmp_path, "parallel: {tp: 1}", extra="expert_weight_format: nvfp4"))


def test_experts_only_nvfp4_takes_each_part_from_its_own_table(tmp_path):
    """The ops model of an experts-only checkpoint: attention, router and dense GEMMs as the BF16 model's, the routed
    experts' GEMMs and fused-MoE kernel as the all-NVFP4 model's."""
    def model(name, formats):
        return _run(_scenario(tmp_path, "parallel: {tp: 4, ep: 4}", model="minimax-m2.5", hardware="b200",
                              extra=formats, name=name)).step_time
    mixed = model("m", "weight_format: bf16\nexpert_weight_format: nvfp4")
    bf16, fp4 = model("b", "weight_format: bf16"), model("f", "weight_format: nvfp4")
    assert (mixed.dtype, mixed.expert_dtype, fp4.expert_dtype, bf16.expert_dtype) == ("bf16", "nvfp4", "nvfp4", "bf16")
    for m in (1, 64, 4096):
        for name in ("qkv", "o"):
            assert mixed.att_gemms[name].at(m) == bf16.att_gemms[name].at(m) != fp4.att_gemms[name].at(m)
        assert mixed.moe_gemms["router"].at(m) == bf16.moe_gemms["router"].at(m)
        for name in ("experts_gate_up", "experts_down"):
            assert mixed.moe_gemms[name].at(m) == fp4.moe_gemms[name].at(m)
    assert mixed.moe_kernel is not None and mixed.moe_kernel.at(64) == fp4.moe_kernel.at(64)


def test_attention_kept_in_bf16_counts_by_hand_and_takes_the_bf16_tables(tmp_path):
    """An NVFP4 checkpoint that keeps every layer's self_attn in BF16 (NVIDIA's DeepSeek-R1 NVFP4 ones):
    attention_weight_format bf16 counts the attention matrices at 2 bytes, the rest at NVFP4's 4.5 bits, by hand, per
    GPU as in all; under kind ops the attention GEMMs come from the BF16 table and the rest from the NVFP4 one; a
    dense model takes it too."""
    import math
    from fractions import Fraction
    from sim.models.parallel import _attention_per_gpu
    prof = load_model("deepseek-v3")
    mixed, fp4 = ModelSpec(prof, attention_format="bf16"), ModelSpec(prof)
    att = prof.num_layers * mixed.attention_matrix_params
    nv = Fraction(1, 2) + Fraction(1, 16)
    assert not prof.tie_word_embeddings
    by_hand = ((mixed.layer_matrix_params - att) * nv + att * 2
               + (mixed.vector_params + mixed.lm_head_params + mixed.embedding_params) * 2)
    assert mixed.weight_bytes("nvfp4") == math.ceil(by_hand) > fp4.weight_bytes("nvfp4")
    lay = Layout(tp=4)
    w, w4 = weights_per_gpu(mixed, lay, "nvfp4"), weights_per_gpu(fp4, lay, "nvfp4")
    att_mat = _attention_per_gpu(mixed, 4)[0]
    assert (w.attention, w4.attention) == (math.ceil(prof.num_layers * att_mat * 2),
                                           math.ceil(prof.num_layers * att_mat * nv))
    assert w.ffn == w4.ffn
    assert weights_per_gpu(mixed, Layout(), "nvfp4").total == mixed.weight_bytes("nvfp4")

    def model(name, formats, mdl="deepseek-v3", par="parallel: {tp: 8, ep: 8}"):
        return _run(_scenario(tmp_path, par, model=mdl, hardware="b200", extra=formats, name=name)).step_time
    from sim.models.ops_tables import MCurve
    kept = model("k", "weight_format: nvfp4\nattention_weight_format: bf16")
    nvfp4 = model("f", "weight_format: nvfp4")
    assert (kept.dtype, kept.attention_dtype, kept.expert_dtype) == ("nvfp4", "bf16", "nvfp4")
    bf16 = kept.tables.gemm("bf16")
    for m in (1, 64, 4096):
        for name in kept.att_gemms:  # the attention's GEMMs read the BF16 table at their own shapes
            want = MCurve(bf16.ms, bf16.curve(*kept.gemm_shapes[name]), "").at(m)
            assert kept.att_gemms[name].at(m) == want != nvfp4.att_gemms[name].at(m)
        for name in kept.moe_gemms:
            assert kept.moe_gemms[name].at(m) == nvfp4.moe_gemms[name].at(m)
    dense = model("d", "weight_format: fp8\nattention_weight_format: bf16", mdl="llama-3.1-8b", par="parallel: {tp: 1}")
    assert dense.attention_dtype == "bf16" and dense.dtype == "fp8"


def test_the_router_gemm_reads_the_bf16_table_in_every_format(tmp_path):
    """The MoE gate stays unquantised in FP8 and NVFP4 checkpoints (DeepSeek-V3's block-FP8 one, NVIDIA's NVFP4 ones),
    so under kind ops its GEMM comes from the BF16 table whatever weight_format says; the experts keep the format's."""
    from sim.models.ops_tables import MCurve

    def model(name, fmt):
        return _run(_scenario(tmp_path, "parallel: {tp: 8, ep: 8}", model="deepseek-v3", hardware="b200",
                              extra=f"weight_format: {fmt}", name=name)).step_time
    fp8, fp4 = model("f8", "fp8"), model("f4", "nvfp4")
    bf16 = fp8.tables.gemm("bf16")
    router = MCurve(bf16.ms, bf16.curve(*fp8.gemm_shapes["router"]), "")
    quantized = fp4.tables.gemm("nvfp4")
    for m in (1, 64, 4096):
        assert fp8.moe_gemms["router"].at(m) == fp4.moe_gemms["router"].at(m) == router.at(m)
        assert fp4.moe_gemms["experts_down"].at(m) == MCurve(
            quantized.ms, quantized.curve(*fp4.gemm_shapes["experts_down"]), "").at(m)
    # at one decode token the NVFP4 table's fixed cost (its activation quantisation) is what the gate no longer pays
    assert router.at(1) < MCurve(quantized.ms, quantized.curve(*fp4.gemm_shapes["router"]), "").at(1)


def test_run_names_attention_data_parallelism(tmp_path, capsys):
    """The run's replica line says the attention data-parallel ranks (8 GPUs as dp 2 x tp 4, not tp 4 alone)."""
    from capsim.cli import main
    sc = _scenario(tmp_path, "parallel: {tp: 4, ep: 8, attention_dp: 2}", model="qwen3-235b-a22b",
                   hardware="h200-sxm")
    assert main(["run", str(sc), "--set", "workload.num_requests=4"]) == 0
    assert "replica of 8 GPUs (attention dp 2, tp 4, pp 1, ep 8), 8 in all" in capsys.readouterr().out


def test_a_layout_whose_logits_all_gather_is_unmeasured_is_refused_when_built():
    """DeepSeek-V3 tp8 ep8 with TensorRT-LLM's own all-reduce, which GB300's tables measure on 8 GPUs, and NCCL's
    all-gather (the logits'), measured on 2 and 4. On GB300 the rack's NVLink reaches 8 GPUs (sim.models.collectives);
    on a card whose profile states no fabric the all-gather cannot be timed, so the model is refused when built,
    naming the field, not at its first decode step."""
    from sim.io.ops_schema import OpsStepTime
    from sim.models.parallel_ops import build_replica_ops_model
    spec, hw = ModelSpec(load_model("deepseek-v3")), load_hardware("gb300")
    cfg = OpsStepTime(tables="gb300", all_reduce="trtllm")
    assert build_replica_ops_model(cfg, spec, hw, Layout(tp=8, ep=8), "fp8", "fp8", True).tp == 8
    bare = hw.model_copy(update={"scale_up_gpus": None, "scale_out_link": None})
    with pytest.raises(ConfigError, match=r"parallel.tp: \S+gb300/nccl.csv has no all_gather measurement on 8 GPUs "
                                          r"\(measured: \[2, 4\]\), and gb300's hardware profile states no "
                                          r"scale_up_gpus"):
        build_replica_ops_model(cfg, spec, bare, Layout(tp=8, ep=8), "fp8", "fp8", True)
    assert build_replica_ops_model(cfg, spec, bare, Layout(tp=4, ep=4), "fp8", "fp8", True).tp == 4


def _mla_row(card: str, stem: str, batch: int, length: int, heads: int) -> float:
    """One measured point of a shipped MLA kernel table, in seconds (read from the CSV, not through the loader)."""
    import csv
    import gzip
    with gzip.open(REPO / "profiles" / "ops" / card / f"{stem}.csv.gz", "rt") as f:
        for r in csv.DictReader(f):
            if (int(r["batch"]), int(r.get("kv_len") or r.get("seq_len")), int(r["heads"])) == (batch, length, heads):
                assert (r["kv_heads"], r["head_dim"]) == ("1", "576")
                return float(r["latency_us"]) * 1e-6
    raise AssertionError(f"{card}/{stem}: no point {batch}, {length}, {heads}")


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
def test_mla_attention_from_an_engines_measured_kernels(engine):
    """step_time.model.mla_kernels: DeepSeek-V3's attention on GB200 from the engine's measured MLA kernels at the
    GPU's heads (128 on an attention-DP rank, 32 under tp4), for the KV cache's format, with no latent scaling."""
    from sim.io.ops_schema import OpsStepTime
    from sim.models.parallel_ops import build_replica_ops_model
    spec, hw = ModelSpec(load_model("deepseek-v3")), load_hardware("gb200")
    cfg = OpsStepTime(tables="gb200", all_reduce="sglang", moe_kernels="sglang", mla_kernels=engine)
    dp = build_replica_ops_model(cfg, spec, hw, Layout(tp=1, attention_dp=4), "nvfp4", "fp8", True)
    assert dp.generation_scale == dp.context_scale == dp.kv_read_scale == 1.0
    assert dp.generation_attention_s(1, 2048) == pytest.approx(_mla_row("gb200", f"mla_generation_{engine}_fp8", 1, 2048, 128))
    assert dp.context_attention_s(1, 1024 * 1025 // 2) == pytest.approx(
        _mla_row("gb200", f"mla_context_{engine}_fp8", 1, 1024, 128))
    tp = build_replica_ops_model(cfg, spec, hw, Layout(tp=4), "nvfp4", "bf16", True)
    assert tp.generation_attention_s(64, 64 * 4096) == pytest.approx(
        _mla_row("gb200", f"mla_generation_{engine}_bf16", 64, 4096, 32))
    # the composition (the default) is what it was: the GQA table's kernel over 2.25 x the FP8 latent's tokens
    comp = build_replica_ops_model(cfg.model_copy(update={"mla_kernels": "composed"}), spec, hw,
                                   Layout(tp=1, attention_dp=4), "nvfp4", "fp8", True)
    assert comp.generation_attention_s(1, 2048) == pytest.approx(comp.generation.at(1, 2048 * 2.25 * 0.5))


def test_mla_kernels_missing_from_a_table_set_keep_the_composition(capsys):
    """A100's tables hold TensorRT-LLM's MLA kernels only: SGLang's are composed, and the run says so once; L40S has
    SGLang's for a BF16 cache alone, which an FP8 cache reads at half the bytes as the GQA tables are read."""
    from sim.io.ops_schema import OpsStepTime
    from sim.models.parallel_ops import build_replica_ops_model, MLA_GENERATION_SCALE
    spec = ModelSpec(load_model("deepseek-v3"))
    hw = load_hardware("a100-80g-sxm")
    cfg = OpsStepTime(tables="a100-80g-sxm", moe_kernels="sglang", mla_kernels="sglang")
    m = build_replica_ops_model(cfg, spec, hw, Layout(tp=8, ep=8), "bf16", "bf16", True)
    assert m.generation_scale == MLA_GENERATION_SCALE
    assert "no sglang MLA kernel table" in capsys.readouterr().err
    t = build_replica_ops_model(cfg.model_copy(update={"mla_kernels": "trtllm"}), spec, hw, Layout(tp=8, ep=8),
                                "bf16", "bf16", True)
    assert t.generation_scale == 1.0
    l40s = build_replica_ops_model(OpsStepTime(tables="l40s", moe_kernels="sglang", mla_kernels="sglang"), spec,
                                   load_hardware("l40s"), Layout(tp=8, ep=8), "bf16", "fp8", True)
    assert l40s.generation_scale == 1.0 and l40s.kv_read_scale == 0.5
    assert l40s.generation_attention_s(8, 8 * 4096) == pytest.approx(
        _mla_row("l40s", "mla_generation_sglang_bf16", 8, 2048, 16))


def test_mla_kernels_field_is_checked():
    from sim.io.ops_schema import OpsStepTime
    with pytest.raises(Exception, match="mla_kernels"):
        OpsStepTime(mla_kernels="vllm")


def test_attention_dp_ranks_each_hold_whole_blocks_of_their_share(tmp_path):
    """Qwen3-235B on 8 x H200 as two attention-DP ranks of TP4: a rank's blocks live on its own 4 GPUs, so the pool is
    2 x floor(the rank's budget / a block's bytes on it), not floor(the replica's budget / one block), which could
    count a block split over two ranks."""
    from sim.core.sizing import replica_memory
    sc, _ = load_scenario(REPO / "scenarios" / "parallel" / "qwen3-235b-a22b-ep8-h200.yaml")
    sc = sc.model_copy(update={"parallel": sc.parallel.model_copy(update={"tp": 4, "attention_dp": 2, "ep": 8})})
    spec = ModelSpec(load_model(sc.model))
    mem = replica_memory(sc, spec, load_hardware(sc.hardware))
    per_gpu = mem.kv_budget_bytes // 8
    block_on_one_gpu = sc.kv.block_tokens * mem.kv_bytes_per_token_per_gpu
    assert mem.num_blocks == 2 * (4 * per_gpu // (4 * block_on_one_gpu)) == 2 * (per_gpu // block_on_one_gpu)
    assert mem.num_blocks < mem.kv_budget_bytes // mem.block_bytes  # the replica-wide floor counts one block more here


def test_a_model_no_layout_holds_names_a_smaller_weight_format_that_would(capsys):
    import re
    from capsim.cli import main
    from sim.models.parallel import nothing_fits
    assert main(["memory", "--model", "kimi-k2.5", "--hardware", "l4"]) == 2
    err = capsys.readouterr().err
    m = re.search(r"no layout of up to 64 GPUs fits; in --weight-format fp8 it would: tp (\d+), pp (\d+), ep (\d+) "
                  r"\((\d+) GPUs\)", err)
    assert m, err
    tp, pp, ep, gpus = map(int, m.groups())
    assert tp * pp == gpus
    # the suggestion holds: that layout in FP8 fits
    assert main(["memory", "--model", "kimi-k2.5", "--hardware", "l4", "--weight-format", "fp8", "--tp", str(tp),
                 "--pp", str(pp), "--ep", str(ep)]) == 0
    # nothing smaller to suggest: the plain refusal
    assert nothing_fits(ModelSpec(load_model("kimi-k2.5")), 1, "int4", 0, "--weight-format") == \
        "; no layout of up to 64 GPUs fits"


def test_memory_text_labels_the_fullest_gpus_kv_per_gpu_and_a_ranks_requests(capsys):
    """Under a layout `capsim memory`'s KV lines are one GPU's (a TP4 Llama-3.1-70B GPU holds a quarter of each
    token's 327,680 B), and under attention DP one rank's share of the requests."""
    from capsim.cli import main
    assert main(["memory", "--model", "llama-3.1-70b", "--hardware", "h100-sxm", "--tp", "4", "--requests", "10"]) == 0
    out = capsys.readouterr().out
    assert "KV per token per GPU         81920 B (bf16)" in out and "total KV for 10 per GPU" in out
    assert main(["memory", "--model", "deepseek-v3", "--hardware", "b200", "--weight-format", "fp8", "--tp", "1",
                 "--ep", "8", "--attention-dp", "8", "--requests", "10"]) == 0
    out = capsys.readouterr().out
    assert "total KV for 2 per GPU" in out and "(one of 8 attention-DP ranks' 2 of 10 requests)" in out
    assert main(["memory", "--model", "llama-3.1-8b", "--requests", "10"]) == 0
    assert "per GPU" not in capsys.readouterr().out  # one GPU: the plain labels
