"""The measured fused-MoE kernel table (sim.models.moe_tables) and its use by the ops model."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from sim.io.errors import ConfigError
from sim.models.moe_tables import MoeTable
from sim.models.ops_tables import OutOfRange, ops_dir

HEADER = "engine,dtype,routing,hidden,inter,topk,experts,moe_tp,moe_ep,tokens,latency_us\n"
# Mixtral-8x7B's shape (hidden 4096, experts of 14336, top-2 of 8) split over 2 GPUs by tensor parallelism
MIXTRAL_TP2 = "vllm,bfloat16,balanced,4096,14336,2,8,2,1"


def _table(tmp_path: Path, rows: str) -> Path:
    p = tmp_path / "moe.csv"
    p.write_text(HEADER + rows)
    return p


def test_curve_is_measured_at_points_and_a_power_law_between(tmp_path):
    t = MoeTable(_table(tmp_path, f"{MIXTRAL_TP2},1,100\n{MIXTRAL_TP2},16,200\n{MIXTRAL_TP2},256,800\n"))
    c = t.curve("vllm", "bfloat16", "balanced", 4096, 14336, 2, 8, 2, 1)
    assert c.at(16) == pytest.approx(200e-6)
    assert c.at(1) == c.at(0.5) == pytest.approx(100e-6)  # below the first point: the first point's latency
    # 4 tokens: half way from 1 to 16 in log space -> 100 us x 2 ** 0.5
    assert c.at(4) == pytest.approx(100e-6 * 2 ** 0.5)
    assert c.at(64) == pytest.approx(200e-6 * 4 ** 0.5)
    with pytest.raises(OutOfRange):
        c.at(512)
    # another split, dtype or engine was not measured
    assert t.curve("vllm", "bfloat16", "balanced", 4096, 14336, 2, 8, 1, 2) is None
    assert t.curve("vllm", "fp8_block", "balanced", 4096, 14336, 2, 8, 2, 1) is None
    assert t.curve("trtllm", "bfloat16", "balanced", 4096, 14336, 2, 8, 2, 1) is None
    assert t.curve("vllm", "bfloat16", "power_law_1.2", 4096, 14336, 2, 8, 2, 1) is None
    assert t.keys() == [("vllm", "bfloat16", "balanced", 4096, 14336, 2, 8, 2, 1)]


@pytest.mark.parametrize("rows, message", [
    ("vllm,bf16,balanced,4096,14336,2,8,2,1,1,100\n", "line 2, column dtype: expected one of bfloat16, fp8, fp8_block, nvfp4, "
                                                       "w4a16_mxfp4, w4a8_mxfp4_mxfp8, got 'bf16'"),
    ("vllm,bfloat16,zipf,4096,14336,2,8,2,1,1,100\n",
     "line 2, column routing: expected one of balanced, power_law_1.2, got 'zipf'"),
    ("tgi,bfloat16,balanced,4096,14336,2,8,2,1,1,100\n", "line 2, column engine: expected one of vllm, sglang, trtllm, got 'tgi'"),
    (f"{MIXTRAL_TP2},1,100\n{MIXTRAL_TP2},1,120\n", "line 3: a second row for"),
    (f"{MIXTRAL_TP2},0,100\n", "line 2, column tokens: expected at least 1, got 0"),
    (f"{MIXTRAL_TP2},1,abc\n", "line 2, column latency_us: expected a number, got 'abc'"),
    (f"{MIXTRAL_TP2},1,0\n", "line 2, column latency_us: expected a positive latency"),
])
def test_malformed_rows_are_refused_naming_line_and_column(tmp_path, rows, message):
    with pytest.raises(ConfigError, match="moe.csv: " + message.replace("(", r"\(").replace(")", r"\)")):
        MoeTable(_table(tmp_path, rows))


def _card_with_moe(tmp_path: Path, rows: str | None) -> Path:
    """profiles/ops/h100-sxm with its moe table replaced by `rows` (or removed)."""
    folder = tmp_path / "cards" / "h100-sxm"
    shutil.copytree(ops_dir() / "h100-sxm", folder)
    for old in folder.glob("moe.csv*"):
        old.unlink()
    if rows is not None:
        (folder / "moe.csv").write_text(HEADER + rows)
    return folder


def _model(tmp_path: Path, tables: Path, parallel: str, model: str = "mixtral-8x7b",
           extra_step: str = ", moe_routing: balanced"):
    from tests.sim.test_parallel import _run, _scenario
    return _run(_scenario(tmp_path, f"parallel: {parallel}", model=model,
                          step=f"{{kind: ops, tables: {tables}{extra_step}}}")).step_time


def test_ops_model_takes_the_routed_experts_from_the_table(tmp_path):
    folder = _card_with_moe(tmp_path, f"{MIXTRAL_TP2},1,100\n{MIXTRAL_TP2},16,200\n{MIXTRAL_TP2},8192,9000\n")
    m = _model(tmp_path, folder, "{tp: 2}")
    assert m.moe_kernel is not None
    router = m._look(m.moe_gemms["router"].at, 16)
    # the router, the measured kernel, the all-reduce over 2 GPUs and the small ops over the hidden width
    # only (the activation is inside the fused kernel; Mixtral has no shared expert)
    assert m._moe_ffn_s(16) == pytest.approx(router + 200e-6 + m._all_reduce(2, 16) + m._small_s(16, 0.0))
    # the same layer composed from GEMMs differs; another engine's kernels are not in this table
    composed = _model(tmp_path, folder, "{tp: 2}", extra_step=", moe_routing: balanced, moe_kernels: composed")
    assert composed.moe_kernel is None
    assert not math.isclose(composed._moe_ffn_s(16), m._moe_ffn_s(16), rel_tol=1e-3)
    assert _model(tmp_path, folder, "{tp: 2}", extra_step=", moe_routing: balanced, moe_kernels: trtllm").moe_kernel is None


def test_imbalance_runs_the_measured_kernel_at_more_tokens(tmp_path):
    """The busiest GPU's experts get expert_imbalance times the work: the kernel at that many times the tokens, so a
    step never gets faster as imbalance grows (it had switched to the composition, faster at some sizes)."""
    folder = _card_with_moe(tmp_path, f"{MIXTRAL_TP2},1,100\n{MIXTRAL_TP2},8192,9000\n")
    even = _model(tmp_path, folder, "{tp: 2}")
    steps = [_model(tmp_path, folder, f"{{tp: 2, expert_imbalance: {x}}}") for x in (1.0, 1.001, 1.5, 4.0)]
    assert all(m.moe_kernel is not None for m in steps)
    times = [m._moe_ffn_s(64) for m in steps]
    assert times[0] == even._moe_ffn_s(64) and times == sorted(times) and times[-1] > times[0]
    assert steps[2]._moe_ffn_s(64) - even._moe_ffn_s(64) == pytest.approx(
        even.moe_kernel.at(96) - even.moe_kernel.at(64))


def test_routing_picks_its_measured_curve(tmp_path):
    skewed = MIXTRAL_TP2.replace("balanced", "power_law_1.2")
    folder = _card_with_moe(tmp_path, f"{MIXTRAL_TP2},1,100\n{MIXTRAL_TP2},8192,9000\n"
                                      f"{skewed},1,90\n{skewed},8192,12000\n")
    assert _model(tmp_path, folder, "{tp: 2}").moe_kernel.at(8192) == pytest.approx(9000e-6)
    m = _model(tmp_path, folder, "{tp: 2}", extra_step="")  # the default: power_law_1.2
    assert m.moe_kernel.at(8192) == pytest.approx(12000e-6) and m.moe_kernel.at(1) == pytest.approx(90e-6)


def test_table_not_used_where_it_does_not_apply(tmp_path, capsys):
    # the table has tp 2 only: an EP layout, skewed routing, or no table at all compose from GEMMs
    folder = _card_with_moe(tmp_path, f"{MIXTRAL_TP2},1,100\n{MIXTRAL_TP2},8192,9000\n")
    assert _model(tmp_path, folder, "{tp: 2, ep: 2}").moe_kernel is None
    assert _model(tmp_path, folder, "{tp: 2, routing_skew: 1.25}").moe_kernel is None
    assert "note: parallel.routing_skew 1.25: mixtral-8x7b's routed experts are composed from GEMMs" in (
        capsys.readouterr().err)
    bare = _card_with_moe(tmp_path / "bare", None)
    assert _model(tmp_path, bare, "{tp: 2}").moe_kernel is None


def test_shipped_tables_cover_the_shipped_moe_models():
    """Every MoE model profile has each engine's measured kernel at one GPU in the H100, H200 and B200 tables."""
    from sim.io.profiles import load_model
    for card in ("h100-sxm", "h200-sxm", "b200"):
        t = MoeTable(next((ops_dir() / card).glob("moe.csv*")))
        for name in ("mixtral-8x7b", "qwen3-235b-a22b", "deepseek-v3", "minimax-m2.5", "kimi-k2.5"):
            p = load_model(name)
            e = p.moe
            for engine in ("vllm", "sglang", "trtllm"):
                found = [k for k in t.keys() if k[0] == engine and k[2] == "balanced" and k[3:] == (
                    p.hidden_size, e.expert_intermediate_size, e.experts_per_token, e.num_experts, 1, 1)]
                assert found, (card, name, engine)



