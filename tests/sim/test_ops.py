"""The operator-level step-time model (kind: ops) and one-pass mixed iterations."""

from __future__ import annotations

import io
import math
import random

import pytest
import yaml

from sim.core.request import Request
from sim.core.step import StepPlan
from sim.io.errors import ConfigError
from sim.io.ops_schema import OpsStepTime
from sim.io.profiles import EfficiencyStepTime, ModelProfile, load_fitted, load_hardware, load_model, profiles_dir
from sim.models.ops import SMALL_OPS, REFERENCE_BANDWIDTH_GBS, OpsModel, build_ops_model
from sim.models.ops_tables import load_table_set
from sim.models.spec import ModelSpec
from sim.models.step_time import EfficiencyModel
from tests.sim.helpers import run, scenario

TINY = {"name": "tiny", "hf_id": "none/tiny", "family": "llama", "num_layers": 2, "hidden_size": 256,
        "intermediate_size": 256, "num_attention_heads": 2, "num_kv_heads": 1, "head_dim": 128,
        "vocab_size": 512, "tie_word_embeddings": False, "max_position_embeddings": 4096, "source": "test"}


def gemm_us(m, n, k):
    """The tiny table's GEMM: 1 us per 65536 weights at m = 1, twice that at m = 16."""
    return n * k / 65536 * (1 if m == 1 else 2)


def write_tiny_tables(folder):
    folder.mkdir()
    rows = ["m,n,k,latency_us"] + [f"{m},{n},{k},{gemm_us(m, n, k):g}" for m in (1, 16) for n in (256, 512)
                                   for k in (256, 512)]
    (folder / "gemm_bf16.csv").write_text("\n".join(rows) + "\n")
    ctx = ["batch,seq_len,heads,kv_heads,head_dim,latency_us"]
    gen = ["batch,kv_len,heads,kv_heads,head_dim,latency_us"]
    for heads in (1, 2):
        for b in (1, 2):
            for n in (1, 16):
                ctx.append(f"{b},{n},{heads},1,128,{heads * b * (3 if n == 16 else 1)}")
                gen.append(f"{b},{n},{heads},1,128,{heads * b * (2 if n == 16 else 1)}")
    (folder / "context_attention.csv").write_text("\n".join(ctx) + "\n")
    (folder / "generation_attention.csv").write_text("\n".join(gen) + "\n")
    nccl = ["op,gpus,bytes,latency_us"] + [f"{op},2,{b},{5 if b == 512 else 10}" for op in ("all_reduce", "all_gather")
                                           for b in (512, 1048576)]
    (folder / "nccl.csv").write_text("\n".join(nccl) + "\n")
    return folder


@pytest.fixture
def tiny(tmp_path):
    return ModelSpec(ModelProfile.model_validate(TINY)), load_table_set(str(write_tiny_tables(tmp_path / "tiny")))


def tiny_model(tiny, **cfg):
    spec, tables = tiny
    return OpsModel(OpsStepTime(tables=str(tables.folder), host_overhead_s=1e-4, **cfg), spec, tables, "bf16",
                    REFERENCE_BANDWIDTH_GBS, allow_extrapolation=cfg.pop("allow", False) if "allow" in cfg else False)


def decode_plan(batch: int, context: int) -> StepPlan:
    p = StepPlan()
    p.add_decodes(batch, batch * context, context + 1)
    return p


def prefill_plan(seqs: int, new: int, cached: int = 0, plan: StepPlan | None = None) -> StepPlan:
    p = plan or StepPlan()
    for i in range(seqs):
        r = Request(i, 0.0, cached + new, 8, 0.0)
        r.computed_tokens = cached
        p.add(r, new)
    return p


def small_s(tokens, hidden=256, qk=3 * 128, inter=256):
    widths = {"hidden": hidden, "qk": qk, "intermediate": inter}
    return sum(c * (a + b * widths[w] * tokens) for c, a, b, w in SMALL_OPS.values())


