"""sim.models.speculative: exactness of the accept/resample rule, E[N] against Monte Carlo, draft length.

The chapter's section-8 numbers (and scheme D's speculative pieces in section 9) are goldens in
tests/golden/reference.yaml, checked through sim.models.speculative by tests/chapter8/test_reference.py;
`test_section_8_goldens_are_registered` below makes sure they stay there. This file checks the
properties those closed forms rest on. Every random test has a fixed seed; tolerances are 5 sigma
or a chi-square p-value above 1e-3, so a failure means a real bias, not bad luck.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy.stats import chisquare

from sim.models import speculative as sp
from sim.planning import valuation as va

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "reference.yaml"


def _draw(q: np.ndarray, rng: np.random.Generator, size: int) -> np.ndarray:
    """`size` tokens from distribution q (vectorised inverse CDF)."""
    return np.minimum(np.searchsorted(np.cumsum(q), rng.random(size), side="right"), q.size - 1)


def _counts(values, num_cells: int) -> np.ndarray:
    return np.bincount(np.asarray(values), minlength=num_cells)


def _fits(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square p-value of observed counts against probabilities (cells with p = 0 must be empty)."""
    probs = np.asarray(probs, dtype=float)
    assert counts[probs == 0].sum() == 0, "a token with zero target probability was emitted"
    keep = probs > 0
    return chisquare(counts[keep], counts.sum() * probs[keep] / probs[keep].sum()).pvalue


# ---------------------------------------------------------------------------------------------
# Exact speculative sampling: the output is distributed as the target


@pytest.mark.parametrize("draft, accepted", [(0, 0.25), (1, 0.75)], ids=["always-A", "always-B"])
def test_two_symbol_example(draft, accepted):
    """Reference §8: p(A) = 1/4, p(B) = 3/4; a draft that always says A is accepted with 1/4, one
    that always says B with 3/4; either way the emitted token is distributed as p."""
    p = np.array([[0.25, 0.75], [0.25, 0.75]])          # position 1, then the bonus position
    q = np.eye(2)[[draft]]                               # the drafter is certain
    assert sp.acceptance_rate(p[0], q[0]) == accepted
    rng = np.random.default_rng(8)
    n = 40_000
    rounds = [sp.verify_round(p, q, np.array([draft]), rng) for _ in range(n)]
    rate = np.mean([len(r) == 2 for r in rounds])
    assert abs(rate - accepted) < 5 * math.sqrt(accepted * (1 - accepted) / n)
    first = _counts([r[0] for r in rounds], 2)
    assert _fits(first, p[0]) > 1e-3
    # rejection of A can only resample B, and vice versa: max(p - q, 0) has one non-zero cell
    assert all(r[0] == draft for r in rounds if len(r) == 2)


def test_random_five_symbol_output_matches_target():
    """A random 5-symbol target and draft: 200k single-draft rounds, first token ~ p (chi-square)."""
    rng = np.random.default_rng(20240508)
    p = rng.dirichlet(np.ones(5))
    q = rng.dirichlet(np.ones(5))
    n = 200_000
    drafts = _draw(q, rng, n)
    target = np.stack([p, p])
    first = _counts([sp.verify_round(target, q[None, :], drafts[i:i + 1], rng)[0] for i in range(n)], 5)
    assert _fits(first, p) > 1e-3
    # the test has power: the draft's own distribution is rejected by the same check
    assert _fits(first, q) < 1e-6


def test_token_stream_is_distributed_as_target_across_rounds():
    """A Markov target P[prev] and a Markov drafter Q[prev], three drafts per round: the first two
    tokens of the stream (from one round or two) follow P. The target rows of later positions are
    conditioned on the drafts before them, so a verifier that kept checking drafts after a
    rejection (or resampled from p instead of max(p - q, 0)) fails this joint."""
    rng = np.random.default_rng(7)
    P = rng.dirichlet(np.ones(4), size=4)
    Q = rng.dirichlet(np.ones(4), size=4)
    pairs = []
    for _ in range(25_000):
        stream: list[int] = []
        while len(stream) < 2:
            context = [stream[-1] if stream else 0]           # the token before the round
            for _ in range(3):
                context.append(int(_draw(Q[context[-1]], rng, 1)[0]))
            stream += sp.verify_round(P[context], Q[context[:3]], np.array(context[1:]), rng)
        pairs.append(4 * stream[0] + stream[1])
    assert _fits(_counts(pairs, 16), (P[0][:, None] * P).ravel()) > 1e-3


