"""The two forms of the linear model's shared-KV feature (LinearStepTime.shared_kv_form): `rereads` (the default:
hit tokens another sequence of the iteration reads too, StepPlan.shared_kv_tokens) and `hits` (every KV token read
in a prefix-cache hit, StepPlan.hit_kv_tokens). The count on hand-built plans and in a simulation (lazy and explicit
decodes alike), the fit recovering a known price in either form and telling them apart, the form recorded in the
profile only when it is `hits`, bad values refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from calibration.engines.tables import shared_kv_tokens, with_hit_keys
from calibration.logs import FitLogConfig, fit_log
from sim.core.simulation import Simulation
from sim.core.step import StepPlan
from sim.io.errors import ConfigError
from sim.io.profiles import LinearStepTime, load_fitted, load_model
from sim.models.step_time import LinearModel
from tests.calibration.test_shared_kv_term import BASE, MODEL, _req, _shared_scenario, _synthetic_shared_replay

REPO = Path(__file__).resolve().parents[2]


def test_a_plan_counts_every_hit_token_read_beside_the_re_reads():
    plan = StepPlan()
    plan.add(_req(0, 700, 512, 512, "A"), 188)   # reads its whole 512-token hit on A
    plan.add(_req(1, 900, 256, 512, "A"), 200)   # reads 256 of it (all re-read)
    plan.add(_req(2, 300, 0, 0), 256)            # no hit
    plan.add(_req(3, 600, 650, 448, "B"), 1)     # a decode past its 448-token hit
    plan.add_decodes(4, 3000, 700, 0, {"C": [1, 320]}, hit_kv_tokens=1100)
    assert plan.hit_kv_tokens == 512 + 256 + 448 + 1100
    assert plan.shared_kv_tokens == 256
    keyless = StepPlan()   # a hit without a key is never a re-read, but it is a hit read
    keyless.add(_req(0, 700, 512, 512), 188)
    keyless.add(_req(1, 700, 512, 512), 188)
    assert (keyless.shared_kv_tokens, keyless.hit_kv_tokens) == (0, 1024)
    rereads = LinearModel(LinearStepTime(**BASE, per_shared_kv_token_s=0.5e-6))
    hits = LinearModel(LinearStepTime(**BASE, per_shared_kv_token_s=0.5e-6, shared_kv_form="hits"))
    without = LinearModel(LinearStepTime(**BASE)).step_s(plan)
    assert rereads.step_s(plan) - without == pytest.approx(-0.8e-6 * plan.shared_kv_tokens, rel=1e-9)
    assert hits.step_s(plan) - without == pytest.approx(-0.8e-6 * plan.hit_kv_tokens, rel=1e-9)


def _run(sc, lazy: bool):
    res = Simulation(sc, ".", lazy_decode=lazy).run()
    return res, pd.DataFrame(res.iterations)


def test_a_simulation_prices_hit_tokens_alike_with_lazy_and_explicit_decodes():
    sc = _shared_scenario(per_shared=0.5e-6)
    lin = sc.step_time.model.model_copy(update={"shared_kv_form": "hits"})
    sc_hits = sc.model_copy(update={"step_time": sc.step_time.model_copy(update={"model": lin})})
    lazy, it_lazy = _run(sc_hits, True)
    explicit, it_explicit = _run(sc_hits, False)
    assert np.allclose(it_lazy.duration_s.to_numpy(), it_explicit.duration_s.to_numpy(), rtol=1e-12, atol=0)
    rereads, _ = _run(_shared_scenario(per_shared=0.5e-6), True)
    plain, _ = _run(_shared_scenario(), True)
    # every hit token is at least a re-read: the same price takes more time off in the hits form
    assert lazy.summary["itl_s"]["median"] < rereads.summary["itl_s"]["median"] < plain.summary["itl_s"]["median"]


def _hit_reads(its: list[dict]) -> list[int]:
    """Per iteration, every hit token read, counted here independently: a request's hits are what it had
    computed when first seen; an item reads min(computed before, hits) of them."""
    first: dict = {}
    out = []
    for it in its:
        s = 0
        for rid, _n, h, _p in it["items"]:
            hit = first.setdefault(rid, h)
            s += min(h, hit)
        out.append(s)
    return out


def _retimed(its: list[dict], true: LinearStepTime, hits: list[int]) -> list[dict]:
    """The same iterations timed with every hit token read at true.per_shared_kv_token_s."""
    out = []
    for it, s in zip(its, hits):
        items = it["items"]
        nt, kv = sum(x[1] for x in items), sum(x[2] for x in items)
        dec = sum(1 for _, n, h, p in items if h >= p)
        pairs = sum(n * h + n * (n + 1) // 2 for _, n, h, _ in items)
        t = (true.constant_s + true.per_new_token_s * nt + true.per_pair_s * pairs + true.per_kv_token_s * (kv - s)
             + true.per_shared_kv_token_s * s + true.per_decode_sequence_s * dec)
        out.append({**{k: v for k, v in it.items() if k != "shared"}, "duration_s": t})
    return out


def test_the_fit_recovers_a_price_per_hit_token_and_tells_the_forms_apart(tmp_path):
    its, prompts = _synthetic_shared_replay(LinearStepTime(**BASE, per_shared_kv_token_s=0.2e-6))
    with_hit_keys(its, {"requests": [{"id": rid, "prompt_token_ids": p} for rid, p in prompts.items()]})
    hits = _hit_reads(its)
    assert shared_kv_tokens(its, "hits") == hits
    assert sum(hits) > sum(shared_kv_tokens(its)) > 10**5
    log = tmp_path / "iterations.jsonl"
    log.write_text("".join(json.dumps(it) + "\n" for it in _retimed(its, LinearStepTime(**BASE, per_shared_kv_token_s=0.4e-6), hits)))
    cfg = dict(log=log, model=load_model(MODEL), fmt="vllm")
    got = fit_log(FitLogConfig(**cfg, out=tmp_path / "h.yaml", shared_kv_form="hits"))
    assert got.profile.linear.per_shared_kv_token_s == pytest.approx(0.4e-6, rel=0.02)
    assert got.profile.linear.per_kv_token_s == pytest.approx(1.3e-6, rel=0.02)
    assert got.report.errors["linear/heldout"].mape < 1e-3
    assert yaml.safe_load((tmp_path / "h.yaml").read_text())["linear"]["shared_kv_form"] == "hits"
    assert load_fitted(tmp_path / "h.yaml").linear.shared_kv_form == "hits"
    # the wrong form cannot fit these times as well
    wrong = fit_log(FitLogConfig(**cfg, out=tmp_path / "r.yaml"))
    assert wrong.report.errors["linear/heldout"].mape > 10 * got.report.errors["linear/heldout"].mape
    assert "shared_kv_form" not in (tmp_path / "r.yaml").read_text()   # rereads, the default, is not written


def test_bad_forms_are_clear_errors(tmp_path):
    data = yaml.safe_load((REPO / "docs" / "validation" / "vllm-run2" / "profile.yaml").read_text())
    data["linear"].update(per_shared_kv_token_s=0.5e-6, shared_kv_form="every")
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ConfigError) as exc:
        load_fitted(path)
    assert str(path) in str(exc.value) and "shared_kv_form" in str(exc.value) and "rereads" in str(exc.value)
    with pytest.raises(ValueError, match="'rereads' or 'hits'"):
        shared_kv_tokens([], "all")