def test_composition_on_a_hand_built_table(tiny):
    m = tiny_model(tiny)
    # decode, batch 1 at 16 cached tokens: every lookup lands on a measured point (m = 1)
    gemms = gemm_us(1, 512, 256) + gemm_us(1, 256, 256) + gemm_us(1, 512, 256) + gemm_us(1, 256, 256)
    layer = gemms * 1e-6 + 2 * 2e-6 + small_s(1)  # generation attention (b 1, kv 16, 2 heads) = 2 x 1 x 2 us
    want = 1e-4 + 2 * layer + gemm_us(1, 512, 256) * 1e-6
    assert m.step_s(decode_plan(1, 16)) == pytest.approx(want, rel=1e-9)
    # prefill of one 16-token prompt: m = 16, context attention (b 1, s 16) = 2 x 3 us, lm_head at m = 1
    gemms16 = 2 * gemms
    layer = gemms16 * 1e-6 + 2 * 3e-6 + small_s(16)
    want = 1e-4 + 2 * layer + gemm_us(1, 512, 256) * 1e-6
    assert m.step_s(prefill_plan(1, 16)) == pytest.approx(want, rel=1e-9)


def test_q_k_norms_are_two_more_norm_kernels_unless_fused_with_rope(tiny):
    """A q / k norm model (Qwen3) runs two more RMSNorms per layer, over its q heads (2 x 128) and its k head
    (128): hand-computed from SMALL_OPS' rms_norm; TensorRT-LLM's fused_qk_norm_rope adds none."""
    spec, tables = tiny
    qk = ModelSpec(ModelProfile.model_validate({**TINY, "qk_norm": True}))
    plain = tiny_model(tiny)
    separate = tiny_model((qk, tables))
    fused = tiny_model((qk, tables), qk_norm_kernels="fused_with_rope")
    _, a, b, _ = SMALL_OPS["rms_norm"]
    for tokens in (1, 16):
        extra = 2 * a + b * 3 * 128 * tokens
        assert separate.layer_linear_s(tokens) - plain.layer_linear_s(tokens) == pytest.approx(extra, rel=1e-9)
        assert fused.layer_linear_s(tokens) == pytest.approx(plain.layer_linear_s(tokens), rel=1e-12)
    assert separate.step_s(decode_plan(1, 16)) - plain.step_s(decode_plan(1, 16)) == pytest.approx(
        2 * (2 * a + b * 3 * 128), rel=1e-9)   # two layers


def test_tensor_parallel_shards_and_adds_all_reduces(tiny):
    spec, tables = tiny
    m = OpsModel(OpsStepTime(tables=str(tables.folder), tp=2, host_overhead_s=0.0), spec, tables, "bf16",
                 REFERENCE_BANDWIDTH_GBS)
    # per GPU: 1 head, 1 KV head (replicated); QKV n = 3 x 128 = 384 (bilinear between 256 and 512)
    assert m.gemm_shapes == {"qkv": (384, 256), "o": (256, 128), "gate_up": (256, 256), "down": (256, 128)}
    t1 = gemm_us(1, 384, 256) + gemm_us(1, 256, 256) + gemm_us(1, 256, 256) + gemm_us(1, 256, 256)  # k 128 -> 256
    layer = t1 * 1e-6 + 2e-6 + small_s(1, qk=256, inter=128) + 2 * 5e-6  # attention 1 head; 2 all-reduces of 512 B
    # lm_head: vocab 512 / 2 = 256; all-gather of 1 x 512 x 2 = 1024 B: log-log between 512 B (5 us) and 1 MiB (10 us)
    lm = gemm_us(1, 256, 256) * 1e-6 + 5e-6 * 2 ** (1 / 11)
    assert m.step_s(decode_plan(1, 16)) == pytest.approx(2 * layer + lm, rel=1e-9)
    with pytest.raises(ConfigError, match="tp"):
        OpsModel(OpsStepTime(tables=str(tables.folder), tp=4), spec, tables, "bf16", REFERENCE_BANDWIDTH_GBS)