def test_exact_verifier_accepts_as_the_simulator_samples():
    """Accepted drafts per round from the exact rule follow outputs_distribution with
    a_j = sum_x min(p, q_j): the simulator's acceptance model is the verifier's, in distribution."""
    rng = np.random.default_rng(11)
    p = rng.dirichlet(np.ones(6))
    q = rng.dirichlet(np.ones(6), size=3)
    a = [sp.acceptance_rate(p, q[j]) for j in range(3)]
    target = np.tile(p, (4, 1))
    n = 50_000
    drafts = np.stack([_draw(q[j], rng, n) for j in range(3)], axis=1)
    accepted = [len(sp.verify_round(target, q, drafts[i], rng)) - 1 for i in range(n)]
    assert _fits(_counts(accepted, 4), sp.outputs_distribution(a)) > 1e-3


def test_one_hot_target_makes_sampling_greedy():
    """With a deterministic target the sampling rule keeps exactly the greedy prefix."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        m = int(rng.integers(0, 5))
        p = np.eye(4)[rng.integers(0, 4, m + 1)]
        q = rng.dirichlet(np.ones(4), size=m)
        drafts = np.array([_draw(q[j], rng, 1)[0] for j in range(m)], dtype=np.int64)
        assert sp.verify_round(p, q, drafts, rng) == sp.verify_round_greedy(p, drafts)


def test_greedy_keeps_drafts_up_to_the_first_mismatch():
    logits = np.array([[0.1, 2.0, 0.0],      # target says 1
                       [3.0, 0.0, 0.0],      # target says 0
                       [0.0, 0.0, 1.0],      # target says 2
                       [0.0, 5.0, 0.0]])     # bonus: 1
    assert sp.verify_round_greedy(logits, np.array([1, 0, 2])) == [1, 0, 2, 1]   # all match: m + 1 tokens
    assert sp.verify_round_greedy(logits, np.array([1, 2, 2])) == [1, 0]         # later drafts dropped
    assert sp.verify_round_greedy(logits, np.array([0, 0, 2])) == [1]            # one token at worst
    assert sp.verify_round_greedy(logits[:1], np.array([], dtype=np.int64)) == [1]


def test_verify_round_rejects_mismatched_shapes():
    p = np.full((3, 4), 0.25)
    with pytest.raises(ValueError, match=r"p_target must have shape \(m \+ 1, V\) = \(2, V\) for 1 drafts"):
        sp.verify_round(p, np.full((1, 4), 0.25), np.array([0]), np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"drafts must be token ids in \[0, 4\), got \[4, 0\]"):
        sp.verify_round(p, np.full((2, 4), 0.25), np.array([4, 0]), np.random.default_rng(0))
    with pytest.raises(ValueError, match="p_target must hold probabilities summing to 1"):
        sp.verify_round(p * 2, np.full((2, 4), 0.25), np.array([0, 0]), np.random.default_rng(0))


# ---------------------------------------------------------------------------------------------
# E[N] = 1 + sum_j prod_{i<=j} a_i against Monte Carlo rounds


def _mean_within(samples: np.ndarray, expected: float) -> None:
    sigma = samples.std() / math.sqrt(samples.size)
    assert abs(samples.mean() - expected) < 5 * sigma, (samples.mean(), expected, sigma)


def test_expected_outputs_matches_monte_carlo_rounds():
    a = [0.9, 0.7, 0.5, 0.3]
    k = sp.sample_accepted(a, np.random.default_rng(1), size=200_000)
    _mean_within(k + 1, sp.expected_outputs_per_round(a))
    assert _fits(_counts(k, 5), sp.outputs_distribution(a)) > 1e-3


def test_per_round_rows_match_their_own_expectations():
    """2-D acceptance: one row per round (per request), shorter drafts padded with zeros."""
    rows = np.array([[0.9, 0.9, 0.9, 0.9], [0.6, 0.4, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]])
    reps = 60_000
    k = sp.sample_accepted(np.repeat(rows, reps, axis=0), np.random.default_rng(2)).reshape(3, reps)
    for row, ks in zip(rows, k):
        _mean_within(ks + 1, sp.expected_outputs_per_round(row))
    assert k[1].max() <= 2, "a zero-padded position was accepted"


def test_constant_helper_and_valuation_agree():
    for a in (0.0, 0.25, 0.5, 0.75, 1.0):
        for m in range(0, 9):
            e = sp.expected_outputs_per_round([a] * m)
            assert sp.expected_outputs_constant(a, m) == pytest.approx(e, rel=1e-12)
            assert va.expected_outputs_per_round([a] * m) == pytest.approx(e, rel=1e-12)
            assert 1 <= e <= m + 1
            assert sp.outputs_distribution([a] * m).sum() == pytest.approx(1.0)


def test_vllm_rates_are_cumulative_and_convert_to_conditional():
    """vLLM logs accepted-at-position / drafts, i.e. a_1 ... a_j; its mean acceptance length
    1 + accepted / drafts is then 1 + sum of those rates."""
    a = np.array([0.8, 0.6, 0.5])
    rates = sp.rates_from_conditional(a)
    np.testing.assert_allclose(rates, [0.8, 0.48, 0.24])
    np.testing.assert_allclose(sp.conditional_from_rates(rates), a)
    assert sp.expected_outputs_per_round(a) == pytest.approx(1 + rates.sum())
    np.testing.assert_allclose(sp.conditional_from_rates([0.5, 0.0, 0.0]), [0.5, 0.0, 0.0])
    with pytest.raises(ValueError, match=r"rate\[1\] = 0.7 > rate\[0\] = 0.5"):
        sp.conditional_from_rates([0.5, 0.7])


def test_histogram_round_trips_to_its_own_distribution():
    counts = [10, 20, 30, 40]
    a = sp.conditional_from_histogram(counts)
    np.testing.assert_allclose(sp.outputs_distribution(a), np.array(counts) / 100)
    np.testing.assert_allclose(sp.conditional_from_histogram([5, 0, 0]), [0.0, 0.0])


@pytest.mark.parametrize("model", [
    sp.AcceptanceModel.constant(0.75, 4),
    sp.AcceptanceModel.per_position([0.95, 0.8, 0.6, 0.5, 0.4]),
    sp.AcceptanceModel.from_vllm_rates([0.9, 0.72, 0.5]),
    sp.AcceptanceModel.histogram([120, 80, 60, 40, 200]),
    sp.AcceptanceModel.beta(3.0, 1.5, 6),
], ids=lambda m: m.kind)
def test_acceptance_model_samples_its_expectation(model):
    rng = np.random.default_rng(5)
    k = model.sample_accepted(rng, 200_000)
    _mean_within(k + 1, model.expected_outputs_per_round())
    assert _fits(_counts(k, model.num_drafts + 1), model.outputs_distribution()) > 1e-3
    # the scheduler's path: draw each request's rates once, then one round per request
    rows = model.draw(rng, 100_000)
    assert rows.shape == (100_000, model.num_drafts)
    _mean_within(sp.sample_accepted(rows, rng) + 1, model.expected_outputs_per_round())
    # a shorter draft is the truncated model
    short = model.outputs_distribution(2)
    assert short.shape == (3,) and short.sum() == pytest.approx(1.0)
    assert model.expected_outputs_per_round(0) == 1.0


def test_beta_model_differs_from_its_mean_rate():
    """Requests that differ in a: E over requests of 1 + a + ... + a^m exceeds the constant model at
    the mean a (Jensen), so a per-request model is not a constant one in disguise."""
    beta = sp.AcceptanceModel.beta(2.0, 2.0, 6)
    assert beta.expected_outputs_per_round() > sp.expected_outputs_constant(0.5, 6) + 0.1


def test_sampling_is_seeded_by_the_generator_alone():
    m = sp.AcceptanceModel.beta(2.0, 1.0, 4)
    one = sp.sample_accepted(m.draw(np.random.default_rng(9), 1000), np.random.default_rng(10))
    two = sp.sample_accepted(m.draw(np.random.default_rng(9), 1000), np.random.default_rng(10))
    np.testing.assert_array_equal(one, two)


def test_acceptance_inputs_name_the_bad_value():
    with pytest.raises(ValueError, match=r"acceptance_per_position\[2\] = 1.2 is not a probability"):
        sp.sample_accepted([0.5, 0.5, 1.2], np.random.default_rng(0), 10)
    with pytest.raises(ValueError, match=r"size \(3\) must equal the rows of a 2-D acceptance \(2\)"):
        sp.sample_accepted(np.full((2, 3), 0.5), np.random.default_rng(0), 3)
    with pytest.raises(ValueError, match="kind per_position: acceptance has 2 positions but num_drafts is 3"):
        sp.AcceptanceModel("per_position", 3, (0.5, 0.5))
    with pytest.raises(ValueError, match=r"num_drafts must be in \[0, 4\] for this model, got 5"):
        sp.AcceptanceModel.constant(0.5, 4).expected_outputs_per_round(5)
    with pytest.raises(ValueError, match=r"kind beta needs beta_params \(alpha, beta\) both > 0"):
        sp.AcceptanceModel.beta(0.0, 1.0, 3)


# ---------------------------------------------------------------------------------------------
# Per-token times and the draft-length rule


def test_mean_per_token_latency_weights_by_tokens():
    """Reference §8's example as an invariant: the weighted mean is total time / total tokens."""
    rng = np.random.default_rng(4)
    t = rng.uniform(0.001, 0.03, 50)
    n = rng.integers(1, 6, 50)
    assert sp.per_token_latency_s(t, n) == pytest.approx(t.sum() / n.sum())
    assert sp.per_token_latency_s(0.03, 3) == pytest.approx(0.01)
    with pytest.raises(ValueError, match="outputs_per_round must be > 0"):
        sp.per_token_latency_s([0.1, 0.1], [1, 0])


