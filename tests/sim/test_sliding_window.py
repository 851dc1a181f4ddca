"""gpt-oss-120b: sliding-window attention layers, MXFP4 experts, and its published rows (issue 15)."""

from __future__ import annotations

import io
import math
from dataclasses import replace

import pytest

from sim.io.ops_schema import OpsStepTime
from sim.io.profiles import ModelProfile, load_hardware, load_model
from sim.models.moe_tables import MoeTable
from sim.models.ops_tables import ops_dir
from sim.models.parallel import Layout, kv_bytes_per_token_per_gpu, weights_per_gpu
from sim.models.parallel_ops import build_replica_ops_model
from sim.models.spec import ModelSpec

H, LAYERS, VOCAB = 2880, 36, 201088
"""gpt-oss-120b's config: hidden 2880, 36 layers (18 windowed), 64 heads and 8 KV heads of 64, 128 experts top-4 of
width 2880, vocab 201088, untied embeddings, q / k / v biases."""


def test_gpt_oss_120b_counts_by_hand():
    """OpenAI's model card: 116.8B parameters, 5.1B active a token (its count leaves out the embedding table)."""
    spec = ModelSpec(load_model("gpt-oss-120b"))
    attn = H * 64 * 64 + 2 * H * 8 * 64 + 64 * 64 * H
    bias = (64 + 2 * 8) * 64
    expert, router = 3 * H * 2880, H * 128
    norms = LAYERS * (H + bias + H) + H   # input norm and qkv bias, post-attention norm; final norm
    assert spec.total_params == LAYERS * (attn + router + 128 * expert) + norms + 2 * VOCAB * H
    assert spec.active_params == LAYERS * (attn + router + 4 * expert) + norms + 2 * VOCAB * H
    assert round(spec.total_params / 1e9, 1) == 116.8
    assert round((spec.active_params - spec.embedding_params) / 1e9, 1) == 5.1
    # the released checkpoint: MXFP4 experts (4 bits + one 8-bit scale per 32 values), everything else BF16
    mx = ModelSpec(load_model("gpt-oss-120b"), expert_format="mxfp4")
    experts = LAYERS * 128 * expert
    assert mx.weight_bytes("bf16") == (experts * 17 // 32 + (spec.total_params - experts) * 2)
    assert round(mx.weight_bytes("bf16") / 1e9, 1) == 65.2


def test_windowed_layers_keep_no_kv_per_token():
    """Only the 18 full-attention layers grow with the context; the 18 windowed ones keep 128 tokens a sequence."""
    spec = ModelSpec(load_model("gpt-oss-120b"))
    assert [spec.windowed_layer(i) for i in range(4)] == [True, False, True, False]   # the config's layer_types
    assert spec.full_attention_layers == 18
    assert spec.kv_bytes_per_token("bf16") == 18 * 2 * 8 * 64 * 2
    assert spec.window_kv_elements_per_sequence == 18 * 2 * 8 * 64 * 128
    # TP4: two KV heads a GPU; PP2: 18 layers a stage, 9 of them full
    assert kv_bytes_per_token_per_gpu(spec, Layout(tp=4), "bf16") == 18 * 2 * 2 * 64 * 2
    assert kv_bytes_per_token_per_gpu(spec, Layout(pp=2), "bf16") == 9 * 2 * 8 * 64 * 2
    # a model without windowed layers counts every layer, as before
    llama = ModelSpec(load_model("llama-3.1-8b"))
    assert llama.kv_bytes_per_token("bf16") == 32 * 2 * 8 * 128 * 2 and llama.window_kv_elements_per_sequence == 0


@pytest.mark.parametrize("fields, message", [
    ({"sliding_window": 128}, "sliding_window and sliding_window_layers go together"),
    ({"sliding_window_layers": 4}, "sliding_window and sliding_window_layers go together"),
    ({"sliding_window": 128, "sliding_window_layers": 37}, "sliding_window_layers (37) exceeds num_layers (36)"),
])
def test_a_window_without_its_layers_is_refused(fields, message):
    raw = load_model("gpt-oss-120b").model_dump()
    raw.update({"sliding_window": None, "sliding_window_layers": 0, **fields})
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ModelProfile(**raw)


def _model(spec: ModelSpec, layout: Layout, engine: str = "vllm"):
    cfg = OpsStepTime(tp=layout.tp, moe_kernels=engine, moe_routing="balanced")
    return build_replica_ops_model(cfg, spec, load_hardware("b200"), layout, "bf16", "bf16", False, io.StringIO())


def test_windowed_attention_reads_and_computes_its_window_only():
    """Decode: a windowed layer reads min(context, 128) tokens, so the mean over the layers is the full lookup and
    the 128-token lookup half and half; within the window both are the same. Prefill: a windowed layer's pairs
    (s w - w (w - 1) / 2 for a chunk of s) timed as the kernel at length w over as many windows."""
    spec = ModelSpec(load_model("gpt-oss-120b"), expert_format="mxfp4")
    m = _model(spec, Layout(tp=4))
    assert m.window_share == 0.5
    full, win = m.generation.at(8, 4096.0), m.generation.at(8, 128.0)
    assert m.generation_attention_s(8, 8 * 4096) == pytest.approx(0.5 * full + 0.5 * win)
    assert m.generation_attention_s(8, 8 * 100) == pytest.approx(m.generation.at(8, 100.0))
    s = 4096
    windows = 2 * (s * 128 - 128 * 127 / 2) / (128 * 129 / 2)
    expect = 0.5 * m.context.at(2, float(s)) + 0.5 * m.context.at(windows, 128.0)
    assert m.context_attention_s(2, 2 * s * (s + 1) // 2) == pytest.approx(expect)
    assert m.context_attention_s(2, 2 * s * (s + 1) // 2) < m.context.at(2, float(s))
    # more windows than the table's largest batch: run as several launches of at most that batch, never refused
    s, seqs = 8192, 8
    windows = seqs * (s * 128 - 128 * 127 / 2) / (128 * 129 / 2)
    assert windows > m.context.largest_batch
    n = math.ceil(windows / m.context.largest_batch)
    expect = 0.5 * m.context.at(seqs, float(s)) + 0.5 * n * m.context.at(windows / n, 128.0)
    assert m.context_attention_s(seqs, seqs * s * (s + 1) // 2) == pytest.approx(expect)


def test_mxfp4_experts_take_the_engines_w4a16_kernel_or_nvfp4_gemms():
    """The shipped tables hold gpt-oss's measured w4a16_mxfp4 fused-MoE kernels (vLLM on H100 and B200); with
    composed experts (TensorRT-LLM's default) the experts' GEMMs come from the card's NVFP4 table."""
    p = load_model("gpt-oss-120b")
    for card in ("h100-sxm", "b200"):
        t = MoeTable(next((ops_dir() / card).glob("moe.csv*")))
        assert t.curve("vllm", "w4a16_mxfp4", "balanced", H, 2880, 4, 128, 4, 1) is not None, card
    spec = ModelSpec(p, expert_format="mxfp4")
    vllm = _model(spec, Layout(tp=4))
    t = MoeTable(next((ops_dir() / "b200").glob("moe.csv*")))
    w4a16 = t.curve("vllm", "w4a16_mxfp4", "balanced", H, 2880, 4, 128, 4, 1)
    assert vllm.expert_dtype == "mxfp4" and vllm.moe_kernel.at(1024) == w4a16.at(1024)
    # MXFP8 activations: vLLM's table has no such kernel, so SGLang's measurement of the same FlashInfer kernel, said
    out = io.StringIO()
    cfg = OpsStepTime(tp=4, moe_kernels="vllm", moe_routing="balanced", mxfp4_activations="mxfp8")
    mx = build_replica_ops_model(cfg, spec, load_hardware("b200"), Layout(tp=4), "bf16", "bf16", False, out)
    w4a8 = t.curve("sglang", "w4a8_mxfp4_mxfp8", "balanced", H, 2880, 4, 128, 4, 1)
    assert mx.moe_kernel.at(1024) == w4a8.at(1024) < w4a16.at(1024)
    assert "take sglang's measured w4a8_mxfp4_mxfp8 kernel" in out.getvalue()
    # on H100 nobody measured MXFP8 activations: composed from GEMMs, and said so
    out = io.StringIO()
    h100 = build_replica_ops_model(cfg, spec, load_hardware("h100-sxm"), Layout(tp=4), "bf16", "bf16", False, out)
    assert h100.moe_kernel is None and "no vllm fused-MoE kernel for gpt-oss-120b's experts (w4a8_mxfp4_mxfp8, " \
        "sglang's w4a8_mxfp4_mxfp8, balanced" in out.getvalue()
    trt = build_replica_ops_model(OpsStepTime(tp=4, moe_kernels="composed"), spec, load_hardware("b200"), Layout(tp=4),
                                  "bf16", "bf16", False, io.StringIO())
    assert trt.moe_kernel is None and trt.moe_gemms["experts_gate_up"].what.startswith("gemm_nvfp4")
    assert trt.att_gemms["qkv"].what.startswith("gemm_bf16")


def test_published_fp4_rows_of_gpt_oss_replay_its_mxfp4_checkpoint():
    """The silicon sample labels gpt-oss's fp4 rows nvfp4; they ran openai/gpt-oss-120b, MXFP4 experts and BF16 the
    rest, so they replay so, on H100 too (no NVFP4 GEMMs needed)."""
    from sim.published.predict import build_case
    from sim.published.rows import read_published
    from tests.published.test_validate_published import FIXTURE
    base = next(r for r in read_published(FIXTURE) if r.mode == "agg")
    row = replace(base, model_path="openai/gpt-oss-120b", precision="fp4", backend="vllm", tp=4, pp=1, moe_ep=1,
                  attention_dp=1, moe_tp=4)
    # InferenceX's recipes: MXFP8 activations on Blackwell (FlashInfer's TRT-LLM-gen kernel), BF16 on Hopper (Marlin)
    for system, activations in (("b200_sxm", "mxfp8"), ("h100_sxm", "bf16")):
        case = build_case(replace(row, system=system))
        assert case.skipped is None, case.skipped
        sc = case.scenario
        assert (sc["weight_format"], sc["expert_weight_format"]) == ("bf16", "mxfp4")
        assert sc["step_time"]["model"]["mxfp4_activations"] == activations
    # any other row's step time says nothing of MXFP4
    assert "mxfp4_activations" not in build_case(base).scenario["step_time"]["model"]
    spec = ModelSpec(load_model("gpt-oss-120b"), expert_format="mxfp4")
    assert weights_per_gpu(spec, Layout(tp=4), "bf16").total < 20e9   # 65 GB over four GPUs


def test_memory_command_counts_full_layers_per_token_and_states_the_window(capsys):
    """`capsim memory` of gpt-oss-120b: KV per token over the 18 full layers (TP2: 4 KV heads a GPU), the windowed
    layers' 128 tokens a request stated beside the pool, and the MXFP4 experts' weights."""
    import json
    from capsim.cli import main
    assert main(["memory", "--model", "gpt-oss-120b", "--expert-weight-format", "mxfp4", "--tp", "2",
                 "--hardware", "b200", "--gpu-memory-utilization", "0.9", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["parallel"]["kv_bytes_per_token_per_gpu"] == 18 * 2 * 4 * 64 * 2
    assert out["window_kv_bytes_per_request"] == 18 * 2 * 8 * 64 * 128 * 2
    assert out["weight_bytes"] == ModelSpec(load_model("gpt-oss-120b"), expert_format="mxfp4").weight_bytes("bf16")
    assert main(["memory", "--model", "gpt-oss-120b", "--expert-weight-format", "mxfp4"]) == 0
    assert "sliding-window KV per request  4.50 MiB over the replica (18 layers x 128 tokens" in capsys.readouterr().out


def test_a_sequences_kv_holds_the_window_once_the_context_passes_it():
    """What a disaggregated prefill hands over: every full layer's K and V per token, and in each windowed layer the
    last 128 tokens at most (DisaggFrontend takes ModelSpec.kv_bytes_of_sequence)."""
    spec = ModelSpec(load_model("gpt-oss-120b"))
    per_token_full, per_token_window = 18 * 2 * 8 * 64 * 2, 18 * 2 * 8 * 64 * 2
    assert spec.kv_bytes_of_sequence(100, "bf16") == 100 * (per_token_full + per_token_window)
    assert spec.kv_bytes_of_sequence(4096, "bf16") == 4096 * per_token_full + 128 * per_token_window
    assert spec.kv_bytes_of_sequence(4096, "fp8") == spec.kv_bytes_of_sequence(4096, "bf16") / 2
    llama = ModelSpec(load_model("llama-3.1-8b"))
    assert llama.kv_bytes_of_sequence(4096, "bf16") == 4096 * llama.kv_bytes_per_token("bf16")


# gpt-oss-120b, TP2, the released checkpoint (BF16, experts MXFP4 at 17 / 32 B a value): h 2880, 36 layers, 32 heads
# and 4 KV heads of 64 per GPU with their q / k / v biases, router 2880 x 128 (BF16, replicated), 128 experts of
# 3 x 2880 x 2880 each split two ways, vocab 201088 (100544 rows); KV: the 18 full layers' 4 KV heads
GPT_OSS_TP2 = {
    "attention": 36 * (H * 32 * 64 + 2 * H * 4 * 64 + 32 * 64 * H) * 2,
    "ffn": 36 * H * 128 * 2 + 36 * 128 * 3 * H * 2880 // 2 * 17 // 32,
    "embedding": 100544 * H * 2, "lm_head": 100544 * H * 2,
    "norms": (36 * (H + (32 + 2 * 4) * 64 + H) + H) * 2,
    "kv_per_token": 18 * 2 * 4 * 64 * 2,
}


def test_shipped_gpt_oss_scenario_memory_per_gpu_is_exact():
    """scenarios/parallel/gpt-oss-120b-tp2-h100.yaml (docs/parallel.md's table) sized by hand: 0.9 x card - weights -
    2 GiB of activations per GPU, in blocks of 16 tokens of the full layers' KV."""
    from pathlib import Path
    from sim.core.simulation import Simulation
    from sim.io.config import load_scenario
    spec = ModelSpec(load_model("gpt-oss-120b"), expert_format="mxfp4")
    w = weights_per_gpu(spec, Layout(tp=2), "bf16")
    for part in ("attention", "ffn", "embedding", "lm_head", "norms"):
        assert getattr(w, part) == GPT_OSS_TP2[part], part
    total = sum(GPT_OSS_TP2[p] for p in ("attention", "ffn", "embedding", "lm_head", "norms"))
    assert w.total == total and round(total / 1e9, 3) == 32.598
    path = Path(__file__).resolve().parents[2] / "scenarios" / "parallel" / "gpt-oss-120b-tp2-h100.yaml"
    sc, base = load_scenario(path)
    mem = Simulation(sc, base).memory
    assert mem.gpus == 2 and mem.weight_bytes_per_gpu == total
    assert mem.kv_budget_bytes_per_gpu == int(0.9 * load_hardware("h100-sxm").memory_bytes) - total - 2 * 2**30
    assert mem.kv_bytes_per_token_per_gpu == GPT_OSS_TP2["kv_per_token"]
    assert mem.num_blocks == mem.kv_budget_bytes_per_gpu // (16 * GPT_OSS_TP2["kv_per_token"])