def test_an_engines_own_all_reduce_replaces_nccls(tiny):
    spec, tables = tiny
    (tables.folder / "all_reduce_vllm.csv").write_text("op,gpus,bytes,latency_us\nall_reduce,2,512,1\n"
                                                       "all_reduce,2,1048576,4\n")
    nccl = OpsModel(OpsStepTime(tables=str(tables.folder), tp=2, host_overhead_s=0.0), spec, tables, "bf16",
                    REFERENCE_BANDWIDTH_GBS)
    own = OpsModel(OpsStepTime(tables=str(tables.folder), tp=2, host_overhead_s=0.0, all_reduce="vllm"), spec, tables,
                   "bf16", REFERENCE_BANDWIDTH_GBS)
    plan = decode_plan(1, 16)
    # 2 layers x 2 all-reduces of 1 x 256 x 2 = 512 B: 5 us under NCCL, 1 us under the engine's table; the
    # logits' all-gather stays NCCL's
    assert nccl.step_s(plan) - own.step_s(plan) == pytest.approx(2 * 2 * (5e-6 - 1e-6), rel=1e-9)
    assert own.breakdown_s(1, 0, 0, 1, 16, 1)["all_reduce"] == pytest.approx(4e-6, rel=1e-9)
    # log-log between the engine's points, as NCCL's: half-way (in log) from 512 B to 1 MiB -> 2 us
    assert own.ar.at("all_reduce", 2, 512 * 2 ** 5.5) == pytest.approx(2e-6, rel=1e-9)
    with pytest.raises(ConfigError, match=r"no all_reduce_sglang\.csv"):
        OpsModel(OpsStepTime(tables=str(tables.folder), tp=2, all_reduce="sglang"), spec, tables, "bf16",
                 REFERENCE_BANDWIDTH_GBS)
    with pytest.raises(Exception, match="all_reduce"):
        OpsStepTime(all_reduce="mpi")


def test_shipped_engine_all_reduces_beat_nccl_on_a_decode_message():
    """The engines' custom all-reduce (benchmarks/aiconfigurator_allreduce.py) on the 64 KB message of a
    4-sequence 8,192-wide decode step: a few microseconds where NCCL takes 15-30; at 128 MiB they meet."""
    for card in ("h100-sxm", "h200-sxm", "b200"):
        tables = load_table_set(card)
        nccl = tables.nccl()
        for engine in ("vllm", "sglang", "trtllm"):
            own = tables.all_reduce(engine)
            assert own.gpus("all_reduce") == [2, 4, 8]
            small = 4 * 8192 * 2
            assert own.at("all_reduce", 8, small) < 0.6 * nccl.at("all_reduce", 8, small)
            big = 2 ** 27
            assert own.at("all_reduce", 8, big) == pytest.approx(nccl.at("all_reduce", 8, big), rel=0.5)
    assert "all_reduce_<engine>.csv" in load_table_set("b200").source()


def test_a_gemm_beyond_the_grid_continues_the_last_cell(tmp_path):
    """A GEMM wider or deeper than the table is one kernel: its fixed cost once and the last cell's cost per column
    and row (t = a + b n + c k + d n k continued), not one fixed cost per table-sized piece."""
    from sim.models.ops_tables import GemmTable
    us = lambda m, n, k: 4 + n * k / 65536 * (1 if m == 1 else 2)  # noqa: E731  4 us launch, then the work
    rows = ["m,n,k,latency_us"] + [f"{m},{n},{k},{us(m, n, k):g}" for m in (1, 16) for n in (256, 512)
                                   for k in (256, 512)]
    (tmp_path / "gemm_bf16.csv").write_text("\n".join(rows) + "\n")
    g = GemmTable(tmp_path / "gemm_bf16.csv")
    for m, n, k in [(1, 2048, 256), (1, 256, 2048), (1, 1024, 1024), (16, 4096, 512)]:
        assert g.at(m, n, k) * 1e6 == pytest.approx(us(m, n, k), rel=1e-9), (m, n, k)
    assert g.at(1, 2048, 256) * 1e6 < 4 * us(1, 512, 256)  # four table-sized pieces would pay 4 us four times
    for n, k in [(2048, 256), (256, 4096), (8192, 8192)]:  # a larger m never costs less, beyond the grid too
        assert g.at(16, n, k) >= g.at(8, n, k) >= g.at(1, n, k)


