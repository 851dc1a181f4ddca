"""TensorRT-LLM's NVLink all-to-all of wide expert parallelism in the ops model (sim.models.nvlink_alltoall)."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

import pytest
from pydantic import ValidationError

from sim.io.errors import ConfigError
from sim.io.ops_schema import OpsStepTime
from sim.io.profiles import load_hardware, load_model
from sim.models.nvlink_alltoall import NvlinkAlltoallTable
from sim.models.parallel import Layout
from sim.models.parallel_ops import build_replica_ops_model
from sim.models.spec import ModelSpec

REPO = Path(__file__).resolve().parents[2]
SPEC = ModelSpec(load_model("deepseek-v3"))


def _model(card: str, ep: int, all_to_all: str, weights: str = "nvfp4", communication: str = "all_to_all",
           model: ModelSpec = SPEC):
    cfg = OpsStepTime(tables=card, moe_kernels="trtllm", moe_routing="balanced", all_to_all=all_to_all)
    lay = Layout(tp=1, ep=ep, attention_dp=ep, ep_communication=communication)
    return build_replica_ops_model(cfg, model, load_hardware(card), lay, weights, "fp8", True)


def _measured(method: str, dtype: str, ep: int) -> dict[int, float]:
    """tokens per rank -> prepare + dispatch + combine (s) of DeepSeek's shape, as the shipped table holds them."""
    with gzip.open(REPO / "profiles" / "ops" / "gb200" / "alltoall_trtllm.csv.gz", "rt") as f:
        return {int(r["tokens"]): (float(r["prepare_us"]) + float(r["dispatch_us"]) + float(r["combine_us"])) * 1e-6
                for r in csv.DictReader(f)
                if (r["method"], r["dtype"], r["hidden"], r["topk"], r["experts"], r["moe_ep"]) ==
                (method, dtype, "7168", "8", "256", str(ep))}


def test_one_sided_exchange_is_the_measured_one_at_a_ranks_tokens():
    """GB200, DeepSeek-V3 NVFP4 at attention dp 32 x ep 32 (TensorRT-LLM's wide-EP decode workers): a pass of 8,192
    tokens is 256 a rank, and the layer's exchange is the measured one-sided dispatch + combine there."""
    m = _model("gb200", 32, "nvlink_one_sided")
    assert m.nvlink is not None
    assert m._combine_s(32 * 256, decode_only=True) == pytest.approx(_measured("one_sided", "nvfp4", 32)[256])


def test_two_sided_takes_the_experts_format_and_its_prepare_step():
    """FP8 experts dispatch FP8 activations; the two-sided kernel's prepare step counts."""
    m = _model("gb200", 16, "nvlink_two_sided", weights="fp8")
    table = _measured("two_sided", "fp8", 16)
    assert m._combine_s(16 * 64, decode_only=True) == pytest.approx(table[64])
    with gzip.open(REPO / "profiles" / "ops" / "gb200" / "alltoall_trtllm.csv.gz", "rt") as f:
        prepare = [float(r["prepare_us"]) for r in csv.DictReader(f) if r["method"] == "two_sided"]
    assert min(prepare) > 0


def test_the_nvlink_exchange_is_far_cheaper_than_gathering_every_ranks_tokens():
    """A decode step of 8,192 sequences on 32 GB200s: the all-to-all moves each token to its experts' GPUs, the
    gathered path all-gathers every rank's tokens to every GPU and reduce-scatters the outputs."""
    nvlink = _model("gb200", 32, "nvlink_one_sided")
    gathered = _model("gb200", 32, "auto", communication="all_reduce")
    n = 8192
    assert nvlink._combine_s(n, True) < gathered._combine_s(n, True) / 5


def test_another_expert_count_of_the_same_hidden_size_and_top_k_takes_the_measured_one():
    """Kimi-K2.5 (7,168 hidden, top-8 of 384 experts): the exchange measured for DeepSeek's 256 experts."""
    kimi = ModelSpec(load_model("kimi-k2.5"))
    assert (kimi.profile.hidden_size, kimi.profile.moe.experts_per_token, kimi.profile.moe.num_experts) == (7168, 8, 384)
    m = _model("gb200", 8, "nvlink_one_sided", model=kimi)
    assert m._combine_s(8 * 128, decode_only=True) == pytest.approx(_measured("one_sided", "nvfp4", 8)[128])


def test_what_the_table_lacks_keeps_nccls_all_to_all_and_says_so(capsys):
    """moe_ep 64 of the one-sided kernel (measured on 2-32 GPUs), and a card with no table: NCCL's all-to-all."""
    assert _model("gb200", 64, "nvlink_one_sided").nvlink is None
    assert "no NVLink one-sided all-to-all of deepseek-v3's shape in nvfp4 at moe_ep 64" in capsys.readouterr().err
    assert _model("b200", 8, "nvlink_one_sided").nvlink is None
    assert "no alltoall_trtllm table" in capsys.readouterr().err
    assert _model("gb200", 32, "nccl").nvlink is None


def test_other_settings_keep_their_paths():
    """`auto` and `nccl` take no NVLink path; `nccl` also turns SGLang's DeepEP path off."""
    assert _model("gb200", 32, "auto").nvlink is None
    cfg = OpsStepTime(tables="gb200", moe_kernels="sglang", moe_routing="balanced", all_to_all="nccl")
    lay = Layout(tp=1, ep=32, attention_dp=32, ep_communication="all_to_all")
    m = build_replica_ops_model(cfg, SPEC, load_hardware("gb200"), lay, "fp8", "fp8", True)
    assert m.deepep is None and m.nvlink is None


def test_a_bad_setting_or_table_is_refused_by_name(tmp_path):
    with pytest.raises(ValidationError, match="all_to_all"):
        OpsStepTime(all_to_all="nvlink")
    bad = tmp_path / "alltoall_trtllm.csv"
    head = "method,dtype,hidden,topk,experts,moe_ep,tokens,prepare_us,dispatch_us,combine_us\n"
    bad.write_text(head + "three_sided,nvfp4,7168,8,256,8,1,0,1,1\n")
    with pytest.raises(ConfigError, match=r"alltoall_trtllm.csv: line 2, column method: expected one of one_sided"):
        NvlinkAlltoallTable(bad)
    bad.write_text(head + "one_sided,nvfp4,7168,8,256,8,0,0,1,1\n")
    with pytest.raises(ConfigError, match=r"line 2, column tokens: expected at least 1"):
        NvlinkAlltoallTable(bad)
