"""Fitting without torch: coefficient recovery, held-out split, isotonic decode table, MFU/MBU arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from calibration import fit as fitmod
from calibration.shapes import Shape, grid_shapes, tiny_model_profile
from sim.models.spec import ModelSpec
from sim.io.profiles import LinearStepTime, load_model

TRUE = LinearStepTime(constant_s=5e-3, per_new_token_s=20e-6, per_pair_s=2e-9, per_kv_token_s=50e-9,
                      per_sequence_s=100e-6, per_decode_sequence_s=300e-6)


def _synthetic(shapes, coef: LinearStepTime, noise: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    model = fitmod.LinearModel(coef)
    obs = []
    for s in shapes:
        o = fitmod.Observation(kind=s.kind, time_s=1.0, key=s.key,
                               **{k: v for k, v in s.features.items() if k in fitmod.Observation.__dataclass_fields__})
        o.time_s = model.step_s(o.plan()) * float(np.exp(rng.normal(0.0, noise)))
        obs.append(o)
    return obs


def test_fit_recovers_known_coefficients_from_noisy_points():
    shapes = grid_shapes("standard", "cuda", load_model("qwen3-8b"))
    obs = _synthetic(shapes, TRUE, noise=0.01)
    roof = fitmod.Roofline(ModelSpec(load_model("qwen3-8b")), "bf16", 500e12, 1.8e12)
    rep = fitmod.fit_observations(obs, roof)
    got, want = rep.linear.model_dump(), TRUE.model_dump()
    for name in ("constant_s", "per_new_token_s", "per_pair_s", "per_kv_token_s", "per_decode_sequence_s"):
        assert got[name] == pytest.approx(want[name], rel=0.05), name
    # per_sequence_s contributes well under 1% of these iterations: only its order of magnitude is identifiable
    assert got["per_sequence_s"] < 5 * want["per_sequence_s"]
    held = rep.errors["linear/heldout"]
    assert held.n == rep.n_heldout == sum(1 for i in range(len(obs)) if i % 4 == 3) or held.n > 15
    assert held.mape < 0.015 and held.max_abs_rel_err < 0.05


def test_fit_is_exact_without_noise_and_keeps_coefficients_non_negative():
    shapes = grid_shapes("quick", "cpu", load_model("qwen2.5-0.5b"))
    obs = _synthetic(shapes, TRUE, noise=0.0)
    lin = fitmod.fit_linear(obs)
    model = fitmod.LinearModel(lin)
    assert max(abs(model.step_s(o.plan()) / o.time_s - 1) for o in obs) < 1e-6
    # a negative true coefficient cannot be represented: the fit clamps it at 0 and stays physical
    neg = TRUE.model_copy(update={"per_sequence_s": -50e-6})
    lin = fitmod.fit_linear(_synthetic(shapes, neg, noise=0.0))
    assert min(lin.model_dump(exclude={"kind"}).values()) >= 0


def test_heldout_split_is_a_quarter_of_each_kind_whatever_the_order():
    kinds = ["prefill"] * 8 + ["decode"] * 12 + ["mixed"] * 4
    obs = [fitmod.Observation(k, 1.0, 1, 1, 0, 1, 0, 0, 0, 0, 0, 1, key=f"{k}:{i}") for i, k in enumerate(kinds)]
    train, test = fitmod.split_heldout(obs)
    assert [sum(o.kind == k for o in test) for k in ("prefill", "decode", "mixed")] == [2, 3, 1]
    assert len(train) + len(test) == len(obs) and not {id(o) for o in train} & {id(o) for o in test}
    # the same points measured in another order give the same held-out set
    _, again = fitmod.split_heldout(list(reversed(obs)))
    assert {o.key for o in again} == {o.key for o in test}
    # a regular grid does not alias: the held-out mixed shapes are not all the same chunk
    shapes = grid_shapes("standard", "cpu", load_model("qwen2.5-0.5b"))
    held = [o for o in fitmod.split_heldout(_synthetic(shapes, TRUE, 0.0))[1] if o.kind == "mixed"]
    assert len({o.key.split("+")[1] for o in held}) > 1


def test_decode_table_is_monotone_and_median_per_byte_count():
    spec = ModelSpec(tiny_model_profile())
    roof = fitmod.Roofline(spec, "bf16", 1e12, 1e11)
    k = spec.kv_bytes_per_token("bf16")
    pts = [(1, 10, 1.0), (1, 10, 1.2), (1, 10, 5.0),   # same bytes: median 1.2
           (2, 10, 1.1),                               # lower than 1.2: pooled with it
           (1, 100, 2.0), (4, 100, 3.0)]
    obs = [fitmod.Observation("decode", t, b, b * (c + 1), b * c, b, b, b * c, 0, 0, 0, c + 1) for b, c, t in pts]
    table = fitmod.fit_decode_table(obs, roof)
    xs = [p.bytes for p in table]
    ys = [p.time_s for p in table]
    assert xs == sorted(xs) and ys == sorted(ys)
    assert xs[0] == roof.weight_read_bytes + 10 * k
    # the 3-point median 1.2 pools with 1.1 (weights 3 and 1): 1.175
    assert ys[:2] == [pytest.approx(1.175), pytest.approx(1.175)]
    assert ys[-2:] == [2.0, 3.0]


def test_isotonic_pools_violators():
    y = np.array([1.0, 3.0, 2.0, 4.0, 0.0])
    out = fitmod._isotonic(y, np.ones(5))
    assert list(out) == pytest.approx([1.0, 2.25, 2.25, 2.25, 2.25])
    assert all(np.diff(out) >= 0)


def test_mfu_mbu_on_a_hand_example():
    """Two-layer tiny model, counted by hand:
    per layer q 64x64 + k, v 2 x 64x32 + o 64x64 = 12,288 and FFN 3 x 64x128 = 24,576 -> 73,728 matrix
    parameters for 2 layers; lm_head 256 x 64 = 16,384; attention 4 x 2 layers x 4 heads x 16 = 512 FLOPs/pair.
    Prefill of 10 tokens: 55 pairs, 1 logit row: F = 2*73,728*10 + 2*16,384 + 512*55 = 1,535,488.
    fp32 bytes read: 73,728 x 4 + (2 x (64 + 2x16 + 64) + 64) norms x 4 + 16,384 x 4 (tied lm_head) = 361,984;
    KV per token 2 x 2 layers x 2 heads x 16 x 4 B = 512 B."""
    spec = ModelSpec(tiny_model_profile())
    roof = fitmod.Roofline(spec, "fp32", 10e9, 1e9)
    pre = fitmod.Observation("prefill", 1e-3, new_tokens=10, pairs=55, kv_tokens_read=0, num_seqs=1, decode_seqs=0,
                             decode_kv_tokens=0, prefill_seqs=1, prefill_tokens=10, prefill_pairs=55, max_context=10)
    assert roof.flops(pre) == 1_535_488
    assert roof.mfu(pre) == pytest.approx(0.1535488)
    assert roof.weight_read_bytes == 361_984 and roof.kv_bytes_per_token == 512
    dec = fitmod.Observation("decode", 2e-3, new_tokens=4, pairs=404, kv_tokens_read=400, num_seqs=4, decode_seqs=4,
                             decode_kv_tokens=400, prefill_seqs=0, prefill_tokens=0, prefill_pairs=0, max_context=101)
    assert roof.bytes_read(dec) == 361_984 + 400 * 512
    assert roof.mbu(dec) == pytest.approx(566_784 / 2e6)


def test_mfu_mbu_reproduce_the_chapter_table():
    """Reference section 4: 94.8 ms for a 2K prompt is 62.2% MFU; decode at 2K: MBU 33% (b=1) .. 65% (b=64)."""
    spec = ModelSpec(load_model("qwen3-8b"))
    roof = fitmod.Roofline(spec, "bf16", 503.8e12, 1792e9)
    s = Shape.parse("1x2048@0")
    o = fitmod.Observation("prefill", 0.0948, **{k: v for k, v in s.features.items()
                                                 if k in fitmod.Observation.__dataclass_fields__})
    assert roof.mfu(o) == pytest.approx(0.622, abs=5e-4)
    for b, ms, want in ((1, 26.26, 0.33), (4, 26.62, 0.34), (16, 27.44, 0.41), (64, 29.63, 0.65)):
        s = Shape.parse(f"{b}x1@2048")
        o = fitmod.Observation("decode", ms / 1e3, **{k: v for k, v in s.features.items()
                                                      if k in fitmod.Observation.__dataclass_fields__})
        assert roof.mbu(o) == pytest.approx(want, abs=0.006)


def test_efficiency_needs_a_peak_and_both_kinds():
    spec = ModelSpec(tiny_model_profile())
    shapes = [Shape.parse(k) for k in ("1x8@0", "1x1@8", "2x1@8")]
    obs = _synthetic(shapes, TRUE, 0.0)
    assert fitmod.fit_efficiency(obs, fitmod.Roofline(spec, "bf16", None, None)) is None
    assert fitmod.fit_efficiency(obs[1:], fitmod.Roofline(spec, "bf16", 1e12, None)) is None
    eff = fitmod.fit_efficiency(obs, fitmod.Roofline(spec, "bf16", 1e12, None))
    assert eff.peak_tflops == 1.0 and len(eff.decode_table) == 2 and eff.prefill_mfu[0].new_tokens == 8


@pytest.mark.parametrize("key", ["prefill:2x16@8", "decode:3x1@32+2x1@4", "mixed:4x1@100+1x64@256"])
def test_observation_plan_has_the_fields_of_a_scheduler_step_plan(key):
    """calibration evaluates sim.models.step_time on the StepPlan of a measured iteration: every field must
    have the value a scheduler would set for the same iteration."""
    import dataclasses

    from sim.core.request import Request
    from sim.core.step import StepPlan

    shape = Shape.parse(key)
    real = StepPlan()
    for g in shape.groups:
        if g.is_decode:
            real.add_decodes(g.count, g.count * g.cached, g.cached + 1)
        else:
            for _ in range(g.count):
                real.add(Request(0, 0.0, g.cached + g.new, 1, 0.0, computed_tokens=g.cached), g.new)
    o = fitmod.Observation(kind=shape.kind, time_s=1.0, **{k: v for k, v in shape.features.items()
                                                           if k in fitmod.Observation.__dataclass_fields__})
    mine = o.plan()
    assert isinstance(mine, StepPlan)
    for f in dataclasses.fields(StepPlan):
        if f.name not in ("items", "spec_items", "lazy_decodes"):
            assert getattr(mine, f.name) == getattr(real, f.name), f.name
    assert [(n, h) for _, n, h in mine.items] == [(n, h) for r, n, h in real.items if r.in_prefill]