def _nvfp4_scenario(tmp_path: Path, hardware: str, weights: str) -> Path:
    from tests.sim.test_parallel import _scenario
    return _scenario(tmp_path, "parallel: {tp: 4}", model="minimax-m2.5", hardware=hardware,
                     extra=f"weight_format: {weights}\n", name=f"{hardware}-{weights}")


def test_nvfp4_experts_take_the_nvfp4_kernel_on_blackwell(tmp_path):
    """NVFP4 MoE rows (benchmarks/aiconfigurator_moe.py keeps the nvfp4 dtype) for the MoE models the silicon
    sample serves in FP4; an NVFP4 scenario of MiniMax-M2.5 on B200 times its experts with them."""
    from sim.io.profiles import load_model
    for card in ("b200", "b300", "gb200", "gb300"):
        t = MoeTable(next((ops_dir() / card).glob("moe.csv*")))
        for name in ("deepseek-v3", "minimax-m2.5"):
            p = load_model(name)
            e = p.moe
            for engine in ("vllm", "sglang", "trtllm"):
                assert t.curve(engine, "nvfp4", "balanced", p.hidden_size, e.expert_intermediate_size,
                               e.experts_per_token, e.num_experts, 1, 1) is not None, (card, name, engine)
    from tests.sim.test_parallel import _run
    fp4 = _run(_nvfp4_scenario(tmp_path, "b200", "nvfp4")).step_time
    fp8 = _run(_nvfp4_scenario(tmp_path, "b200", "fp8")).step_time
    assert fp4.dtype == "nvfp4" and fp4.moe_kernel is not None and fp8.moe_kernel is not None
    # a decode of 32 tokens reads the experts' weights: half the bytes in NVFP4, a faster kernel
    assert fp4._moe_ffn_s(32) < fp8._moe_ffn_s(32)
    assert fp4.step_s(_decode(32, 2048)) < fp8.step_s(_decode(32, 2048))