def test_index_recovery_never_pays_without_a_speedup():
    assert sp.index_recovery_tokens(2.0, 0.02, 0.02) == math.inf
    assert sp.index_recovery_tokens(1.0, 0.02, 0.01) == 100


def test_draft_budget_is_where_speculation_breaks_even():
    """Drafting exactly the budget gives the plain per-token time; a little less beats it."""
    step, e = 0.02626, sp.expected_outputs_per_round([0.75] * 4)
    budget = sp.draft_time_budget_s(e, step)
    assert sp.per_token_latency_s(sp.speculative_round_s(step, budget), e) == pytest.approx(step)
    assert sp.per_token_latency_s(sp.speculative_round_s(step, 0.99 * budget), e) < step


def test_should_lengthen_is_the_marginal_rule():
    assert sp.should_lengthen(0.0, 0.5, 0.026, 2.0)                 # a free extra draft helps
    assert not sp.should_lengthen(0.013, 1.0, 0.026, 2.0)            # dT/dN == T/N: no gain
    assert sp.should_lengthen(0.012, 1.0, 0.026, 2.0)
    assert not sp.should_lengthen(0.001, 0.0, 0.026, 2.0)            # no extra outputs
    rng = np.random.default_rng(6)
    for _ in range(1000):                                            # same as comparing T/N before and after
        t, n, dt, dn = rng.uniform(0.01, 0.05), rng.uniform(1, 5), rng.uniform(0, 0.01), rng.uniform(0, 1)
        assert sp.should_lengthen(dt, dn, t, n) == ((t + dt) / (n + dn) < t / n)


