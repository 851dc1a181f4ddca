"""Speculative decoding: acceptance arithmetic, round and per-token times, exact verification, sampling.

Owns the closed forms of reference section 8 (and the speculative pieces of section 9's scheme D),
the exact accept/resample rule, and the per-round acceptance sampler the simulator draws from.
Pure numpy over numbers and profiles: no simpy, no torch. Times in seconds, bytes in B, decimal SI.

Acceptance convention. `acceptance` always means the *conditional* per-position rates
a_j = P(draft j accepted | drafts 1..j-1 accepted). vLLM's logged "Per-position acceptance rate"
is different: it divides accepted tokens at position j by the number of drafts (rounds), which is
the *cumulative* P(drafts 1..j all accepted) = a_1 ... a_j (vllm/v1/spec_decode/metrics.py,
`acceptance_rates = sum(pos_matrix, axis=0) / num_drafts`). Convert such rates with
:func:`conditional_from_rates` before using them here; gpt-fast's `accept_counts` histogram goes
through :func:`conditional_from_histogram`.

Randomness comes only from a passed `np.random.Generator`; nothing here seeds or keeps an RNG.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from sim.models.spec import ModelSpec
from sim.models.roofline import sequence_flops

# ---------------------------------------------------------------------------------------------
# Acceptance arithmetic (reference section 8)


def _acceptance_array(acceptance, name: str = "acceptance") -> np.ndarray:
    """Float array of conditional acceptances (1-D, or 2-D with one row per round), each in [0, 1]."""
    a = np.asarray(acceptance, dtype=float)
    if a.ndim not in (1, 2):
        raise ValueError(f"{name} must be a sequence of per-position rates (or rows of them), got shape {a.shape}")
    bad = np.flatnonzero(~((a >= 0) & (a <= 1)))
    if bad.size:
        idx = np.unravel_index(bad[0], a.shape)
        raise ValueError(f"{name}[{', '.join(map(str, idx))}] = {float(a[idx])!r} is not a probability in [0, 1]")
    return a


def expected_outputs_per_round(acceptance: Sequence[float]) -> float:
    """E[N_m] = 1 + sum_{j=1..m} prod_{i<=j} a_i: mean outputs of one round of m drafts.

    Args:
        acceptance: Conditional per-position acceptances a_1..a_m (m may be 0: plain decode).

    Returns:
        Mean tokens a round emits, between 1 and m + 1 (the target always emits one).
    """
    a = _acceptance_array(acceptance)
    if a.ndim != 1:
        raise ValueError(f"acceptance must be 1-D (one rate per draft position), got shape {a.shape}")
    return float(1.0 + np.cumprod(a).sum())


def expected_outputs_constant(acceptance: float, num_drafts: int) -> float:
    """E[N_m] at a constant a: 1 + a + ... + a^m = (1 - a^(m+1)) / (1 - a), m + 1 at a = 1."""
    if num_drafts < 0:
        raise ValueError(f"num_drafts must be >= 0, got {num_drafts}")
    _acceptance_array([acceptance])
    if acceptance == 1:
        return float(num_drafts + 1)
    return (1.0 - acceptance ** (num_drafts + 1)) / (1.0 - acceptance)


def outputs_distribution(acceptance: Sequence[float]) -> np.ndarray:
    """P(a round accepts k drafts) for k = 0..m; the round emits k + 1 tokens.

    P(k) = a_1 ... a_k (1 - a_{k+1}) for k < m and a_1 ... a_m for k = m.
    """
    a = _acceptance_array(acceptance)
    if a.ndim != 1:
        raise ValueError(f"acceptance must be 1-D, got shape {a.shape}")
    reach = np.concatenate(([1.0], np.cumprod(a)))      # P(K >= k), k = 0..m
    return reach - np.concatenate((reach[1:], [0.0]))


def conditional_from_rates(per_position_rates: Sequence[float]) -> np.ndarray:
    """Conditional a_j from cumulative per-position rates r_j = a_1 ... a_j (vLLM's log line).

    a_j = r_j / r_{j-1} (r_0 = 1); positions after a zero rate get 0. Rates must not increase.
    """
    r = _acceptance_array(per_position_rates, "per_position_rates")
    if r.ndim != 1:
        raise ValueError(f"per_position_rates must be 1-D, got shape {r.shape}")
    prev = np.concatenate(([1.0], r[:-1]))
    rising = np.flatnonzero(r > prev * (1 + 1e-9))
    if rising.size:
        j = int(rising[0])
        raise ValueError(f"per_position_rates must not increase (a later draft is accepted only after the earlier "
                         f"ones): rate[{j}] = {r[j]} > rate[{j - 1}] = {prev[j]}")
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(prev > 0, r / np.where(prev > 0, prev, 1.0), 0.0)
    return np.minimum(a, 1.0)


def rates_from_conditional(acceptance: Sequence[float]) -> np.ndarray:
    """Cumulative per-position rates a_1 ... a_j (what vLLM logs) from conditional acceptances."""
    return np.cumprod(_acceptance_array(acceptance))


def conditional_from_histogram(accept_counts: Sequence[float]) -> np.ndarray:
    """Conditional a_j from a histogram of rounds by accepted drafts (gpt-fast's `accept_counts`).

    Args:
        accept_counts: accept_counts[k] = rounds that accepted exactly k drafts, k = 0..m.

    Returns:
        a_1..a_m with a_j = P(K >= j) / P(K >= j - 1) (0 where no round got that far).
    """
    c = np.asarray(accept_counts, dtype=float)
    if c.ndim != 1 or c.size < 1:
        raise ValueError(f"accept_counts must be a 1-D histogram over k = 0..m accepted drafts, got shape {c.shape}")
    if (c < 0).any() or not c.sum() > 0:
        raise ValueError(f"accept_counts must be >= 0 with a positive total, got {c.tolist()}")
    reach = c[::-1].cumsum()[::-1]                      # rounds with K >= k
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(reach[:-1] > 0, reach[1:] / np.where(reach[:-1] > 0, reach[:-1], 1.0), 0.0)


def acceptance_rate(p_target: Sequence[float], q_draft: Sequence[float]) -> float:
    """Probability the sampling rule accepts one draft from q against p: sum_x min(p(x), q(x)).

    Equals 1 - total-variation distance. Reference section 8's two-symbol example: p = (1/4, 3/4)
    and a draft that always says A (q = (1, 0)) -> 1/4; always B -> 3/4.
    """
    p, q = _distribution(p_target, "p_target"), _distribution(q_draft, "q_draft")
    if p.shape != q.shape:
        raise ValueError(f"p_target and q_draft must have the same vocabulary, got {p.shape} and {q.shape}")
    return float(np.minimum(p, q).sum())


# ---------------------------------------------------------------------------------------------
# Time per round and per token


def per_token_latency_s(round_s, outputs_per_round) -> float:
    """Mean per-token latency: total time / total tokens over rounds (a rate, so weighted by tokens).

    Args:
        round_s: Time of each round, or one time for every round.
        outputs_per_round: Tokens each round emitted, or their mean.

    Returns:
        sum(round_s) / sum(outputs). Section 8: two 1.5 ms rounds with 1 and 5 tokens give
        0.5 ms/token, not the 0.9 ms of averaging the per-round values (see
        :func:`per_round_latency_s`) without weights.
    """
    t, n = np.broadcast_arrays(np.asarray(round_s, dtype=float), np.asarray(outputs_per_round, dtype=float))
    if (n <= 0).any():
        raise ValueError(f"outputs_per_round must be > 0 (a round emits at least one token), got {n.tolist()}")
    return float(t.sum() / n.sum())


def per_round_latency_s(round_s, outputs_per_round) -> np.ndarray:
    """Each round's own time per token, round_s / outputs. Their plain mean is NOT the mean
    per-token latency (see :func:`per_token_latency_s`); use these for per-round distributions."""
    t, n = np.broadcast_arrays(np.asarray(round_s, dtype=float), np.asarray(outputs_per_round, dtype=float))
    if (n <= 0).any():
        raise ValueError(f"outputs_per_round must be > 0, got {n.tolist()}")
    return t / n


def draft_time_budget_s(expected_outputs: float, step_s: float) -> float:
    """Drafting time per round before speculation loses to plain decode: (E[N] - 1) x step.

    A round whose verify costs one plain step emits E[N] tokens; plain decode would need E[N]
    steps for them, so drafting may take at most the (E[N] - 1) steps saved.
    """
    if expected_outputs < 1:
        raise ValueError(f"expected_outputs must be >= 1, got {expected_outputs}")
    return (expected_outputs - 1.0) * step_s


def index_recovery_tokens(build_s: float, plain_per_token_s: float, spec_per_token_s: float) -> float:
    """Output tokens after which a one-off draft-source cost (e.g. an n-gram index build) is repaid.

    Returns:
        ceil(build_s / (plain - spec)) as a float; `math.inf` when speculation is not faster.
    """
    saved = plain_per_token_s - spec_per_token_s
    if saved <= 0:
        return math.inf
    return float(math.ceil(build_s / saved - 1e-9))


def decode_s(output_tokens: float, round_s: float, outputs_per_round: float = 1.0) -> float:
    """Expected time to emit `output_tokens` at `outputs_per_round` mean tokens per round.

    Plain decode is one output per step (section 8: 256 x 26.26 ms = 6.72 s). With speculation
    the round count is taken at its mean, output_tokens / E[N] (not rounded up).
    """
    if outputs_per_round < 1:
        raise ValueError(f"outputs_per_round must be >= 1, got {outputs_per_round}")
    return output_tokens / outputs_per_round * round_s


def rounds_needed(output_tokens: int, outputs_per_round: float) -> int:
    """Whole rounds to emit `output_tokens` at `outputs_per_round` each: ceil (section 9: 255 / 3 = 85)."""
    if outputs_per_round < 1:
        raise ValueError(f"outputs_per_round must be >= 1, got {outputs_per_round}")
    return math.ceil(output_tokens / outputs_per_round - 1e-9)


def verify_flops(spec: ModelSpec, positions: int, context_tokens: int, sequences: int = 1) -> float:
    """FLOPs of verifying `positions` tokens (drafts + the bonus position) after `context_tokens`.

    Every verified position goes through lm_head (reference section 4).
    """
    return sequences * sequence_flops(spec, positions, context_tokens, logits=positions)


def verify_compute_s(flops: float, peak_flops_per_s: float, mfu: float) -> float:
    """Time of a verify's arithmetic at a given MFU: F / (peak x MFU)."""
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu must be in (0, 1], got {mfu}")
    return flops / (peak_flops_per_s * mfu)


def verify_round_s(step_s: float, flops: float, peak_flops_per_s: float, mfu: float) -> float:
    """A verify round costs max(compute of its positions, the plain step it replaces).

    The round reads the same weights and KV as a decode step; its extra positions only add
    arithmetic. Section 8: 5 positions at 2K cost the same 26.26 ms; section 9 (scheme D):
    max(8.8 ms for 16 x 8 positions at 58%, 27.35 ms) = 27.35 ms.
    """
    return max(step_s, verify_compute_s(flops, peak_flops_per_s, mfu))


def speculative_round_s(verify_s: float, draft_s: float, overlapped: bool = False) -> float:
    """Round time from its verify and its drafting: serial sum, or max when the drafter overlaps
    (scheme D assumes DFlash's pass adds no time)."""
    return max(verify_s, draft_s) if overlapped else verify_s + draft_s


def drafter_pass_s(drafter_bytes: float, bandwidth_bytes_per_s: float) -> float:
    """One memory-bound drafter forward: its weights / the bandwidth a decode step achieves.

    Section 8: 2.10 GB at an effective 588 GB/s (15.44 GB / 26.26 ms) -> 3.57 ms.
    """
    if bandwidth_bytes_per_s <= 0:
        raise ValueError(f"bandwidth_bytes_per_s must be > 0, got {bandwidth_bytes_per_s}")
    return drafter_bytes / bandwidth_bytes_per_s


def drafting_s(num_drafts: int, pass_s: float, parallel: bool = False) -> float:
    """Drafting time per round: one pass per draft (autoregressive) or one pass for all (block drafter)."""
    if num_drafts < 0:
        raise ValueError(f"num_drafts must be >= 0, got {num_drafts}")
    if num_drafts == 0:
        return 0.0
    return pass_s if parallel else num_drafts * pass_s


# ---------------------------------------------------------------------------------------------
# Draft length


def should_lengthen(d_time_s: float, d_outputs: float, time_s: float, outputs: float) -> bool:
    """Longer drafts help only while dT / dN < T / N (section 8).

    Written as N dT < T dN, which is the exact condition for (T + dT) / (N + dN) < T / N with
    N > 0, and also covers dN = 0 (lengthening then helps only if it makes the round cheaper).

    Args:
        d_time_s: Extra round time of one more draft.
        d_outputs: Extra expected outputs: the product of the first m + 1 acceptances.
        time_s: Round time now.
        outputs: Expected outputs per round now.
    """
    if outputs <= 0:
        raise ValueError(f"outputs must be > 0, got {outputs}")
    return outputs * d_time_s < time_s * d_outputs


def adaptive_draft_length(step_time_fn: Callable[[int], float], acceptances: Sequence[float], max_len: int) -> int:
    """Lengthen the draft one position at a time while :func:`should_lengthen` says so.

    Args:
        step_time_fn: Round time with m drafts, for m = 0..max_len (m = 0 is a plain step).
        acceptances: Conditional acceptances a_1..a_k, k >= max_len.
        max_len: Longest draft allowed.

    Returns:
        The first m at which one more draft would not lower the time per token (a local rule:
        a step-time jump, e.g. 9 verified rows falling into a 16-row graph, stops it even when
        much longer drafts would pay again; :func:`best_draft_length` scans them all).
    """
    a = _draft_acceptances(acceptances, max_len)
    m, t, n, reach = 0, float(step_time_fn(0)), 1.0, 1.0
    while m < max_len:
        reach *= a[m]
        t_next = float(step_time_fn(m + 1))
        if not should_lengthen(t_next - t, reach, t, n):
            break
        m, t, n = m + 1, t_next, n + reach
    return m


def best_draft_length(step_time_fn: Callable[[int], float], acceptances: Sequence[float], max_len: int) -> int:
    """The m in 0..max_len with the lowest T(m) / E[N_m] (smallest m on ties)."""
    a = _draft_acceptances(acceptances, max_len)
    outputs = 1.0 + np.concatenate(([0.0], np.cumsum(np.cumprod(a))))
    per_token = [float(step_time_fn(m)) / outputs[m] for m in range(max_len + 1)]
    return int(np.argmin(per_token))


def _draft_acceptances(acceptances: Sequence[float], max_len: int) -> np.ndarray:
    a = _acceptance_array(acceptances, "acceptances")
    if a.ndim != 1:
        raise ValueError(f"acceptances must be 1-D, got shape {a.shape}")
    if not 0 <= max_len <= a.size:
        raise ValueError(f"max_len must be in [0, {a.size}] (one acceptance per draft position), got {max_len}")
    return a[:max_len]


# ---------------------------------------------------------------------------------------------
# Exact verification of one round


def _distribution(p, name: str) -> np.ndarray:
    d = np.asarray(p, dtype=float)
    if d.size and (d.min() < 0 or np.abs(d.sum(axis=-1) - 1.0).max() > 1e-6):
        sums = np.atleast_1d(d.sum(axis=-1))
        raise ValueError(f"{name} must hold probabilities summing to 1 along the vocabulary axis; "
                         f"got min {float(d.min())!r}, row sums {np.round(sums[:8], 6).tolist()}")
    return d


def _sample(weights: np.ndarray, rng: np.random.Generator) -> int:
    """One index drawn in proportion to non-negative `weights` (normalised here)."""
    c = np.cumsum(weights)
    return min(int(np.searchsorted(c, rng.random() * c[-1], side="right")), weights.size - 1)


def _check_round(p: np.ndarray, drafts: np.ndarray, q: np.ndarray | None = None) -> None:
    if drafts.ndim != 1:
        raise ValueError(f"drafts must be 1-D token ids, got shape {drafts.shape}")
    m = drafts.shape[0]
    if p.ndim != 2 or p.shape[0] != m + 1:
        raise ValueError(f"p_target must have shape (m + 1, V) = ({m + 1}, V) for {m} drafts, got {p.shape}")
    if q is not None and q.shape != (m, p.shape[1]):
        raise ValueError(f"q_draft must have shape (m, V) = ({m}, {p.shape[1]}), got {q.shape}")
    if m and not (0 <= drafts.min() and drafts.max() < p.shape[1]):
        raise ValueError(f"drafts must be token ids in [0, {p.shape[1]}), got {drafts.tolist()}")


def verify_round(p_target: np.ndarray, q_draft: np.ndarray, drafts: np.ndarray, rng: np.random.Generator) -> list[int]:
    """Speculative sampling: accept/resample m drafts so the output is distributed exactly as p.

    For j = 1..m: accept draft x_j with probability min(1, p_j(x_j) / q_j(x_j)); on the first
    rejection emit a token from normalised max(p_j - q_j, 0) and stop (later drafts are dropped).
    If all m are accepted, emit a bonus token from p_{m+1}.

    Args:
        p_target: (m + 1, V) target distributions at each verified position, given the drafts
            before it.
        q_draft: (m, V) the distributions the drafts were drawn from.
        drafts: (m,) drafted token ids.
        rng: Source of the uniform draws.

    Returns:
        The round's output tokens: accepted drafts then one target token (1 to m + 1 tokens).
    """
    p = _distribution(p_target, "p_target")
    q = _distribution(q_draft, "q_draft")
    x = np.asarray(drafts, dtype=np.int64)
    _check_round(p, x, q)
    out: list[int] = []
    for j, token in enumerate(x.tolist()):
        if rng.random() * q[j, token] < p[j, token]:    # u < p/q without dividing: q(x) = 0 accepts
            out.append(token)
            continue
        residual = np.maximum(p[j] - q[j], 0.0)
        out.append(_sample(residual if residual.sum() > 0 else p[j], rng))   # p == q: never rejected
        return out
    out.append(_sample(p[-1], rng))
    return out


def verify_round_greedy(p_target: np.ndarray, drafts: np.ndarray) -> list[int]:
    """Greedy verification: keep drafts up to the first that differs from the target's argmax,
    then emit the target's own token there; if all m match, emit the bonus argmax of position m + 1.

    Args:
        p_target: (m + 1, V) target probabilities or logits at each verified position.
        drafts: (m,) drafted token ids.
    """
    p = np.asarray(p_target)
    x = np.asarray(drafts, dtype=np.int64)
    _check_round(p, x)
    target = np.argmax(p, axis=1)
    miss = np.flatnonzero(x != target[:-1])
    k = int(miss[0]) if miss.size else x.size
    return x[:k].tolist() + [int(target[k])]


# ---------------------------------------------------------------------------------------------
# Sampling accepted drafts per round (what the simulator draws)


def sample_accepted(acceptance_per_position, rng: np.random.Generator, size: int | None = None) -> np.ndarray:
    """Accepted drafts per round (0..m); the round emits that + 1 tokens.

    Args:
        acceptance_per_position: Conditional a_1..a_m shared by `size` rounds (1-D), or one row
            of them per round (2-D, shape (rounds, m)); pad shorter drafts with zeros.
        rng: Source of randomness.
        size: Rounds to draw with a 1-D acceptance; must be None or the row count with 2-D.

    Returns:
        int64 array of accepted drafts, shape (size,) or (rounds,).
    """
    a = _acceptance_array(acceptance_per_position, "acceptance_per_position")
    if a.ndim == 1:
        if size is None or size < 0:
            raise ValueError(f"size must be a round count >= 0 with a 1-D acceptance, got {size}")
        cdf = np.cumsum(outputs_distribution(a))
        return np.minimum(np.searchsorted(cdf, rng.random(size), side="right"), a.size).astype(np.int64)
    if size is not None and size != a.shape[0]:
        raise ValueError(f"size ({size}) must equal the rows of a 2-D acceptance ({a.shape[0]}) or be None")
    accepted = rng.random(a.shape) < a
    return np.cumprod(accepted, axis=1).sum(axis=1).astype(np.int64)


def _beta_moments(alpha: float, beta: float, orders: int) -> np.ndarray:
    """E[a^j] for a ~ Beta(alpha, beta), j = 0..orders: prod_{i<j} (alpha + i) / (alpha + beta + i)."""
    i = np.arange(orders, dtype=float)
    return np.concatenate(([1.0], np.cumprod((alpha + i) / (alpha + beta + i))))


@dataclass(frozen=True)
class AcceptanceModel:
    """How often drafts are accepted, for the simulator to sample rounds from.

    Kinds (build them with the classmethods):
      constant      every position and request accepts with the same a;
      per_position  conditional a_1..a_m, the same for every request;
      histogram     a_1..a_m derived from a calibration histogram of accepted drafts per round;
      beta          each request draws its own a ~ Beta(alpha, beta) once, constant over positions
                    and rounds (requests differ in how predictable they are).

    The scheduler draws a request's rates once (:meth:`draw`), then samples each round with
    :func:`sample_accepted` on the rows of the requests in the batch, truncated or zero-padded to
    the draft length it chose. :meth:`sample_accepted` samples population rounds directly.
    """

    kind: Literal["constant", "per_position", "histogram", "beta"]
    num_drafts: int
    acceptance: tuple[float, ...] = ()
    """Conditional a_1..a_m for the fixed kinds; empty for `beta`."""
    beta_params: tuple[float, float] | None = None

    def __post_init__(self):
        if self.num_drafts < 0:
            raise ValueError(f"num_drafts must be >= 0, got {self.num_drafts}")
        if self.kind == "beta":
            if self.beta_params is None or len(self.beta_params) != 2 or min(self.beta_params) <= 0:
                raise ValueError(f"kind beta needs beta_params (alpha, beta) both > 0, got {self.beta_params}")
            if self.acceptance:
                raise ValueError("kind beta draws acceptance per request; leave `acceptance` empty")
        elif self.kind in ("constant", "per_position", "histogram"):
            if len(self.acceptance) != self.num_drafts:
                raise ValueError(f"kind {self.kind}: acceptance has {len(self.acceptance)} positions "
                                 f"but num_drafts is {self.num_drafts}")
            _acceptance_array(self.acceptance)
            if self.beta_params is not None:
                raise ValueError(f"kind {self.kind} takes no beta_params")
        else:
            raise ValueError(f"unknown acceptance kind {self.kind!r}; known: constant, per_position, histogram, beta")

    # --- constructors ------------------------------------------------------------------------
    @classmethod
    def constant(cls, acceptance: float, num_drafts: int) -> AcceptanceModel:
        """The same acceptance at every draft position."""
        return cls("constant", num_drafts, (float(acceptance),) * num_drafts)

    @classmethod
    def per_position(cls, acceptance: Sequence[float]) -> AcceptanceModel:
        """Conditional acceptance given per draft position."""
        a = tuple(float(v) for v in acceptance)
        return cls("per_position", len(a), a)

    @classmethod
    def from_vllm_rates(cls, per_position_rates: Sequence[float]) -> AcceptanceModel:
        """From vLLM's logged cumulative per-position rates (see the module docstring)."""
        return cls.per_position(conditional_from_rates(per_position_rates).tolist())

    @classmethod
    def histogram(cls, accept_counts: Sequence[float]) -> AcceptanceModel:
        """Conditional acceptance derived from a histogram of accepted-draft counts."""
        a = tuple(conditional_from_histogram(accept_counts).tolist())
        return cls("histogram", len(a), a)

    @classmethod
    def beta(cls, alpha: float, beta: float, num_drafts: int) -> AcceptanceModel:
        """Each request draws its acceptance from Beta(alpha, beta): some requests draft well, others badly."""
        return cls("beta", num_drafts, (), (float(alpha), float(beta)))

    # --- queries -----------------------------------------------------------------------------
    def _length(self, num_drafts: int | None) -> int:
        m = self.num_drafts if num_drafts is None else num_drafts
        if not 0 <= m <= self.num_drafts:
            raise ValueError(f"num_drafts must be in [0, {self.num_drafts}] for this model, got {m}")
        return m

    def outputs_distribution(self, num_drafts: int | None = None) -> np.ndarray:
        """P(a round accepts k drafts), k = 0..m, over the request population."""
        m = self._length(num_drafts)
        if self.kind != "beta":
            return outputs_distribution(self.acceptance[:m])
        reach = _beta_moments(*self.beta_params, m)        # P(K >= k) = E[a^k]
        return reach - np.concatenate((reach[1:], [0.0]))

    def expected_outputs_per_round(self, num_drafts: int | None = None) -> float:
        """Population mean of E[N]: for `beta`, 1 + sum_j E[a^j] (Beta moments)."""
        m = self._length(num_drafts)
        if self.kind != "beta":
            return expected_outputs_per_round(self.acceptance[:m])
        return float(_beta_moments(*self.beta_params, m).sum())

    def draw(self, rng: np.random.Generator, num_requests: int) -> np.ndarray:
        """Per-request conditional acceptances, shape (num_requests, num_drafts).

        Fixed kinds repeat their rates and consume no randomness; `beta` draws one a per request.
        """
        if self.kind == "beta":
            a = rng.beta(*self.beta_params, size=num_requests)
            return np.repeat(a[:, None], self.num_drafts, axis=1)
        return np.tile(np.asarray(self.acceptance, dtype=float), (num_requests, 1))

    def sample_accepted(self, rng: np.random.Generator, size: int, num_drafts: int | None = None) -> np.ndarray:
        """Accepted drafts of `size` independent rounds, each from a fresh request of the population."""
        cdf = np.cumsum(self.outputs_distribution(num_drafts))
        return np.minimum(np.searchsorted(cdf, rng.random(size), side="right"), cdf.size - 1).astype(np.int64)
