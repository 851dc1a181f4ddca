"""Qwen3.5-397B-A17B: Gated DeltaNet (linear-attention) layers, their fixed state per request, gated attention, and
its published rows (issue 15)."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import pytest

from sim.io.ops_schema import OpsStepTime
from sim.io.profiles import ModelProfile, load_hardware, load_model
from sim.models.parallel import Layout, kv_bytes_per_token_per_gpu, layout_problems, state_bytes_per_sequence_per_gpu
from sim.models.parallel_ops import build_replica_ops_model
from sim.models.spec import ModelSpec

H, LAYERS, VOCAB = 4096, 60, 248320
"""Qwen3.5-397B-A17B's text config: hidden 4096, 60 layers (45 Gated DeltaNet, 15 full attention with 32 gated heads
and 2 KV heads of 256, q / k norms), 512 experts top-10 and one shared expert, all of width 1024, vocab 248320
untied. Linear layers: 16 key heads and 64 value heads of 128, a convolution 4 taps wide, FP32 state."""
KD, VD, NV = 16 * 128, 64 * 128, 64
CONV = 2 * KD + VD   # the convolution's channels: q, k and v
REPO = Path(__file__).resolve().parents[2]


def spec(**kw) -> ModelSpec:
    return ModelSpec(load_model("qwen3.5-397b-a17b"), **kw)


def test_qwen3_5_counts_by_hand():
    """396.3 B parameters (the name's 397 B counts a 0.4 B vision tower capsim leaves out), 17.3 B active a token."""
    s = spec()
    full = H * 32 * 256 * 2 + 2 * H * 2 * 256 + 32 * 256 * H            # q with its gate, k, v, o
    linear = H * (2 * KD + 2 * VD) + H * 2 * NV + VD * H                # in_proj_qkvz, in_proj_ba, out_proj
    expert, router = 3 * H * 1024, H * 512
    vectors = 15 * (H + 2 * 256) + 45 * (H + CONV * 4 + 2 * NV + 128) + LAYERS * H + H
    assert s.total_params == (15 * full + 45 * linear + LAYERS * (router + 513 * expert) + vectors + 2 * VOCAB * H)
    assert s.active_params == (15 * full + 45 * linear + LAYERS * (router + 11 * expert) + vectors + 2 * VOCAB * H)
    assert round(s.total_params / 1e9, 1) == 396.3 and round(s.active_params / 1e9, 1) == 17.3
    # every fourth layer attends in full: the config's layer_types
    assert [i for i in range(LAYERS) if not s.linear_layer(i)] == list(range(3, LAYERS, 4))


def test_only_full_layers_keep_kv_and_every_linear_layer_keeps_a_fixed_state():
    s = spec()
    assert s.full_attention_layers == 15
    assert s.kv_bytes_per_token("bf16") == 15 * 2 * 2 * 256 * 2
    assert s.state_bytes_per_sequence == 45 * (CONV * 3 * 2 + NV * 128 * 128 * 4) == 192_061_440
    # a disaggregated prefill hands the state over with the KV: the decode side cannot continue without it
    assert s.kv_bytes_of_sequence(1000, "bf16") == 1000 * s.kv_bytes_per_token("bf16") + 192_061_440
    assert s.kv_bytes_of_sequence(1000, "fp8") == 1000 * s.kv_bytes_per_token("fp8") + 192_061_440
    # TP4: 4 key and 16 value heads a GPU, one KV head of the full layers (2 KV heads replicated over 4 GPUs)
    assert state_bytes_per_sequence_per_gpu(s, Layout(tp=4)) == 45 * (CONV // 4 * 3 * 2 + 16 * 128 * 128 * 4)
    assert kv_bytes_per_token_per_gpu(s, Layout(tp=4), "fp8") == 15 * 2 * 1 * 256
    # PP2: 30 layers a stage, the first stage's 23 linear ones (layers 0-29: full at 3, 7, ..., 27) are the fullest
    assert state_bytes_per_sequence_per_gpu(s, Layout(pp=2)) == 23 * (CONV * 3 * 2 + NV * 128 * 128 * 4)
    llama = ModelSpec(load_model("llama-3.1-8b"))
    assert llama.state_bytes_per_sequence == 0 and not llama.linear_layer(0)


@pytest.mark.parametrize("change, message", [
    ({"num_value_heads": 60}, r"linear_attention.num_value_heads \(60\) must be a multiple of"),
    ({"layers": 60}, r"linear_attention.layers \(60\) must be below num_layers \(60\)"),
])
def test_a_linear_attention_block_the_model_cannot_take_is_refused(change, message):
    raw = load_model("qwen3.5-397b-a17b").model_dump()
    raw["linear_attention"].update(change)
    with pytest.raises(ValueError, match=message):
        ModelProfile(**raw)


def test_a_tp_that_splits_the_linear_key_heads_unevenly_is_refused():
    """32 attention heads take TP 32, but the 16 key heads of the linear layers do not."""
    problems = layout_problems(spec(), Layout(tp=32))
    assert problems and "16 linear-attention key heads" in problems[0] and "[1, 2, 4, 8, 16]" in problems[0]
    assert layout_problems(spec(), Layout(tp=16)) == []


def _model(layout: Layout, engine: str, kernels: str = "composed"):
    cfg = OpsStepTime(tp=layout.tp, moe_kernels=kernels, moe_routing="balanced", linear_attention_kernels=engine)
    return build_replica_ops_model(cfg, spec(), load_hardware("b200"), layout, "fp8", "fp8", False, io.StringIO())


def test_linear_layers_take_their_own_gemms_and_the_engines_measured_kernels():
    """45 of the 60 layers run the Gated DeltaNet kernels: two engines' tables change a pass by 45 x their
    difference, and a linear layer's GEMMs are in_proj_qkvz, in_proj_ba and out_proj split over the GPUs."""
    from sim.models.parallel_ops import RankLoad
    lay = Layout(tp=4)
    a, b = _model(lay, "sglang"), _model(lay, "vllm")
    assert a.linear.gemm_shapes == {"in_proj_qkvz": ((2 * KD + 2 * VD) // 4, H), "in_proj_ba": (2 * NV // 4, H),
                                    "out_proj": (H, VD // 4)}
    assert a.gemm_shapes["qkv"] == ((2 * 8 + 2 * 1) * 256, H)     # 8 heads with their gates, the replicated KV head
    for rank, diff in ((RankLoad(8192, 1, 8192 * 8193 // 2, 0, 0, 1),
                        a.linear.prefill_s(1, 8192) - b.linear.prefill_s(1, 8192)),
                       (RankLoad(64, 0, 0, 64, 64 * 2048, 64), a.linear.decode_s(64) - b.linear.decode_s(64))):
        assert diff != 0
        assert a.stage_s(0, rank.tokens, rank) - b.stage_s(0, rank.tokens, rank) == pytest.approx(45 * diff, rel=1e-9)
    # the kernels as measured: SGLang's decode kernels on B200, 16 value heads a GPU, 64 sequences (26.51 us)
    assert a.linear.decode_s(64) == pytest.approx(26.51e-6)


def test_qwen3_5_full_attention_takes_the_head_dim_256_kernels():
    from sim.models.ops_tables import load_table_set
    ts = load_table_set("b200")
    # measured rows (benchmarks/aiconfigurator_head_dims.py), not scaled from another head_dim: twice the head dim,
    # about twice the work on a long prompt
    assert (8, 1, 256) in ts.context().rows and (4, 1, 256) in ts.generation().rows
    ratio = ts.context().shape(8, 1, 256).at(8, 8192) / ts.context().shape(8, 1, 128).at(8, 8192)
    assert 1.3 < ratio < 2.5
    assert ts.generation().shape(4, 1, 256).at(64, 2048) > 0


def test_the_state_pool_takes_its_share_and_caps_the_running_requests():
    """kv.state_to_kv_ratio 0.9: the state pool takes 0.9 / 1.9 of the budget in whole requests' states, the KV pool
    the rest, and no more requests run at once than the pool has slots."""
    from sim.core.simulation import Simulation
    from sim.io.config import load_scenario
    sc, base = load_scenario(REPO / "scenarios" / "parallel" / "qwen3.5-397b-a17b-tp4-b200.yaml")
    per_seq = state_bytes_per_sequence_per_gpu(spec(), Layout(tp=4)) * 4
    budget = 2 * 2**30 * 4            # 2 GiB a GPU
    small = sc.model_copy(update={"kv": sc.kv.model_copy(update={"budget": budget}),
                                  "workload": sc.workload.model_copy(update={"num_requests": 40})})
    sim = Simulation(small, base)
    mem = sim.memory
    slots = int(budget * 0.9 / 1.9 // per_seq)
    assert mem.state_slots == slots
    assert mem.state_bytes == slots * per_seq
    # a block: 16 tokens of the 15 full layers' one KV head (FP8) on each of the 4 GPUs
    assert mem.num_blocks == int((budget - slots * per_seq) // (16 * 15 * 2 * 1 * 256 * 4))
    result = sim.run()
    its = result.iterations
    assert its["batch_size"].max() <= slots < 40
    assert result.summary["state_slots"] == slots
    # a ratio that leaves no room for one request's state is refused, naming the field
    from sim.io.errors import ConfigError
    tiny = small.model_copy(update={"kv": small.kv.model_copy(update={"state_to_kv_ratio": 1e-6})})
    with pytest.raises(ConfigError, match="kv.state_to_kv_ratio"):
        Simulation(tiny, base)


def test_memory_command_states_the_state_pool(capsys):
    from capsim.cli import main
    assert main(["memory", "--model", "qwen3.5-397b-a17b", "--weight-format", "fp8", "--kv-format", "fp8", "--tp", "4",
                 "--hardware", "b200", "--gpu-memory-utilization", "0.88", "--prompt", "8192", "--output", "1024",
                 "--requests", "128", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    per_gpu = 45 * (CONV // 4 * 3 * 2 + 16 * 128 * 128 * 4)
    assert out["state_bytes_per_request"] == per_gpu
    budget = int(0.88 * load_hardware("b200").memory_bytes) - out["parallel"]["weights_per_gpu"]["total"]
    assert out["state_slots"] == int(budget * 0.9 / 1.9 // per_gpu)
    assert out["kv_budget_bytes"] == budget - out["state_slots"] * per_gpu
    assert out["max_requests"] <= out["state_slots"] and out["fits"]
    assert main(["memory", "--model", "qwen3.5-397b-a17b", "--weight-format", "fp8", "--kv-budget", "30GB",
                 "--prompt", "100", "--requests", "3"]) == 0
    text = capsys.readouterr().out
    assert "linear-attention state per request  183.16 MiB (45 layers, fp32 state" in text
    # a GPU must hold its share of the state pool too: weights + KV pool alone would fit a B200, with the pool not
    assert main(["memory", "--model", "qwen3.5-397b-a17b", "--weight-format", "fp8", "--tp", "8", "--ep", "8",
                 "--kv-budget", "1200GiB", "--hardware", "b200", "--json"]) == 0
    par = json.loads(capsys.readouterr().out)["parallel"]
    w, kv, pool = par["weights_per_gpu"]["total"], par["kv_budget_bytes_per_gpu"], par["state_pool_bytes_per_gpu"]
    assert w + kv <= load_hardware("b200").memory_bytes < w + kv + pool and par["fits_per_gpu"] is False
    assert "max requests                        73" in text


def test_published_rows_of_qwen3_5_replay_its_checkpoints():
    """fp4 rows ran nvidia/Qwen3.5-397B-A17B-NVFP4 (routed experts NVFP4, the rest BF16), fp8 rows the FP8
    checkpoint; the linear layers take the row's engine's own kernels."""
    from sim.published.predict import build_case
    from sim.published.rows import read_published
    from tests.published.test_validate_published import FIXTURE
    base = next(r for r in read_published(FIXTURE) if r.mode == "agg")
    row = replace(base, model_path="Qwen/Qwen3.5-397B-A17B", backend="sglang", system="b200_sxm", tp=4, pp=1,
                  moe_ep=1, attention_dp=1, moe_tp=4)
    for precision, formats in (("fp4", ("bf16", "nvfp4")), ("fp8", ("fp8", None))):
        case = build_case(replace(row, precision=precision))
        assert case.skipped is None, case.skipped
        sc = case.scenario
        assert (sc["weight_format"], sc.get("expert_weight_format")) == formats
        assert sc["step_time"]["model"]["linear_attention_kernels"] == "sglang"


# Qwen3.5-397B-A17B FP8, TP4 (1 B a matrix value, vectors and the embedding tables BF16): per GPU 8 gated heads, the
# replicated KV head, 4 key and 16 value heads of the linear layers, a quarter of every expert, vocab 62080 rows
QWEN35_TP4 = {
    "attention": 15 * (H * 8 * 256 * 2 + 2 * H * 1 * 256 + 8 * 256 * H)
                 + 45 * (H * (2 * KD + 2 * VD) // 4 + H * 2 * NV // 4 + VD // 4 * H),
    "ffn": LAYERS * (512 * 3 * H * 1024 // 4 + H * 512 + 3 * H * 1024 // 4),
    "embedding": 62080 * H * 2, "lm_head": 62080 * H * 2,
    "norms": (15 * (H + 2 * 256) + 45 * (H + CONV // 4 * 4 + 2 * NV // 4 + 128) + LAYERS * H + H) * 2,
}


def test_shipped_qwen3_5_scenario_memory_per_gpu_is_exact():
    """scenarios/parallel/qwen3.5-397b-a17b-tp4-b200.yaml (docs/parallel.md's table) sized by hand: 0.88 x card -
    weights - 2 GiB per GPU, 0.9 / 1.9 of it the state pool in whole requests' states, the rest KV blocks."""
    from sim.core.simulation import Simulation
    from sim.io.config import load_scenario
    from sim.models.parallel import weights_per_gpu
    w = weights_per_gpu(spec(), Layout(tp=4), "fp8")
    for part, value in QWEN35_TP4.items():
        assert getattr(w, part) == value, part
    assert w.total == sum(QWEN35_TP4.values()) and round(w.total / 1e9, 3) == 99.707
    sc, base = load_scenario(REPO / "scenarios" / "parallel" / "qwen3.5-397b-a17b-tp4-b200.yaml")
    mem = Simulation(sc, base).memory
    budget = int(0.88 * load_hardware("b200").memory_bytes) - w.total - 2 * 2**30
    assert mem.kv_budget_bytes_per_gpu == budget
    per_seq = 45 * (CONV // 4 * 3 * 2 + 16 * 128 * 128 * 4)
    assert mem.state_slots == int(budget * 4 * 0.9 / 1.9 // (per_seq * 4)) == 557
    assert mem.num_blocks == int((budget * 4 - 557 * per_seq * 4) // (16 * 7680 * 4))


def test_memory_fit_figure_charges_the_state_pool():
    """The memory-fit figure's 12 GiB for Qwen3.5-397B-A17B (BF16 KV): the state pool's 31 requests' states
    (0.9 / 1.9 of the budget, 192,061,440 B each) come first; the KV left holds 97 short requests (2,048 + 256) and
    26 long ones (8,192 + 256), so 31 and 26 fit."""
    from sim.figures.memory import memory_fit_table
    row = memory_fit_table("12GiB", models=["qwen3.5-397b-a17b", "llama-3.1-8b"]).set_index("model")
    q = row.loc["qwen3.5-397b-a17b"]
    assert q.state_bytes_per_request == 192_061_440
    assert (q.requests_fit_short, q.requests_fit_long) == (31, 26)
    kv_left = 12 * 2**30 - 31 * 192_061_440
    assert kv_left // q.kv_bytes_per_request_short == 97 and kv_left // q.kv_bytes_per_request_long == 26
    assert row.loc["llama-3.1-8b"].state_bytes_per_request == 0


def test_a_disaggregated_handoff_times_the_state_by_its_own_split():
    """The decode pool needs each request's state with its KV. The link's lanes are the KV's (kv_transfer_share: with
    2 KV heads over TP8 on both sides, the busiest link carries 2x the request's KV); the state is split over the 8
    GPUs by heads, so each link carries an eighth of it: weighed 1/16 against the KV."""
    from sim.core.pools import state_link_bytes
    from sim.core.simulation import Simulation
    from sim.io.config import load_scenario
    from sim.models.parallel import kv_transfer_share
    s, lay = spec(), Layout(tp=8)
    kv_of = lambda t: s.kv_bytes_of_sequence(t, "fp8")  # noqa: E731
    share = kv_transfer_share(s, lay, lay)
    assert share == 2.0
    link = state_link_bytes(s, lay, lay, kv_of)
    state = s.state_bytes_per_sequence
    assert link(1000) == pytest.approx(kv_of(1000) - state + state * (1 / 8) / share)
    assert state_link_bytes(ModelSpec(load_model("llama-3.1-8b")), lay, lay, kv_of) is None
    # end to end: a Qwen3.5 prefill pool hands its requests to a decode pool; the bytes recorded are KV and state
    sc, base = load_scenario(REPO / "scenarios" / "parallel" / "qwen3.5-397b-a17b-tp4-b200.yaml")
    raw = sc.model_dump(exclude_unset=True)
    raw.update(parallel={"tp": 8}, workload=dict(raw["workload"], num_requests=12),
               disaggregation={"prefill": {"replicas": 1, "parallel": {"tp": 8}},
                               "decode": {"replicas": 1, "parallel": {"tp": 8}}, "link": {"latency_s": 0.0005}})
    from sim.io.config import Scenario
    result = Simulation(Scenario.model_validate(raw), base).run()
    req = result.requests
    done = req[req["kv_transfer_bytes"].notna()]
    assert len(done) == 12
    assert (done["kv_transfer_bytes"] > state).all()


def test_a_state_ratio_on_a_model_without_linear_layers_is_refused(tmp_path):
    import yaml
    from sim.core.simulation import Simulation
    from sim.io.config import load_scenario
    from sim.io.errors import ConfigError
    raw = yaml.safe_load((REPO / "scenarios" / "parallel" / "llama-3.1-70b-tp4-h100.yaml").read_text())
    raw["kv"]["state_to_kv_ratio"] = 0.5
    path = tmp_path / "llama.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="kv.state_to_kv_ratio: 0.5 on llama-3.1-70b, which has no linear-attention"):
        Simulation(*load_scenario(path))
    raw["kv"]["state_to_kv_ratio"] = 0.9     # the default, as a scenario written out in full states it: fine
    path.write_text(yaml.safe_dump(raw))
    Simulation(*load_scenario(path))


def test_the_breakdown_names_the_linear_layers_and_the_reads_view_counts_the_state():
    """`capsim profile`'s breakdown: 15 layers of attention kernels, 45 of linear attention, and at one stage nothing
    left over for `pipeline`; a decode step reads and writes each sequence's state (capsim memory --batch)."""
    from sim.models.roofline import decode_reads
    m = _model(Layout(tp=4), "sglang")
    b = m.breakdown_s(8192 + 64, 1, 8192 * 8193 // 2, 64, 64 * 2000, 65)
    assert b["linear_attention"] > 0 and abs(b["pipeline"]) < 1e-12
    assert b["context_attention"] == pytest.approx(15 * m.context_attention_s(1, 8192 * 8193 // 2))
    r = decode_reads(spec(), 64, 2048, "fp8", "fp8")
    assert r.state_bytes_per_output_token == 2 * 192_061_440
    assert r.bytes_per_iteration == pytest.approx(r.weight_bytes_per_output_token * 64
                                                  + 64 * (r.kv_bytes_per_output_token + 2 * 192_061_440))
    assert decode_reads(ModelSpec(load_model("llama-3.1-8b")), 8, 2048).state_bytes_per_output_token == 0


def test_a_speculative_verification_runs_one_recurrent_step_per_position():
    """Decodes verifying k drafts hold k + 1 positions each: the Gated DeltaNet layers run k + 1 recurrent steps for
    them, and none of those positions counts as a prompt token of the chunked kernel."""
    from sim.models.parallel_ops import RankLoad
    m = _model(Layout(tp=4), "sglang")
    lin = m.linear
    plain, verify = RankLoad(64, 0, 0, 64, 64 * 2000, 64), RankLoad(256, 0, 0, 64, 64 * 2000, 256, 256)
    assert m._linear_block_s(plain) == pytest.approx(lin.gemms_s(64) + lin.decode_s(64))
    assert m._linear_block_s(verify) == pytest.approx(lin.gemms_s(256) + 4 * lin.decode_s(64))
    mixed = RankLoad(8192 + 256, 1, 8192 * 8193 // 2, 64, 64 * 2000, 257, 256)
    assert m._linear_block_s(mixed) == pytest.approx(lin.gemms_s(8192 + 256) + lin.prefill_s(1, 8192)
                                                     + 4 * lin.decode_s(64))


def test_shared_prefixes_on_a_linear_attention_model_say_their_hits_are_an_upper_bound():
    """Prompts that share a prefix on Qwen3.5: the KV cache reuses every match whole, but not the linear layers' state
    at it, so the run notes the hits are an upper bound unless kv.snapshot_tokens says where the engine snapshots it;
    a workload with nothing to share says nothing."""
    import io
    from sim.core.simulation import Simulation
    from sim.io.config import SharedPrefixes, load_scenario
    sc, base = load_scenario(REPO / "scenarios" / "parallel" / "qwen3.5-397b-a17b-tp4-b200.yaml")
    shared = sc.model_copy(update={"name": "q35-shared", "workload": sc.workload.model_copy(
        update={"num_requests": 8, "shared_prefix": SharedPrefixes(tokens=4096, groups=1)})})
    out = io.StringIO()
    Simulation(shared, base, stream=out)
    assert "every prefix hit is reused whole, an upper bound" in out.getvalue()
    for quiet in (shared.model_copy(update={"name": "q35-snap", "kv": shared.kv.model_copy(
                      update={"snapshot_tokens": 1024})}),
                  sc.model_copy(update={"name": "q35-none", "workload": sc.workload.model_copy(
                      update={"num_requests": 8})})):
        out = io.StringIO()
        Simulation(quiet, base, stream=out)
        assert "upper bound" not in out.getvalue()