def test_nvfp4_needs_a_card_with_nvfp4_gemms(tmp_path):
    from tests.sim.test_parallel import _run
    with pytest.raises(ConfigError, match="no gemm_nvfp4"):
        _run(_nvfp4_scenario(tmp_path, "h100-sxm", "nvfp4")).run()


def _decode(n: int, kv: int):
    from tests.sim.test_ops import decode_plan
    return decode_plan(n, kv)


def test_falling_back_to_the_composition_is_said_once(capsys):
    """SGLang's table has no NVFP4 kernel of Mixtral's shape: its experts are composed from GEMMs, and a note says
    so once per process (a sweep builds the same model many times)."""
    import io

    from sim.io.ops_schema import OpsStepTime
    from sim.io.profiles import load_hardware, load_model
    from sim.models.parallel import Layout
    from sim.models.parallel_ops import build_replica_ops_model
    from sim.models.spec import ModelSpec
    spec, hw, out = ModelSpec(load_model("mixtral-8x7b")), load_hardware("b200"), io.StringIO()
    cfg = OpsStepTime(tp=2, moe_kernels="sglang", moe_routing="balanced")
    models = [build_replica_ops_model(cfg, spec, hw, Layout(tp=2), "nvfp4", "bf16", False, out) for _ in range(2)]
    assert all(m.moe_kernel is None for m in models)
    assert out.getvalue().count("no sglang fused-MoE kernel for mixtral-8x7b's experts (nvfp4, balanced") == 1
    assert "composed from GEMMs" in out.getvalue()
    vllm = build_replica_ops_model(cfg.model_copy(update={"moe_kernels": "vllm"}), spec, hw, Layout(tp=2), "nvfp4",
                                   "bf16", False, out)
    assert vllm.moe_kernel is not None and "no vllm" not in out.getvalue()