def test_interpolation_is_monotone_on_the_shipped_tables():
    tables = load_table_set("h100-sxm")
    g = tables.gemm("bf16")
    ms = list(range(1, 300)) + [int(1.07 ** i) for i in range(85, 154)]
    for n, k in [(6144, 4096), (28672, 4096), (4096, 14336), (128256, 4096), (1000, 300)]:
        ts = [g.at(x, n, k) for x in ms]
        assert all(b >= a for a, b in zip(ts, ts[1:])), (n, k)
        assert g.at(64, n + 100, k) >= g.at(64, n, k) and g.at(64, n, k + 100) >= g.at(64, n, k)
    gen = tables.generation().shape(32, 8, 128)
    ctx = tables.context().shape(32, 8, 128)
    lengths = [1.0 + 1.13 ** i for i in range(90)]
    for b in (1, 3, 8, 50, 256):
        ts = [gen.at(b, x) for x in lengths]
        assert all(y >= x for x, y in zip(ts, ts[1:]))
        ts = [ctx.at(min(b, 256), x) for x in lengths if x <= 16384]
        assert all(y >= x for x, y in zip(ts, ts[1:]))
    for x in (100.0, 3000.0):
        ts = [gen.at(b, x) for b in range(1, 2049, 7)]
        assert all(y >= x for x, y in zip(ts, ts[1:]))
    nccl = tables.nccl()
    ts = [nccl.at("all_reduce", 4, 2 ** (i / 4)) for i in range(0, 116)]
    assert all(y >= x for x, y in zip(ts, ts[1:]))


def random_mixed_plans(rng, count):
    for _ in range(count):
        p = decode_plan(rng.randint(1, 200), rng.randint(1, 6000))
        yield prefill_plan(rng.randint(1, 3), rng.choice([1, 16, 100, 512, 2048]), rng.randint(0, 4000), p)


