"""The shipped chapter profile is what calibration/chapter_profile.py computes, and it reproduces the
chapter's numbers through the simulator's evaluators (reference sections 4, 5, 9)."""

from __future__ import annotations

import pytest

from calibration import chapter_profile
from calibration import fit as fitmod
from calibration.shapes import Shape
from sim.models.step_time import EfficiencyModel, LinearModel
from sim.models.spec import ModelSpec
from sim.io.profiles import load_fitted, load_model

PATH = chapter_profile.default_path()


@pytest.fixture(scope="module")
def prof():
    return load_fitted(PATH)


@pytest.fixture(scope="module")
def eff(prof):
    spec = ModelSpec(load_model("qwen3-8b"))
    return EfficiencyModel(prof.efficiency, spec, spec.weight_read_bytes("bf16"), spec.kv_bytes_per_token("bf16"),
                           peak_flops_per_s=0.0, allow_extrapolation=False)


def plan(groups):
    """The iteration's StepPlan features (via calibration's look-alike): groups of (count, new, cached)."""
    shape = Shape.of(*groups)
    fields = fitmod.Observation.__dataclass_fields__
    return fitmod.Observation(kind=shape.kind, time_s=1.0,
                              **{k: v for k, v in shape.features.items() if k in fields}).plan()


def test_shipped_file_is_what_the_script_computes(prof):
    assert prof == chapter_profile.build()
    assert prof.model == "qwen3-8b" and prof.hardware == "rtx-pro-6000-bw-ws" and prof.dtype == "bf16"
    assert not prof.cuda_graphs
    assert prof.provenance.source.startswith("reference chapter §4-5, §9")


def test_decode_table_bytes_are_the_chapter_reads(prof):
    gb = [round(p.bytes / 1e9, 2) for p in prof.efficiency.decode_table]
    assert gb == [15.14, 15.44, 16.34, 19.97, 34.46]
    assert [p.time_s for p in prof.efficiency.decode_table[1:]] == [0.02626, 0.02662, 0.02744, 0.02963]


def test_linear_part_reproduces_batch_1_measurements(prof):
    lin = LinearModel(prof.linear)
    assert lin.step_s(plan([(1, 1, 2048)])) * 1e3 == pytest.approx(26.26, abs=0.005)
    assert lin.step_s(plan([(1, 2048, 0)])) * 1e3 == pytest.approx(94.8, abs=0.05)
    # the four-request example's first iteration: r0 and r1 prefill together, 4096 tokens (section 5)
    assert lin.step_s(plan([(2, 2048, 0)])) * 1e3 == pytest.approx(163.33, abs=0.005)


def test_efficiency_part_reproduces_section_9(eff):
    # scheme B: measured prefill (override) and the MFU it implies
    assert eff.prefill_s(plan([(16, 2048, 6144)])) == 2.0405
    assert eff.prefill_s(plan([(1, 2048, 0)])) == 0.0948
    # scheme A: 2137.5 TFLOP at B's measured efficiency -> 7.34 s (2.04 x 2137.5 / 593.7)
    assert eff.prefill_s(plan([(16, 8192, 0)])) == pytest.approx(7.345, abs=0.005)
    # scheme A's decode reads 34.46 GB: the batch-64 column, 29.63 ms
    assert eff.decode_s(plan([(16, 1, 8192)])) == pytest.approx(0.02963, rel=1e-6)
    # scheme C: 25.40 GB interpolated between 19.97 and 34.46 GB -> about 28.26 ms
    spec = ModelSpec(load_model("qwen3-8b"))
    c_kv_tokens = (25.40e9 - spec.weight_read_bytes("bf16")) / spec.kv_bytes_per_token("bf16")
    assert eff.decode_s(plan([(15, 1, 0), (1, 1, round(c_kv_tokens))])) * 1e3 == pytest.approx(28.26, abs=0.01)


def test_mfu_table_matches_the_chapter(prof):
    mfu = {p.new_tokens: p.mfu for p in prof.efficiency.prefill_mfu}
    assert mfu[2048] == pytest.approx(0.622, abs=5e-4)
    assert mfu[131072] == pytest.approx(0.578, abs=5e-4)
    assert mfu[8192] == mfu[32768] == 0.61