def _deepseek(tmp_path: Path, overlap: str):
    from tests.sim.test_parallel import _run, _scenario
    step = "{kind: ops}" if overlap == "" else f"{{kind: ops, shared_experts_overlap: {overlap}}}"
    return _run(_scenario(tmp_path, "parallel: {tp: 8, ep: 8, ep_communication: all_to_all}", model="deepseek-v3",
                          hardware="h200-sxm", step=step, extra="weight_format: fp8\n",
                          name=f"ds-{overlap or 'default'}")).step_time


def test_shared_experts_run_beside_the_routed_ones_where_the_engine_does(tmp_path):
    """DeepSeek-V3's shared expert on a second stream: the layer takes the longer of (router + routed experts)
    and the shared expert instead of their sum, in passes of at most 256 tokens (vLLM's default), in decode-only
    passes (`decode`, TensorRT-LLM) or never (`off`)."""
    off, vllm, decode = (_deepseek(tmp_path, o) for o in ("off", "", "decode"))
    assert vllm.cfg.shared_experts_overlap == 256
    g = off.moe_gemms
    for tokens in (16, 256, 512):
        routed = off._look(g["router"].at, tokens) + off.moe_kernel.at(tokens)
        shared = off._look(g["shared_gate_up"].at, tokens) + off._look(g["shared_down"].at, tokens)
        rest = off._moe_ffn_s(tokens) - routed - shared   # the all-to-all and the small ops, the same in every mode
        assert rest > 0
        beside = max(routed, shared) + rest
        assert beside < off._moe_ffn_s(tokens)
        assert vllm._moe_ffn_s(tokens) == pytest.approx(beside if tokens <= 256 else off._moe_ffn_s(tokens))
        assert decode._moe_ffn_s(tokens, decode_only=True) == pytest.approx(beside)
        assert decode._moe_ffn_s(tokens, decode_only=False) == pytest.approx(off._moe_ffn_s(tokens))
    # whole iterations: a decode step is faster with the overlap; a 4,096-token prefill pass is not changed by
    # vLLM's rule (above its threshold) nor by the decode-only one
    from tests.sim.test_ops import decode_plan, prefill_plan
    step = decode_plan(64, 2048)
    assert vllm.step_s(step) < off.step_s(step) and decode.step_s(step) == pytest.approx(vllm.step_s(step))
    mixed = prefill_plan(1, 4096, 0, decode_plan(8, 2048))
    assert vllm.step_s(mixed) == pytest.approx(off.step_s(mixed)) == pytest.approx(decode.step_s(mixed))
    # a model without shared experts is not affected
    from tests.sim.test_parallel import _run, _scenario
    mix = [_run(_scenario(tmp_path, "parallel: {tp: 2}", model="mixtral-8x7b", name=f"mx-{o}",
                          step=f"{{kind: ops, shared_experts_overlap: {o}}}")).step_time for o in ("off", "decode")]
    assert mix[0].step_s(step) == mix[1].step_s(step)


def _deepseek_tp(tmp_path: Path, overlap: str, moe_kernels: str = "sglang"):
    from tests.sim.test_parallel import _run, _scenario
    return _run(_scenario(tmp_path, "parallel: {tp: 8}", model="deepseek-v3", hardware="h200-sxm",
                          step=f"{{kind: ops, shared_experts_overlap: {overlap}, moe_kernels: {moe_kernels}, "
                               "moe_routing: balanced}", extra="weight_format: fp8\n",
                          name=f"ds-tp-{overlap}-{moe_kernels}")).step_time