def test_adaptive_length_with_a_sequential_drafter():
    """Each draft costs one drafter pass; acceptance decays: the rule stops at the optimum."""
    step, pass_s = 0.02626, 0.00357
    a = [0.9, 0.85, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3]
    t = lambda m: sp.speculative_round_s(step, sp.drafting_s(m, pass_s))  # noqa: E731
    m = sp.adaptive_draft_length(t, a, 8)
    assert 0 < m < 8
    assert m == sp.best_draft_length(t, a, 8)
    per_token = [t(k) / sp.expected_outputs_per_round(a[:k]) for k in range(9)]
    assert per_token[m] == min(per_token)


def test_adaptive_length_stops_at_a_graph_jump():
    """Reference §8: verifying 9 tokens instead of 8 can jump to a 16-row graph. The marginal rule
    stops at 7 drafts; at high acceptance 15 drafts would pay again, which only a scan finds."""
    rows = lambda m: 8 if m + 1 <= 8 else 16  # noqa: E731
    t = lambda m: 0.02626 * (1.0 if rows(m) == 8 else 1.5)  # noqa: E731
    a = [0.97] * 15
    assert sp.adaptive_draft_length(t, a, 15) == 7
    assert sp.best_draft_length(t, a, 15) == 15
    with pytest.raises(ValueError, match=r"max_len must be in \[0, 15\]"):
        sp.adaptive_draft_length(t, a, 16)


def test_drafting_and_rounds():
    assert sp.drafting_s(4, 0.00357) == pytest.approx(0.01428)
    assert sp.drafting_s(4, 0.00357, parallel=True) == 0.00357
    assert sp.drafting_s(0, 0.00357, parallel=True) == 0.0
    assert sp.speculative_round_s(0.02735, 0.00357, overlapped=True) == 0.02735
    assert sp.rounds_needed(256, 3.05) == 84


# ---------------------------------------------------------------------------------------------
# Wiring


SECTION_8_GOLDENS = {
    "s8-expected-outputs-a-quarter", "s8-expected-outputs-three-quarters", "s8-two-symbol-draft-a",
    "s8-two-symbol-draft-b", "s8-per-token-weighted", "s8-per-token-unweighted", "s8-round-with-lookup",
    "s8-per-token-aaaa", "s8-per-token-bbbb", "s8-draft-budget-aaaa", "s8-draft-budget-bbbb",
    "s8-index-recovery", "s8-plain-answer", "s8-effective-bandwidth", "s8-drafter-pass",
    "s8-drafter-sequential-4", "s8-drafter-parallel-4", "s8-drafter-sequential-per-token",
    "s8-drafter-parallel-per-token", "s8-drafter-parallel-2-per-token", "s8-verify-extra-compute",
    "s8-verify-round",
}


def test_section_8_goldens_are_registered():
    ids = {e["id"] for e in yaml.safe_load(GOLDEN.read_text())["entries"]}
    assert SECTION_8_GOLDENS <= ids, sorted(SECTION_8_GOLDENS - ids)


def test_module_imports_neither_simpy_nor_torch():
    code = "import sys, sim.models.speculative; print(sorted({'simpy', 'torch'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