def split(plan: StepPlan) -> tuple[StepPlan, StepPlan]:
    dec = decode_plan(plan.decode_seqs, plan.decode_kv_tokens // plan.decode_seqs)
    pre = StepPlan()
    for r, n, h in plan.items:
        r.computed_tokens = h
        pre.add(r, n)
    return dec, pre


@pytest.mark.parametrize("card", ["h100-sxm", "b200", "a100-80g-sxm"])
def test_ops_mixed_iteration_between_larger_part_and_sum(card):
    spec, hw = ModelSpec(load_model("llama-3.1-8b")), load_hardware(card)
    one = build_ops_model(OpsStepTime(), spec, hw, "bf16", "bf16", False)
    both = build_ops_model(OpsStepTime(mixed="sum"), spec, hw, "bf16", "bf16", False)
    for plan in random_mixed_plans(random.Random(3), 60):
        dec, pre = split(plan)
        td, tp = one.step_s(dec), one.step_s(pre)
        t = one.step_s(plan)
        assert max(td, tp) <= t + 1e-12 and t <= td + tp + 1e-12
        assert both.step_s(plan) == pytest.approx(td + tp, rel=1e-12)


def test_efficiency_one_pass_between_larger_part_and_sum():
    prof = load_fitted(profiles_dir() / "fitted" / "rtx-pro-6000-bw-ws__qwen3-8b__bf16__chapter.yaml")
    spec, hw = ModelSpec(load_model("qwen3-8b")), load_hardware("rtx-pro-6000-bw-ws")
    args = (spec, spec.weight_read_bytes("bf16"), spec.kv_bytes_per_token("bf16"), hw.peak_flops_per_s("bf16"), True)
    summed = EfficiencyModel(prof.efficiency, *args)
    one = EfficiencyModel(prof.efficiency.model_copy(update={"mixed": "one_pass"}), *args)
    assert EfficiencyStepTime.model_validate(prof.efficiency.model_dump()).mixed is None  # default: the sum
    saved = 0
    for plan in random_mixed_plans(random.Random(5), 60):
        td, tp = summed.decode_s(plan), summed.prefill_s(plan)
        assert summed.step_s(plan) == td + tp
        t = one.step_s(plan)
        assert max(td, tp) <= t <= td + tp
        saved += t < td + tp
    assert saved > 30  # one pass reads the weights once: it is cheaper in most mixed iterations


def test_out_of_range_refused_or_warned(tiny):
    m = tiny_model(tiny)
    with pytest.raises(ConfigError, match="allow_extrapolation") as exc:
        m.step_s(prefill_plan(1, 40))  # GEMM m = 40 > 16 measured
    assert "GEMM m" in str(exc.value)
    spec, tables = tiny
    err = io.StringIO()
    m = OpsModel(OpsStepTime(tables=str(tables.folder), host_overhead_s=0.0), spec, tables, "bf16",
                 REFERENCE_BANDWIDTH_GBS, allow_extrapolation=True, stream=err)
    t40, t16 = m.step_s(prefill_plan(1, 40)), m.step_s(prefill_plan(1, 16))
    m.step_s(prefill_plan(1, 64))
    assert t40 > t16
    assert err.getvalue().count("warning") == 1 and "extrapolating" in err.getvalue()


@pytest.mark.parametrize("text, where", [
    ("m,n,k,latency_us\n1,256,256,1\n1,256,x,2\n", "line 3, column k"),
    ("m,n,k,latency_us\n1,256,256,1\n1,256,512,-2\n", "line 3, column latency_us"),
    ("m,n,k,latency_us\n1,256,256\n", "line 2: expected 4 columns"),
    ("m,n,latency_us\n1,256,1\n", "line 1: header must be m,n,k,latency_us"),
])
def test_malformed_table_names_file_line_and_column(tmp_path, text, where):
    folder = write_tiny_tables(tmp_path / "bad")
    (folder / "gemm_bf16.csv").write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_table_set(str(folder)).gemm("bf16")
    assert "gemm_bf16.csv" in str(exc.value) and where in str(exc.value)


def test_unknown_table_set_and_models_it_cannot_express():
    spec, hw = ModelSpec(load_model("llama-3.1-8b")), load_hardware("h100-sxm")
    with pytest.raises(ConfigError, match="known: .*h100-sxm"):
        build_ops_model(OpsStepTime(tables="no-such-card"), spec, hw, "bf16", "bf16", False)
    with pytest.raises(ConfigError, match="MoE"):
        build_ops_model(OpsStepTime(), ModelSpec(load_model("mixtral-8x7b")), hw, "bf16", "bf16", False)
    with pytest.raises(ConfigError, match="kv.format: kind ops times decode attention for a bf16, fp16, fp8 KV"):
        build_ops_model(OpsStepTime(), spec, hw, "bf16", "q4_0", False)
    with pytest.raises(ConfigError, match="gemm_fp8"):   # the A100 has no FP8 GEMMs
        build_ops_model(OpsStepTime(dtype="fp8"), spec, load_hardware("a100-80g-sxm"), "fp8", "bf16", False)


def test_fp8_kv_cache_halves_the_bytes_decode_attention_reads():
    spec, hw = ModelSpec(load_model("llama-3.1-8b")), load_hardware("h100-sxm")
    bf16 = build_ops_model(OpsStepTime(), spec, hw, "fp8", "bf16", False)
    fp8 = build_ops_model(OpsStepTime(), spec, hw, "fp8", "fp8", False)
    # the BF16 kernel over half the cached tokens of the same sequences
    assert fp8.generation_attention_s(256, 256 * 2048) == bf16.generation_attention_s(256, 256 * 1024)
    assert fp8.step_s(decode_plan(256, 2048)) < bf16.step_s(decode_plan(256, 2048))
    assert fp8.step_s(prefill_plan(1, 2048)) == bf16.step_s(prefill_plan(1, 2048))  # prefill: BF16 times


def test_scenario_runs_with_kind_ops_deterministically():
    kw = dict(model="llama-3.1-8b", hardware="h100-sxm", step_time={"model": {"kind": "ops"}},
              scheduler={"kind": "chunked", "max_num_seqs": 64, "max_num_batched_tokens": 2048, "chunk_tokens": 2048},
              workload__num_requests=60)
    a, b = run(scenario(**kw)), run(scenario(**kw))
    assert a.summary == b.summary and len(a.requests) == 60
    ttft = a.requests["ttft_s"].dropna()
    assert len(ttft) == 60 and math.isfinite(ttft.max())
    bad = yaml.safe_load("{kind: ops, dtype: int4}")
    with pytest.raises(Exception, match="dtype"):
        scenario(step_time={"model": bad})


def test_every_shipped_table_set_loads_and_composes():
    from sim.models.ops_tables import known_table_sets
    sets = known_table_sets()
    assert {"h100-sxm", "h200-sxm", "b200", "a100-80g-sxm", "l40s", "rtx-pro-6000-server",
            "b300", "gb200", "gb300"} <= set(sets)
    spec = ModelSpec(load_model("llama-3.1-8b"))
    hw = load_hardware("h100-sxm")  # only its bandwidth is read (small ops); the tables are each card's
    steps = {}
    for name in sets:
        tables = load_table_set(name)
        assert "aiconfigurator" in tables.source()
        tray = name in ("gb200", "gb300")   # NVL72 GPUs: NCCL measured on the 2 and 4 GPUs of one compute tray
        for tp in (1, 2, 4) if tray else (1, 2, 8):
            m = build_ops_model(OpsStepTime(tables=name, tp=tp), spec, hw, "bf16", "bf16", False)
            steps[name, tp] = m.step_s(decode_plan(16, 2048))
            assert 1e-3 < steps[name, tp] < 0.1
        if tray:  # 8 GPUs: beyond the tray's measurements, within the fabric of the card the model runs on
            build_ops_model(OpsStepTime(tables=name, tp=8), spec, hw, "bf16", "bf16", False)
            with pytest.raises(ConfigError, match=r"has no all_reduce measurement on 8 GPUs \(measured: \[2, 4\]\), "
                                                  r"and l40s's hardware profile states no scale_up_gpus"):
                build_ops_model(OpsStepTime(tables=name, tp=8), spec, load_hardware("l40s"), "bf16", "bf16", False)
    # GB300's TensorRT-LLM all-reduce is measured on 8 GPUs, its NCCL all-gather (the logits' under tp) is not: on a
    # card without a stated fabric, refused when the model is built, not at the first decode step
    with pytest.raises(ConfigError, match=r"gb300/nccl.csv has no all_gather measurement on 8 GPUs \(measured: \[2, 4\]\)"
                                          r".*; the logits' all-gather"):
        build_ops_model(OpsStepTime(tables="gb300", tp=8, all_reduce="trtllm"), spec, load_hardware("l40s"), "bf16",
                        "bf16", False)
    # the faster card is faster: B200 < H200 <= H100 < A100 < L40S on a memory-bound decode
    assert steps["b200", 1] < steps["h200-sxm", 1] <= steps["h100-sxm", 1] < steps["a100-80g-sxm", 1] < steps["l40s", 1]
    # Blackwell and Blackwell Ultra (8 TB/s, 7.75 on B300) read the weights at about the same speed
    for name in ("b300", "gb200", "gb300"):
        assert steps[name, 1] == pytest.approx(steps["b200", 1], rel=0.05) and steps[name, 1] < steps["h200-sxm", 1]


def test_nvfp4_weights_are_four_and_a_half_bits_and_read_faster_on_blackwell():
    from fractions import Fraction

    from sim.models.formats import weight_bytes_per_element
    assert weight_bytes_per_element("nvfp4") == Fraction(9, 16)   # 4-bit values + one FP8 scale per 16
    spec, hw = ModelSpec(load_model("llama-3.1-70b")), load_hardware("b200")
    assert spec.weight_bytes("nvfp4") < spec.weight_bytes("fp8") < spec.weight_bytes("bf16")
    steps = {w: build_ops_model(OpsStepTime(tp=2), spec, hw, w, "bf16", False).step_s(decode_plan(8, 1024))
             for w in ("bf16", "fp8", "nvfp4")}
    assert steps["nvfp4"] < steps["fp8"] < steps["bf16"]   # a small decode is bound by reading the weights
    with pytest.raises(ConfigError, match="no gemm_nvfp4"):
        build_ops_model(OpsStepTime(tp=2), spec, load_hardware("h100-sxm"), "nvfp4", "bf16",
                        False).step_s(decode_plan(8, 1024))


def test_an_efficiency_model_of_nvfp4_weights_takes_the_cards_fp4_peak():
    from pathlib import Path

    from sim.core.step_time_builder import build_step_time
    from tests.sim.helpers import scenario
    sc = scenario(model="llama-3.1-8b", hardware="b200", weight_format="nvfp4", step_time={"model": {
        "kind": "efficiency", "decode_table": [{"bytes": 1.0e9, "time_s": 0.001}], "prefill_mfu": 0.5}})
    spec, hw = ModelSpec(load_model("llama-3.1-8b")), load_hardware("b200")
    assert build_step_time(sc, Path("."), spec, hw).peak == hw.peak_flops_per_s("nvfp4") == 9000e12


def test_a_folder_without_the_table_names_only_the_tables_it_has(tmp_path):
    from sim.models.ops_tables import TableSet
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "sub").mkdir()
    with pytest.raises(ConfigError, match=r"no gemm_bf16\.csv\[\.gz\] \(no kernel tables .* not a table set"):
        TableSet("x", tmp_path).gemm("bf16")
    (tmp_path / "gemm_fp8.csv").write_text("m,n,k,time_ms\n")
    with pytest.raises(ConfigError, match=r"\(this table set has: gemm_fp8\.csv\)$"):
        TableSet("x", tmp_path).gemm("bf16")


