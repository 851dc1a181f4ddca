"""SGLang's DeepEP path of wide expert parallelism in the ops model (sim.models.deepep)."""

from __future__ import annotations

import csv
import gzip
import math
from pathlib import Path

import pytest

from sim.io.errors import ConfigError
from sim.io.ops_schema import OpsStepTime
from sim.io.profiles import load_hardware, load_model
from sim.models.deepep import DeepEPTable
from sim.models.parallel import Layout
from sim.models.parallel_ops import build_replica_ops_model
from sim.models.spec import ModelSpec

REPO = Path(__file__).resolve().parents[2]
SPEC = ModelSpec(load_model("deepseek-v3"))


def _model(card: str, ep: int, moe_kernels: str = "sglang", communication: str = "all_to_all"):
    cfg = OpsStepTime(tables=card, moe_kernels=moe_kernels, moe_routing="balanced")
    lay = Layout(tp=1, ep=ep, attention_dp=ep, ep_communication=communication)
    return build_replica_ops_model(cfg, SPEC, load_hardware(card), lay, "fp8", "fp8", True)


def _rows(card: str, stem: str) -> list[dict]:
    with gzip.open(REPO / "profiles" / "ops" / card / f"{stem}.csv.gz", "rt") as f:
        return list(csv.DictReader(f))


def _moe_point(card: str, phase: str, ep: int, tokens: int) -> float:
    for r in _rows(card, f"moe_deepep_{phase}"):
        if (r["dtype"], r["routing"], r["hidden"], r["experts"], r["moe_ep"], r["tokens"]) == (
                "fp8_block", "balanced", "7168", "256", str(ep), str(tokens)):
            return float(r["latency_us"]) * 1e-6
    raise AssertionError(f"no {phase} point at ep {ep}, {tokens} tokens")


def test_sglangs_all_to_all_layout_takes_the_measured_deepep_path():
    """GB200, DeepSeek-V3 at attention dp 32 x ep 32 (SGLang's wide-EP decode): the experts from the DeepEP MoE table
    at the pass's tokens, dispatch + combine from the low-latency table at a rank's tokens (decode) and the normal one
    (prompts), each as measured."""
    m = _model("gb200", 32)
    assert m.deepep is not None
    look = m._look
    assert m.deepep.routed_s(1024, True, look) == pytest.approx(_moe_point("gb200", "generation", 32, 1024))
    assert m.deepep.routed_s(4096, False, look) == pytest.approx(_moe_point("gb200", "context", 32, 4096))
    ll = {int(r["tokens"]): float(r["dispatch_us"]) + float(r["combine_us"])
          for r in _rows("gb200", "deepep_ll") if (r["hidden"], r["topk"], r["experts"]) == ("7168", "8", "256")}
    assert m._combine_s(32 * 32, decode_only=True) == pytest.approx(ll[32] * 1e-6)   # 32 tokens a rank
    normal = {int(r["tokens"]): float(r["dispatch_us"]) + float(r["combine_us"])
              for r in _rows("gb200", "deepep_normal") if (r["hidden"], r["topk"], r["experts"]) == ("7168", "8", "256")}
    assert m._combine_s(32 * 1024, decode_only=False) == pytest.approx(normal[1024] * 1e-6)


def test_a_split_between_two_measured_ones_is_interpolated_geometrically():
    """Prompts at moe_ep 8, which the context table does not measure: between moe_ep 4 and 16, w = 1/2."""
    m = _model("gb200", 8)
    a, b = _moe_point("gb200", "context", 4, 8192), _moe_point("gb200", "context", 16, 8192)
    assert m.deepep.routed_s(8192, False, m._look) == pytest.approx(math.sqrt(a * b))
    assert b < m.deepep.routed_s(8192, False, m._look) < a


def test_other_engines_and_layouts_keep_their_paths():
    """vLLM's kernels, or SGLang's gathered tokens (no DeepEP): no DeepEP path."""
    assert _model("gb200", 32, moe_kernels="vllm").deepep is None
    assert _model("gb200", 32, communication="all_reduce").deepep is None


def test_deepep_decodes_wide_ep_faster_than_gathering_every_ranks_tokens():
    """A decode step of 1,024 sequences on 32 GB200s: DeepEP's path is the recipes' and several times faster per MoE
    layer than the fused kernel over all-gathered tokens the replay took before."""
    deepep, gathered = _model("gb200", 32), _model("gb200", 32, communication="all_reduce")
    n = 1024
    fast, slow = (x._moe_ffn_s(n, True, n / 32) for x in (deepep, gathered))
    assert fast < slow / 3


def test_a_bad_deepep_table_names_the_file_and_line(tmp_path):
    bad = tmp_path / "deepep_ll.csv"
    bad.write_text("hidden,topk,experts,tokens,dispatch_us,combine_us\n7168,8,256,0,1,1\n")
    with pytest.raises(ConfigError, match=r"deepep_ll.csv: line 2, column tokens: expected at least 1"):
        DeepEPTable(bad)