def test_shared_experts_fused_into_the_routed_kernel(tmp_path):
    """`fused` (SGLang's DeepSeek path): the shared expert is one more expert every token is routed to and its own
    GEMMs are gone. In a decode-only pass (bound by the experts' weights) the routed experts' time grows by one
    expert's weights beside the D(T) the tokens touch, (D + 1) / D; in a pass with a prefill by one more expert's
    work per token, (k + 1) / k = 9 / 8; with the measured kernel and with experts composed from GEMMs. Under expert
    parallelism the fusion is off (the shared GEMMs run after the routed ones, as `off`)."""
    from sim.models.parallel import distinct_experts
    for kernels in ("sglang", "composed"):
        off, fused = _deepseek_tp(tmp_path, "off", kernels), _deepseek_tp(tmp_path, "fused", kernels)
        assert (off.moe_kernel is None) == (kernels == "composed")
        g, e = off.moe_gemms, off.moe
        assert (e.experts_per_token, e.num_shared_experts) == (8, 1)
        for tokens in (1, 16, 512, 4096):
            shared = off._look(g["shared_gate_up"].at, tokens) + off._look(g["shared_down"].at, tokens)
            router, comm = off._look(g["router"].at, tokens), off._all_reduce(8, tokens)
            if off.moe_kernel is not None:
                routed, width = off.moe_kernel.at(tokens), 0.0
            else:
                routed = off._moe_ffn_s(tokens) - router - shared - comm - off._small_s(tokens, 9 * 2048 / 8)
                width = 8 * 2048 / 8
            assert routed > 0
            assert off._moe_ffn_s(tokens) == pytest.approx(router + routed + shared + comm
                                                           + off._small_s(tokens, width + 2048 / 8))
            assert fused._moe_ffn_s(tokens) == pytest.approx(router + routed * 9 / 8 + comm
                                                             + off._small_s(tokens, width * 9 / 8))
            d = distinct_experts(256, 8, tokens, 0.0)
            assert d == pytest.approx(8 if tokens == 1 else d) and 8 <= d <= 256
            assert fused._moe_ffn_s(tokens, decode_only=True) == pytest.approx(
                router + routed * (d + 1) / d + comm + off._small_s(tokens, width * 9 / 8))
        # a decode step is faster fused (the shared GEMMs' fixed cost is gone); a long prefill costs about the same
        from tests.sim.test_ops import decode_plan, prefill_plan
        assert fused.step_s(decode_plan(8, 2048)) < off.step_s(decode_plan(8, 2048))
        assert fused.step_s(prefill_plan(1, 4096)) == pytest.approx(off.step_s(prefill_plan(1, 4096)), rel=0.1)
    # experts spread over GPUs: no fusion
    from tests.sim.test_parallel import _run, _scenario
    ep = [_run(_scenario(tmp_path, "parallel: {tp: 8, ep: 8, ep_communication: all_to_all}", model="deepseek-v3",
                         hardware="h200-sxm", step=f"{{kind: ops, shared_experts_overlap: {o}}}",
                         extra="weight_format: fp8\n", name=f"ds-ep-{o}")).step_time for o in ("off", "fused")]
    for tokens in (1, 16, 512):
        assert ep[1]._moe_ffn_s(tokens) == ep[0]._moe_ffn_s(tokens)


@pytest.mark.parametrize("value", ["0", "always", "-4"])
def test_shared_experts_overlap_refuses_other_values(tmp_path, value):
    from tests.sim.test_parallel import _run
    with pytest.raises(ConfigError, match="shared_experts_overlap"):
        _deepseek(tmp_path, value)


def test_host_time_per_sequence_under_parallelism(tmp_path):
    """A multi-GPU (MoE) replica's pass pays step_time.model.host_per_sequence_s per sequence, as one GPU's does;
    under pipeline parallelism once per sequence of the pass, not once per micro-batch."""
    tables = ops_dir() / "h100-sxm"
    for parallel in ("{tp: 2}", "{tp: 2, pp: 2}"):
        base = _model(tmp_path, tables, parallel)
        per_seq = _model(tmp_path, tables, parallel, extra_step=", moe_routing: balanced, host_per_sequence_s: 5.0e-5")
        for n in (1, 8, 32):
            plan = _decode(n, 512)
            assert per_seq.step_s(plan) - base.step_s(plan) == pytest.approx(n * 5e-5, rel=1e-6), (parallel, n)