def test_host_time_per_sequence_adds_to_every_pass(tiny):
    """step_time.model.host_per_sequence_s: each pass pays it once per sequence in it, decode or prefill (and a pass
    of each in `sum` mode pays it for its own), on top of the per-iteration host time."""
    spec, tables = tiny
    base, per_seq = tiny_model(tiny), tiny_model(tiny, host_per_sequence_s=3e-5)
    dec = decode_plan(2, 16)
    assert per_seq.step_s(dec) - base.step_s(dec) == pytest.approx(2 * 3e-5, rel=1e-9)
    pre = prefill_plan(2, 8)
    assert per_seq.step_s(pre) - base.step_s(pre) == pytest.approx(2 * 3e-5, rel=1e-9)
    mixed = prefill_plan(1, 15, plan=decode_plan(1, 16))
    assert per_seq.step_s(mixed) - base.step_s(mixed) == pytest.approx(2 * 3e-5, rel=1e-9)
    assert per_seq.breakdown_s(16, 1, 120, 1, 16, 2)["host"] == pytest.approx(1e-4 + 2 * 3e-5, rel=1e-12)
    assert OpsStepTime().host_per_sequence_s == 0.0
    with pytest.raises(ValueError):
        OpsStepTime(host_per_sequence_s=-1e-6)
