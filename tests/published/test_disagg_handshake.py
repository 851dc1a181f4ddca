"""A replayed disaggregated row's decode handshake (sim.published.handshake): SGLang's prefill waits for the decode
server's pre-allocation, and the engine loops take new requests at the interval of the row's recipe family."""

import dataclasses
from pathlib import Path

import pytest

from sim.io.errors import ConfigError
from sim.published.engines import ENGINES
from sim.published.handshake import RECIPE_RECV_INTERVAL, recipe_recv_interval
from sim.published.predict import build_case
from sim.published.rows import read_published

FIXTURE = Path(__file__).with_name("silicon_sample_disagg_3rows.csv")


def _row(**kw):
    """The fixture's DeepSeek-V3 FP8 row (1 prefill and 4 decode workers, no attention DP) on TP4 / EP4 pools, a
    layout every card's tables time (GB200's NVLink domain of 4 in them)."""
    ds, _ = read_published(FIXTURE)
    four = {p: dataclasses.replace(getattr(ds, p), tp=4, moe_ep=4) for p in ("prefill", "decode")}
    return dataclasses.replace(ds, **{**four, **kw})


def _handshake(row, **kw):
    d = build_case(row, **kw).scenario["disaggregation"]
    return (d.get("decode_preallocation", False), d["prefill"]["scheduler"].get("recv_interval", 1),
            d["decode"]["scheduler"].get("recv_interval", 1))


def test_only_sglang_preallocates_and_only_its_gb_recipes_take_requests_every_tenth_pass():
    assert ENGINES["sglang"].disagg_handshake == "recipes"
    assert ENGINES["trtllm"].disagg_handshake == ENGINES["vllm"].disagg_handshake == "none"
    assert _handshake(_row(backend="sglang", precision="fp4")) == (True, 1, 1)   # B200: no recipe sets one
    assert _handshake(_row(backend="sglang", system="gb200")) == (True, 10, 10)
    assert _handshake(_row(backend="sglang", system="gb300")) == (True, 10, 1)   # GB300 FP8: decode left at 1
    assert _handshake(_row(backend="sglang", system="gb300", precision="fp4")) == (True, 10, 10)
    for backend in ("trtllm", "vllm"):
        assert _handshake(_row(backend=backend, system="gb200")) == (False, 1, 1)


def test_attention_dp_in_either_pool_takes_every_pass():
    ds = _row(backend="sglang", system="gb200")
    for pool in ("prefill", "decode"):
        shape = dataclasses.replace(getattr(ds, pool), attention_dp=4)
        assert recipe_recv_interval(dataclasses.replace(ds, **{pool: shape})) == (1, 1)
    assert recipe_recv_interval(ds) == RECIPE_RECV_INTERVAL[("sglang", "gb200", "fp8")]


@pytest.mark.parametrize("handshake, sglang, trtllm", [("none", (False, 1, 1), (False, 1, 1)),
                                                       ("preallocate", (True, 1, 1), (True, 1, 1)),
                                                       ("recipes", (True, 10, 10), (True, 1, 1))])
def test_the_handshake_is_asked_for_every_row(handshake, sglang, trtllm):
    """One value for every row; `recipes` gives each row its own engine's recipe interval (none for TensorRT-LLM)."""
    assert _handshake(_row(backend="sglang", system="gb200"), handshake=handshake) == sglang
    assert _handshake(_row(backend="trtllm", system="gb200"), handshake=handshake) == trtllm


def test_an_unknown_handshake_is_refused_by_name_and_agg_rows_are_untouched():
    with pytest.raises(ConfigError, match="handshake: expected one of engine, none, preallocate, recipes, got 'x'"):
        build_case(_row(), handshake="x")
    agg = dataclasses.replace(_row(backend="sglang", system="gb200"), mode="agg", tp=8)
    sc = build_case(agg, handshake="recipes").scenario
    assert sc is None or "disaggregation" not in sc and sc["scheduler"].get("recv_interval", 1) == 1


def test_the_handshake_reaches_the_report_and_the_command_line(tmp_path):
    from capsim.cli import main
    from sim.published.report import validate_published
    report = validate_published(FIXTURE, mode="disagg", per_user=2, handshake="none", client="fixed")
    assert report["handshake"] == "none"
    assert "decode handshake: recipes" in report["engines"]["sglang"]
    with pytest.raises(SystemExit):
        main(["validate-published", str(FIXTURE), "--handshake", "always"])
