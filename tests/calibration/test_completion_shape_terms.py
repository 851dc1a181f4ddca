"""The linear model's optional terms: per prompt completed (per_prefill_completion_s) and an engine's
kernel shape cache (shape_cache). A hand-computed plan, the fit recovering known coefficients from
synthetic vLLM iterations, profiles without the terms unchanged, bad values refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from calibration import fit as fitmod
from calibration.engines.tables import prefill_completions
from calibration.logs import FitLogConfig, fit_log
from sim.core.engine import ModelledExecutor
from sim.core.request import Request
from sim.core.step import StepPlan
from sim.io.errors import ConfigError
from sim.io.profiles import LinearStepTime, ValidRange, load_fitted, load_model
from sim.models.step_time import KeptShapes, LinearModel, RangeChecked, shape_cache_of

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "benchmarks" / "vllm" / "qwen3-0.6b-4l.yaml"
BASE = dict(constant_s=20e-3, per_new_token_s=180e-6, per_pair_s=7e-8, per_kv_token_s=1.3e-6, per_sequence_s=0.0,
            per_decode_sequence_s=350e-6)


def _req(rid: int, prompt: int, computed: int) -> Request:
    r = Request(rid, 0.0, prompt, 8, 0.0)
    r.computed_tokens = computed
    return r


def test_completion_term_in_a_hand_computed_plan():
    plan = StepPlan()
    plan.add(_req(0, 300, 256), 44)     # last chunk: completes its prompt
    plan.add(_req(1, 500, 0), 200)      # first chunk of a longer prompt: does not complete
    plan.add_decodes(3, 900, 400)       # three decodes, 900 cached tokens in all
    assert plan.prefill_logits == 1 and plan.prefill_seqs == 2 and plan.decode_seqs == 3
    cfg = LinearStepTime(**BASE, per_prefill_completion_s=6e-3)
    new, kv = 44 + 200 + 3, 256 + 900
    pairs = (44 * 256 + 44 * 45 // 2) + (200 * 201 // 2) + (900 + 3)
    want = 20e-3 + 180e-6 * new + 7e-8 * pairs + 1.3e-6 * kv + 350e-6 * 3 + 6e-3 * 1
    assert LinearModel(cfg).step_s(plan) == pytest.approx(want, rel=1e-12)
    without = LinearModel(LinearStepTime(**BASE)).step_s(plan)
    assert LinearModel(cfg).step_s(plan) - without == pytest.approx(6e-3, rel=1e-9)
    # the prefill part (chunked-prefill budgeting) carries it too; decodes never do
    assert LinearModel(cfg).prefill_part_s(plan) - LinearModel(LinearStepTime(**BASE)).prefill_part_s(plan) == \
        pytest.approx(6e-3, rel=1e-9)
    dec = StepPlan()
    dec.add_decodes(4, 1000, 300)
    assert LinearModel(cfg).step_s(dec) == LinearModel(LinearStepTime(**BASE)).step_s(dec)


def test_shape_cache_charges_a_token_count_not_kept_least_recently_used_first():
    cfg = LinearStepTime(**BASE, shape_cache={"entries": 2, "miss_s": 1e-3, "per_miss_token_s": 1e-5})
    valid = ValidRange(max_batch=64, max_new_tokens=1024, max_context_tokens=10**5)
    ex = ModelledExecutor(RangeChecked(LinearModel(cfg), valid, "p", True))   # found inside wrappers
    assert shape_cache_of(ex.step_time) is cfg.shape_cache

    def plan(tokens):
        p = StepPlan()
        p.add_decodes(tokens, 100 * tokens, 101)
        return p

    base = LinearModel(LinearStepTime(**BASE))
    extra = [ex.execute(plan(n), 0.0) - base.step_s(plan(n)) for n in (4, 4, 5, 4, 6, 5, 4)]
    miss = [pytest.approx(1e-3 + 1e-5 * n, rel=1e-9) for n in (4, 5, 6, 4)]
    # 4 miss, 4 kept, 5 miss, 4 kept (most recent), 6 miss (evicts 5), 5 miss (evicts 4), 4 miss
    assert extra == [miss[0], pytest.approx(0.0, abs=1e-15), miss[1], pytest.approx(0.0, abs=1e-15), miss[2],
                     miss[1], miss[3]]
    # step_s itself stays pure (a warm cache): probes of made-up plans leave the cache alone
    before = list(ex.shapes.kept)
    LinearModel(cfg).step_s(plan(9))
    assert list(ex.shapes.kept) == before


def test_profile_without_the_terms_loads_and_dumps_unchanged(tmp_path):
    text = (REPO / "docs" / "validation" / "vllm" / "profile.yaml").read_text()
    data = yaml.safe_load(text)
    data["linear"].pop("per_prefill_completion_s", None)
    data["linear"].pop("shape_cache", None)
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    prof = load_fitted(path)
    assert prof.linear.per_prefill_completion_s == 0.0 and prof.linear.shape_cache is None
    assert prof.linear.model_dump(mode="json") == data["linear"]   # no new keys in any dump
    assert shape_cache_of(LinearModel(prof.linear)) is None and ModelledExecutor(LinearModel(prof.linear)).shapes is None


@pytest.mark.parametrize("field, value, words", [
    ("per_prefill_completion_s", -1e-3, "greater than or equal to 0"),
    ("per_prefill_completion_s", "fast", "valid number"),
    ("shape_cache", {"entries": 0, "miss_s": 1e-3}, "greater than 0"),
    ("shape_cache", {"entries": 32, "miss_s": -1.0}, "greater than or equal to 0"),
    ("shape_cache", {"entries": 32, "misses": 1.0}, "misses"),
])
def test_bad_values_are_clear_errors_naming_file_and_field(tmp_path, field, value, words):
    data = yaml.safe_load((REPO / "docs" / "validation" / "vllm" / "profile.yaml").read_text())
    data["linear"][field] = value
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ConfigError) as exc:
        load_fitted(path)
    msg = str(exc.value)
    assert str(path) in msg and field in msg and words in msg


def _synthetic_replay(true: LinearStepTime, entries: int, seed: int = 0) -> list[dict]:
    """A chunked-prefill replay (256-token budget, decodes first) of random prompts, timed by `true`
    plus its shape cache computed here independently (a plain list as the LRU)."""
    rng = np.random.default_rng(seed)
    sc = true.shape_cache
    active, kept, out, nid = [], [], [], 0
    for i in range(1500):
        new = []
        if rng.random() < 0.12 and len(active) < 12:
            active.append({"id": nid, "p": int(rng.integers(16, 700)), "h": 0, "left": int(rng.integers(4, 30))})
            nid += 1
        items, left = [], 256
        for r in active:
            if r["h"] >= r["p"]:
                items.append([r["id"], 1, r["h"], r["p"]])
                left -= 1
        for r in active:
            if r["h"] < r["p"] and left > 0:
                n = min(r["p"] - r["h"], left)
                if r["h"] == 0:
                    new.append(r["id"])
                items.append([r["id"], n, r["h"], r["p"]])
                left -= n
        if not items:
            continue
        nt = sum(x[1] for x in items)
        done = sum(1 for _, n, h, p in items if h < p and h + n >= p)
        dec = sum(1 for _, n, h, p in items if h >= p)
        pairs = sum(n * h + n * (n + 1) // 2 for _, n, h, _ in items)
        t = (true.constant_s + true.per_new_token_s * nt + true.per_pair_s * pairs
             + true.per_kv_token_s * sum(x[2] for x in items) + true.per_sequence_s * len(items)
             + true.per_decode_sequence_s * dec + true.per_prefill_completion_s * done)
        if nt in kept:
            kept.remove(nt)
        else:
            t += sc.miss_s + sc.per_miss_token_s * nt
            if len(kept) == entries:
                kept.pop(0)
        kept.append(nt)
        out.append({"iteration": len(out), "duration_s": t, "items": items, "new": new})
        by_id = {x[0]: x for x in items}
        for r in active:   # a decode at h = p computes the first sampled token; each decode uses one output
            if r["id"] in by_id:
                r["h"] += by_id[r["id"]][1]
                if r["h"] > r["p"]:
                    r["left"] -= 1
        active = [r for r in active if r["left"] > 0]
    return out


def test_fit_recovers_completion_and_shape_cache_terms_from_synthetic_vllm_iterations(tmp_path):
    true = LinearStepTime(**BASE, per_prefill_completion_s=6e-3,
                          shape_cache={"entries": 8, "miss_s": 1.5e-3, "per_miss_token_s": 75e-6})
    its = _synthetic_replay(true, 8)
    assert sum(prefill_completions(its)) > 50
    log = tmp_path / "iterations.jsonl"
    log.write_text("".join(json.dumps(it) + "\n" for it in its))
    res = fit_log(FitLogConfig(log=log, model=load_model(MODEL), out=tmp_path / "p.yaml", fmt="vllm",
                               shape_cache_entries=8))
    got = res.profile.linear
    assert got.per_prefill_completion_s == pytest.approx(6e-3, rel=0.02)
    assert got.shape_cache.entries == 8
    assert got.shape_cache.miss_s == pytest.approx(1.5e-3, rel=0.05)
    assert got.shape_cache.per_miss_token_s == pytest.approx(75e-6, rel=0.02)
    assert got.per_new_token_s == pytest.approx(180e-6, rel=0.02)
    assert res.report.errors["linear/heldout"].mape < 1e-3
    # without --shape-cache the miss terms are not fitted; the completion term still is
    res2 = fit_log(FitLogConfig(log=log, model=load_model(MODEL), out=tmp_path / "q.yaml", fmt="vllm"))
    assert res2.profile.linear.shape_cache is None and res2.profile.linear.per_prefill_completion_s > 0
    # --shape-cache needs the vllm format (the order the iterations ran in)
    lines = tmp_path / "engine.log"
    lines.write_text("".join(f"Iteration({i}): 1 context requests, 100 context tokens, 2 generation requests, "
                             f"2 generation tokens, iteration elapsed time: {40 + i % 7} ms\n" for i in range(20)))
    with pytest.raises(ValueError, match="only the `vllm` format"):
        fit_log(FitLogConfig(log=lines, model=load_model(MODEL), out=tmp_path / "r.yaml", fmt="vllm-log",
                             shape_cache_entries=8))


def test_fit_leaves_the_completion_term_at_zero_when_every_prefill_completes():
    """A torch calibration grid: each prefill point ends its prompt, so completions = sequences - decodes."""
    true = LinearStepTime(**{**BASE, "per_sequence_s": 200e-6})
    model = LinearModel(true)
    obs = []
    for n in (16, 64, 128, 256, 512):
        for b in (1, 2, 4):
            o = fitmod.Observation(kind="prefill", time_s=1.0, new_tokens=b * n, pairs=b * n * (n + 1) // 2,
                                   kv_tokens_read=0, num_seqs=b, decode_seqs=0, decode_kv_tokens=0, prefill_seqs=b,
                                   prefill_tokens=b * n, prefill_pairs=b * n * (n + 1) // 2, max_context=n)
            o.time_s = model.step_s(o.plan())
            obs.append(o)
    for b in (1, 4, 16, 32):
        for c in (128, 1024):
            o = fitmod.Observation(kind="decode", time_s=1.0, new_tokens=b, pairs=b * (c + 1), kv_tokens_read=b * c,
                                   num_seqs=b, decode_seqs=b, decode_kv_tokens=b * c, prefill_seqs=0, prefill_tokens=0,
                                   prefill_pairs=0, max_context=c + 1)
            o.time_s = model.step_s(o.plan())
            obs.append(o)
    lin = fitmod.fit_linear(obs, shape_entries=32)
    assert lin.per_prefill_completion_s == 0.0 and lin.shape_cache is None
    assert lin.per_sequence_s == pytest.approx(200e-6, rel=1e-3)


def test_kept_shapes_is_an_lru_of_token_counts():
    ks = KeptShapes(LinearStepTime(**BASE, shape_cache={"entries": 3, "miss_s": 1.0}).shape_cache)
    p = StepPlan()
    for n, want in ((1, 1.0), (2, 1.0), (3, 1.0), (1, 0.0), (4, 1.0), (2, 1.0), (1, 0.0), (3, 1.0)):
        p.new_tokens = n
        assert ks.miss_s(p) == want, n
    assert list(ks.kept) == [2, 1, 3]


def test_each_replica_keeps_its_own_shapes_in_a_simulation():
    """Two replicas: each one's first iteration of a token count pays the miss (one executor per replica)."""
    import pandas as pd

    from tests.sim.helpers import run, scenario

    lin = {"kind": "linear", "constant_s": 0.01, "per_new_token_s": 1e-5, "per_pair_s": 0.0}
    common = dict(cluster={"replicas": 2}, workload__num_requests=8,
                  workload__arrival={"kind": "all_at_once"}, workload__prompt_tokens={"kind": "fixed", "value": 64},
                  workload__output_tokens={"kind": "fixed", "value": 4})
    plain = pd.DataFrame(run(scenario(step_time={"model": lin}, **common)).iterations)
    cached = pd.DataFrame(run(scenario(step_time={"model": {**lin, "shape_cache": {"entries": 8, "miss_s": 0.5}}},
                                       **common)).iterations)
    assert len(plain) == len(cached) and set(plain.replica) == {0, 1}
    extra = cached.duration_s.to_numpy() - plain.duration_s.to_numpy()
    for rep in (0, 1):
        mine = cached.replica.to_numpy() == rep
        first = ~pd.Series(cached.new_tokens[mine]).duplicated().to_numpy()   # a token count's first iteration
        assert np.allclose(extra[mine][first], 0.5) and np.allclose(extra[mine][~first], 0.0)
