"""Fast-forward under a plain linear step-time model: the terms of LinearModel.step_s that stay fixed while a steady
decode plan grows, and the stretch of such iterations stepped on local counters (Scheduler.fast_forward)."""

from __future__ import annotations

from typing import Callable

from sim.core.step import StepPlan


def linear_terms(step_time: Callable, plan: StepPlan) -> tuple | None:
    """For a plain linear step-time model, the terms of its step_s that stay fixed while a steady
    plan grows (None for any other model): step_s = head + p x pairs + r x KV tokens + seqs + decodes,
    evaluated left to right exactly as LinearModel.step_s does. Its per_prefill_completion_s term is
    absent: a steady plan is all decodes (no prompt completes in it)."""
    model = getattr(step_time, "__self__", None)
    if type(model).__name__ != "LinearModel" or getattr(step_time, "__name__", "") != "step_s":
        return None
    c = model.cfg
    if model.optional_terms and ((c.per_prefill_completion_s and plan.prefill_logits) or (
            c.per_shared_kv_token_s is not None and (plan.shared_kv_tokens or plan.hit_kv_tokens))):
        return None   # (a steady plan's shared KV stays fixed, but step_s itself keeps the float order)
    constant, per_new, per_pair, per_kv, per_seq, per_decode = model.coefficients
    return constant + per_new * plan.new_tokens, per_pair, per_kv, per_seq * plan.num_seqs, per_decode * plan.decode_seqs


def steady_linear(linear: tuple, plan: StepPlan, count: int, m: int, start_s: float, step_s: float, horizon_s: float,
                  durations: list, ends: list, busy_s: float) -> tuple[float, float, int, float]:
    """Scheduler.fast_forward's iterations under a plain linear model (`linear_terms`): up to m iterations that end
    before `horizon_s`, each one's duration (end - start) and end appended to `durations` / `ends`, the plan's counters
    moved on once at the end; returns the start and step of the next iteration and how many were done. It stops before
    an iteration whose next step the model would refuse (< 0): the engine then plans that one and the model raises its
    own error; with none done the caller's loop steps into it at once. `busy_s` comes back with every duration added
    in turn (the sum Timeline.on_iteration would make, in the same order)."""
    head, p, r, seqs, decodes = linear
    pairs, kv = plan.pairs, plan.kv_tokens_read
    k = 0
    while k < m:
        end_s = start_s + step_s
        if not end_s < horizon_s:
            break
        nxt = head + p * (pairs + count) + r * (kv + count) + seqs + decodes
        if nxt < 0:
            break
        d = end_s - start_s
        durations.append(d)
        ends.append(end_s)
        busy_s += d
        pairs += count
        kv += count
        start_s, step_s = end_s, nxt
        k += 1
    plan.pairs, plan.kv_tokens_read = pairs, kv
    plan.decode_kv_tokens += k * count
    plan.decode_pairs += k * count
    plan.max_context += k
    return start_s, step_s, k, busy_s
