"""Speculative decoding in the simulator: acceptance, rollback, draft sources and their costs."""

import numpy as np
import pytest

from sim.models.speculative import expected_outputs_constant
from tests.sim.helpers import run, scenario

ONE = [{"arrival_s": 0.0, "prompt_tokens": 2048, "output_tokens": 4001}]
FLAT = {"kind": "linear", "constant_s": 0.02626}  # a verify round costs one decode step (reference 8)


def spec(draft, a=0.75, m=4, **kw):
    return {"kind": "continuous", "max_num_seqs": 16, "max_num_batched_tokens": 8192,
            "speculative": {"draft": draft, "num_draft_tokens": m, "acceptance": {"kind": "constant", "a": a}, **kw}}


@pytest.mark.parametrize("a,expected", [(0.25, 1.33), (0.75, 3.05)])
def test_outputs_per_round_match_expectation(a, expected):
    res = run(scenario(scheduler=spec({"kind": "ngram"}, a=a), step_time={"model": FLAT},
                       workload={"kind": "requests", "requests": ONE}))
    rep = res.summary["speculative"]
    assert round(expected_outputs_constant(a, 4), 2) == expected
    # ~1000-3000 rounds: the sampled mean is within a few standard errors of E[N]
    assert rep["mean_acceptance_length"] == pytest.approx(expected_outputs_constant(a, 4), rel=0.04)
    # vLLM-style per-position rates are cumulative: a, a^2, a^3, a^4
    assert rep["per_position_acceptance"] == pytest.approx([a, a**2, a**3, a**4], abs=0.04)
    r = res.requests.iloc[0]
    assert r["output_tokens"] == 4001
    # the round is one decode step: per-token latency ~ 26.26 ms / E[N]
    assert r["tpot_s"] == pytest.approx(0.02626 / expected_outputs_constant(a, 4), rel=0.05)
    # decode throughput counts every accepted token, not rounds
    assert res.summary["decode_throughput_tok_s"] == pytest.approx(expected_outputs_constant(a, 4) / 0.02626, rel=0.05)
    assert res.iterations["output_tokens"].sum() == 4001


def test_rejected_drafts_are_rolled_back_and_counted():
    res = run(scenario(scheduler=spec({"kind": "ngram"}, a=0.6)))
    s, req, its = res.summary, res.requests, res.iterations
    rep = s["speculative"]
    assert s["completed"] == s["requests"]
    stored = (req["prompt_tokens"] + req["output_tokens"] - 1).sum()
    rejected = rep["draft_tokens"] - rep["accepted_tokens"]
    assert its["new_tokens"].sum() == stored + rejected  # verified positions = kept + rolled back


def test_ngram_index_build_is_paid_once():
    base = run(scenario(scheduler=spec({"kind": "ngram"}), step_time={"model": FLAT},
                        workload={"kind": "requests", "requests": ONE}))
    built = run(scenario(scheduler=spec({"kind": "ngram", "index_build_s": 2.0}), step_time={"model": FLAT},
                         workload={"kind": "requests", "requests": ONE}))
    assert built.summary["makespan_s"] - base.summary["makespan_s"] == pytest.approx(2.0)


def test_draft_model_costs_memory_passes_and_prefill():
    plain = run(scenario(step_time={"model": FLAT}))
    drafted = run(scenario(scheduler=spec({"kind": "draft_model", "model": "qwen3-0.6b"}, a=0.7),
                           step_time={"model": FLAT}))
    s = drafted.summary
    assert s["draft_memory_bytes"] > 1e9  # the drafter's weights count against the KV budget
    assert s["kv_capacity_blocks"] < plain.summary["kv_capacity_blocks"]
    assert s["speculative"]["rounds"] > 0


def test_verify_can_be_compute_bound_in_the_efficiency_model():
    """A round verifying many positions costs max(read time, verify FLOPs at the prefill MFU)."""
    table = [{"bytes": 1e9, "time_s": 0.001}, {"bytes": 1e12, "time_s": 0.001}]
    sc = scenario(scheduler=spec({"kind": "parallel", "pass_s": 0.0}, a=1.0, m=15),
                  step_time={"model": {"kind": "efficiency", "decode_table": table, "prefill_mfu": 0.05}},
                  workload={"kind": "requests", "requests": [{"arrival_s": 0, "prompt_tokens": 100, "output_tokens": 33}]})
    its = run(sc).iterations
    decode = its[its["prefill_tokens"] == 0]
    assert (decode["new_tokens"] == 16).all() and (decode["duration_s"] > 0.001).all()


def test_adaptive_length_stops_before_a_graph_jump():
    """Verifying 9 positions jumps to the 16-row graph: adaptive drafting stays at 7 drafts."""
    model = {"kind": "linear", "constant_s": 0.02, "per_new_token_s": 0.002}
    sched = spec({"kind": "parallel", "pass_s": 0.0}, a=0.9, m=15)
    sched["speculative"]["adaptive"] = True
    res = run(scenario(scheduler=sched, step_time={"model": model, "graph_sizes": [1, 2, 4, 8, 16]},
                       workload={"kind": "requests", "requests": ONE}))
    its = res.iterations
    verify = its[(its["prefill_tokens"] == 0) & (its["new_tokens"] > 1)]
    assert verify["new_tokens"].max() <= 8


def test_speculation_is_deterministic():
    a = run(scenario(scheduler=spec({"kind": "ngram"}, a=0.5)))
    b = run(scenario(scheduler=spec({"kind": "ngram"}, a=0.5)))
    assert a.summary == b.summary and a.requests.equals(b.requests)
