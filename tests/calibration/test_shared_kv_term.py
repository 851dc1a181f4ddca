"""The linear model's optional per_shared_kv_token_s: KV tokens of prefix-cache hits that another sequence of
the iteration reads too (StepPlan.shared_kv_tokens: every reader but the first) priced apart from private ones. The feature on hand-built plans and in a
simulation (lazy and explicit decodes alike), the fit recovering a known coefficient from synthetic vLLM
iterations, profiles without the term unchanged, bad values refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from calibration.engines.tables import shared_kv_tokens, with_hit_keys
from calibration.logs import FitLogConfig, fit_log, iteration_observation
from sim.core.request import Request
from sim.core.simulation import Simulation
from sim.core.step import StepPlan
from sim.io.errors import ConfigError
from sim.io.profiles import LinearStepTime, load_fitted, load_model
from sim.models.step_time import LinearModel
from tests.sim.helpers import scenario

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "benchmarks" / "vllm" / "qwen3-0.6b-4l.yaml"
BASE = dict(constant_s=20e-3, per_new_token_s=180e-6, per_pair_s=7e-8, per_kv_token_s=1.3e-6, per_sequence_s=0.0,
            per_decode_sequence_s=350e-6)


def _req(rid: int, prompt: int, computed: int, hits: int, key=None) -> Request:
    r = Request(rid, 0.0, prompt, 8, 0.0)
    r.computed_tokens, r.cached_tokens, r.hit_key = computed, hits, key
    return r


def test_shared_kv_tokens_on_a_hand_built_plan():
    plan = StepPlan()
    plan.add(_req(0, 700, 512, 512, "A"), 188)   # last chunk after a 512-token hit on A: the first reader of A
    plan.add(_req(1, 900, 256, 512, "A"), 200)   # a chunk at 256 of the same hit: re-reads 256 of A
    plan.add(_req(2, 300, 0, 0), 256)            # no hit
    plan.add(_req(3, 600, 650, 448, "B"), 1)     # an explicit decode past its 448-token hit on B: first of B
    plan.add(_req(4, 600, 650, 448, "C"), 1)     # and on C
    assert plan.shared_kv_tokens == 256
    # the decode set: 3 members re-read 1024 hit tokens among themselves; its B group (2 members of 448) also
    # re-reads what the explicit decode read, its D group (1 member) is nobody's re-read
    plan.add_decodes(5, 4000, 700, 1024, {"B": [2, 448], "D": [1, 320]})
    assert plan.kv_tokens_read == 512 + 256 + 650 + 650 + 4000
    assert plan.shared_kv_tokens == 256 + 1024 + 448
    plain = StepPlan()
    plain.add(_req(0, 700, 512, 512), 188)   # a hit without a key (another path's request): never re-read
    plain.add(_req(1, 700, 512, 512), 188)
    assert plain.shared_kv_tokens == 0
    cfg = LinearStepTime(**BASE, per_shared_kv_token_s=0.5e-6)
    without = LinearModel(LinearStepTime(**BASE)).step_s(plan)
    assert LinearModel(cfg).step_s(plan) - without == pytest.approx((0.5e-6 - 1.3e-6) * plan.shared_kv_tokens,
                                                                    rel=1e-9)
    # priced like any KV token: exactly the plan's time without the term
    assert LinearModel(LinearStepTime(**BASE, per_shared_kv_token_s=1.3e-6)).step_s(plan) == without


def _shared_scenario(per_shared=None, **over):
    lin = {"kind": "linear", "constant_s": 0.01, "per_new_token_s": 2e-5, "per_pair_s": 1e-9, "per_kv_token_s": 2e-6}
    if per_shared is not None:
        lin["per_shared_kv_token_s"] = per_shared
    return scenario(step_time={"model": lin}, scheduler={"kind": "vllm_v1", "max_num_seqs": 16,
                                                          "max_num_batched_tokens": 256},
                    kv={"block_tokens": 32, "format": "bf16", "budget": "12GiB", "prefix_caching": True,
                        "admission": "on_demand"},
                    workload__num_requests=60, workload__shared_prefix={"groups": 3, "tokens": 512},
                    workload__prompt_tokens={"kind": "uniform", "low": 32, "high": 128},
                    workload__output_tokens={"kind": "uniform", "low": 8, "high": 48}, **over)


def _plans(sc, lazy: bool) -> tuple[list, object]:
    """Every plan the engine executed (kv read, shared kv, step time) and the result."""
    sim = Simulation(sc, ".", lazy_decode=lazy)
    res = sim.run()
    return res, pd.DataFrame(res.iterations)


def test_a_simulation_counts_hits_alike_with_lazy_and_explicit_decodes_and_prices_them():
    plain, it_plain = _plans(_shared_scenario(), True)
    same, it_same = _plans(_shared_scenario(per_shared=2e-6), True)   # = per_kv_token_s: identical outputs
    for res in (plain, same):  # two scenario texts (the second names the term): the same outputs otherwise
        res.summary["setup"].pop("scenario_sha256")
    assert plain.summary == same.summary and it_plain.equals(it_same)
    cheap, it_cheap = _plans(_shared_scenario(per_shared=0.5e-6), True)
    explicit, it_explicit = _plans(_shared_scenario(per_shared=0.5e-6), False)
    assert plain.summary["prefix_hit_tokens"] > 0
    assert cheap.summary["itl_s"]["median"] < plain.summary["itl_s"]["median"]
    # the decode set's aggregate (lazy) and explicit per-request decodes price the same iterations alike
    assert np.allclose(it_cheap.duration_s.to_numpy(), it_explicit.duration_s.to_numpy(), rtol=1e-12, atol=0)


def test_profile_without_the_term_gives_identical_step_times_and_dumps_unchanged(tmp_path):
    data = yaml.safe_load((REPO / "docs" / "validation" / "vllm-run2" / "profile.yaml").read_text())
    data["linear"].pop("per_shared_kv_token_s", None)
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    prof = load_fitted(path)
    assert prof.linear.per_shared_kv_token_s is None
    assert prof.linear.model_dump(mode="json") == data["linear"]   # no new key in any dump
    plan = StepPlan()
    plan.add(_req(0, 700, 512, 512, "A"), 188)
    plan.add(_req(1, 700, 512, 512, "A"), 188)
    plan.add_decodes(3, 2000, 700, 1024, {"A": [3, 512]})
    assert plan.shared_kv_tokens == 512 + 1024 + 512
    bare = StepPlan()
    bare.add(_req(0, 700, 512, 0), 188)
    bare.add(_req(1, 700, 512, 0), 188)
    bare.add_decodes(3, 2000, 700)
    assert LinearModel(prof.linear).step_s(plan) == LinearModel(prof.linear).step_s(bare)


@pytest.mark.parametrize("value, words", [
    (-1e-6, "greater than or equal to 0"),
    ("cheap", "valid number"),
    (".nan", "finite number"),
])
def test_bad_values_are_clear_errors_naming_file_and_field(tmp_path, value, words):
    text = (REPO / "docs" / "validation" / "vllm-run2" / "profile.yaml").read_text()
    data = yaml.safe_load(text)
    data["linear"]["per_shared_kv_token_s"] = value
    path = tmp_path / "bad.yaml"
    dumped = yaml.safe_dump(data, sort_keys=False)
    if value == ".nan":
        dumped = dumped.replace("'.nan'", ".nan")
    path.write_text(dumped)
    with pytest.raises(ConfigError) as exc:
        load_fitted(path)
    msg = str(exc.value)
    assert str(path) in msg and "per_shared_kv_token_s" in msg and words in msg


def test_a_log_row_with_more_shared_than_cached_tokens_is_refused(tmp_path):
    with pytest.raises(ValueError, match="shared_kv_tokens 600 must lie between 0 and the cached tokens read"):
        iteration_observation(100, 1, 200, 2, 300, 0.05, shared_kv=600)
    log = tmp_path / "it.csv"
    log.write_text("duration_ms,prefill_tokens,prefill_seqs,prefill_cached_tokens,decode_seqs,decode_context_tokens,"
                   "shared_kv_tokens\n40,100,1,200,2,300,100\n41,100,1,200,2,300,600\n")
    with pytest.raises(ValueError, match=r"it\.csv: data row 2: shared_kv_tokens 600"):
        fit_log(FitLogConfig(log=log, model=load_model(MODEL), out=tmp_path / "p.yaml"))


def _synthetic_shared_replay(true: LinearStepTime, seed: int = 0) -> list[dict]:
    """A chunked-prefill replay (256-token budget, decodes first) whose prompts start with one of three
    shared prefixes (the first request of a group computes it, the later ones hit it whole), timed by `true`
    with the hit tokens re-read in an iteration (every reader of a prefix but the first) at per_shared_kv_token_s
    (computed here independently: total hit reads less the most any one reader of a prefix reads)."""
    rng = np.random.default_rng(seed)
    prefixes = (128, 256, 384)
    computed = set()
    active, out, nid, all_reqs = [], [], 0, []
    for _ in range(1500):
        new = []
        if rng.random() < 0.12 and len(active) < 12:
            g = int(rng.integers(0, 3)) if rng.random() < 0.7 else None
            pre = prefixes[g] if g is not None else 0
            hit = pre if g in computed else 0
            active.append({"id": nid, "p": pre + int(rng.integers(16, 300)), "h": hit, "hit": hit,
                           "left": int(rng.integers(4, 30)), "fresh": True, "g": g, "prompt":
                           [1000 + g] * pre + [int(x) for x in rng.integers(0, 999, 300)] if g is not None else
                           [int(x) for x in rng.integers(0, 999, 700)]})
            all_reqs.append(active[-1])
            nid += 1
        items, left, reads = [], 256, {}
        for r in active:
            if r["h"] >= r["p"]:
                items.append([r["id"], 1, r["h"], r["p"]])
                if r["hit"]:
                    reads.setdefault(r["g"], []).append(min(r["h"], r["hit"]))
                left -= 1
        for r in active:
            if r["h"] < r["p"] and left > 0:
                n = min(r["p"] - r["h"], left)
                if r["fresh"]:
                    new.append(r["id"])
                    r["fresh"] = False
                items.append([r["id"], n, r["h"], r["p"]])
                if r["hit"] and r["h"]:
                    reads.setdefault(r["g"], []).append(min(r["h"], r["hit"]))
                left -= n
        if not items:
            continue
        shared = sum(sum(v) - max(v) for v in reads.values())
        nt = sum(x[1] for x in items)
        dec = sum(1 for _, n, h, p in items if h >= p)
        pairs = sum(n * h + n * (n + 1) // 2 for _, n, h, _ in items)
        kv = sum(x[2] for x in items)
        t = (true.constant_s + true.per_new_token_s * nt + true.per_pair_s * pairs
             + true.per_kv_token_s * (kv - shared) + true.per_shared_kv_token_s * shared
             + true.per_decode_sequence_s * dec)
        out.append({"iteration": len(out), "duration_s": t, "items": items, "new": new, "shared": shared})
        by_id = {x[0]: x for x in items}
        for r in active:   # a decode at h = p computes the first sampled token; each decode uses one output
            if r["id"] in by_id:
                r["h"] += by_id[r["id"]][1]
                if r["g"] is not None and r["h"] >= prefixes[r["g"]]:
                    computed.add(r["g"])
                if r["h"] > r["p"]:
                    r["left"] -= 1
        active = [r for r in active if r["left"] > 0]
    return out, {r["id"]: r["prompt"] for r in all_reqs}


def test_fit_recovers_the_shared_kv_cost_from_synthetic_vllm_iterations(tmp_path):
    true = LinearStepTime(**BASE, per_shared_kv_token_s=0.2e-6)
    its, prompts = _synthetic_shared_replay(true)
    spec = {"requests": [{"id": rid, "prompt_token_ids": p} for rid, p in prompts.items()]}
    with_hit_keys(its, spec)
    assert shared_kv_tokens(its) == [it["shared"] for it in its]   # the reader's count is the generator's
    assert sum(it["shared"] for it in its) > 10**5
    log = tmp_path / "iterations.jsonl"
    log.write_text("".join(json.dumps({k: v for k, v in it.items() if k != "shared"}) + "\n" for it in its))
    res = fit_log(FitLogConfig(log=log, model=load_model(MODEL), out=tmp_path / "p.yaml", fmt="vllm"))
    got = res.profile.linear
    assert got.per_shared_kv_token_s == pytest.approx(0.2e-6, rel=0.02)
    assert got.per_kv_token_s == pytest.approx(1.3e-6, rel=0.02)
    assert res.report.errors["linear/heldout"].mape < 1e-3
    # the same records without hit_keys and no spec.json beside them: which hits are one prefix is unknown,
    # nothing counts as re-read, the term is not fitted and the profile has no such key
    bare = tmp_path / "bare" / "iterations.jsonl"
    bare.parent.mkdir()
    bare.write_text("".join(json.dumps({k: v for k, v in it.items() if k not in ("shared", "hit_keys")}) + "\n"
                            for it in its))
    res2 = fit_log(FitLogConfig(log=bare, model=load_model(MODEL), out=tmp_path / "q.yaml", fmt="vllm"))
    assert res2.profile.linear.per_shared_kv_token_s is None
    assert "per_shared_kv_token_s" not in (tmp_path / "q.yaml").read_text()
    # beside the replay's spec.json (the driver's folder), the keys come from its prompts
    (bare.parent / "spec.json").write_text(json.dumps(spec))
    res3 = fit_log(FitLogConfig(log=bare, model=load_model(MODEL), out=tmp_path / "r.yaml", fmt="vllm"))
    assert res3.profile.linear.per_shared_kv_token_s == pytest.approx(0.2e-6, rel=0.02)
