"""Step-time models: how long one iteration (a StepPlan) takes. Pure Python, no simpy.

Three kinds, chosen by the scenario's `step_time`: `linear` (iteration features), `efficiency`
(roofline with measured efficiencies) and `profile` (a fitted profile file, either of the two).
"""

from __future__ import annotations

import bisect
import dataclasses
import sys
from collections import OrderedDict
from pathlib import Path

from sim.io.errors import ConfigError
from sim.io.notices import say
from sim.models.spec import ModelSpec
from sim.io.profiles import EfficiencyStepTime, LinearStepTime, ValidRange
from sim.models.memory import offload_step_s
from sim.models.roofline import forward_flops


class LinearModel:
    """T = c + a x tokens + p x pairs + r x KV tokens read + s x sequences + d x decode sequences
    (+ f x prompts completed: plan.prefill_logits, the sequences sampling their first token)
    (+ (r' - r) x KV tokens of prefix-cache hits when the profile prices them at r': their re-reads,
    plan.shared_kv_tokens, or with shared_kv_form "hits" every hit token read, plan.hit_kv_tokens)."""

    def __init__(self, cfg: LinearStepTime):
        self.cfg = cfg
        # (read once: step_s runs every iteration; the config is frozen)
        self.coefficients = (cfg.constant_s, cfg.per_new_token_s, cfg.per_pair_s, cfg.per_kv_token_s,
                             cfg.per_sequence_s, cfg.per_decode_sequence_s)
        """The terms every step has: constant, per new token, pair, KV token read, sequence, decode sequence."""
        self.optional_terms = bool(cfg.per_prefill_completion_s) or cfg.per_shared_kv_token_s is not None
        """Whether the per prefill completion or shared KV token terms may add to a step."""
        constant, per_new, per_pair, per_kv, per_seq, per_decode = self.coefficients
        self.token_kv_only = (not self.optional_terms and per_pair == per_seq == per_decode == 0 and constant > 0
                              and per_new >= 0 and per_kv >= 0)
        """Only the constant, new token and KV read terms are nonzero and the sum stays positive: adding the zero
        terms to it changes no bit, and it is never negative (step_s leaves them out)."""

    def prefill_part_s(self, plan) -> float:
        """The prefill part of a step (chunked-prefill budgeting): its token, pair and sequence terms."""
        c = self.cfg
        t = c.per_new_token_s * plan.prefill_tokens + c.per_pair_s * plan.prefill_pairs + c.per_sequence_s * plan.prefill_seqs
        if c.per_prefill_completion_s:
            t += c.per_prefill_completion_s * plan.prefill_logits
        return t

    def step_s(self, plan) -> float:
        """The iteration's time: the linear terms over the whole batch (refused when negative)."""
        constant, per_new, per_pair, per_kv, per_seq, per_decode = self.coefficients
        if self.token_kv_only:
            return constant + per_new * plan.new_tokens + per_kv * plan.kv_tokens_read
        t = (constant + per_new * plan.new_tokens + per_pair * plan.pairs + per_kv * plan.kv_tokens_read
             + per_seq * plan.num_seqs + per_decode * plan.decode_seqs)
        if self.optional_terms:
            c = self.cfg
            if c.per_prefill_completion_s:   # optional term (0 in most profiles: t stays bit for bit as before)
                t += c.per_prefill_completion_s * plan.prefill_logits
            if c.per_shared_kv_token_s is not None:   # optional too (absent: as before)
                shared = plan.hit_kv_tokens if c.shared_kv_form == "hits" else plan.shared_kv_tokens
                if shared:
                    t += (c.per_shared_kv_token_s - c.per_kv_token_s) * shared
        if t < 0:  # negative coefficients (a fit's) can go below zero far from the fitted shapes
            raise ExtrapolationError(
                f"the linear model (step_time.model) gives a negative step time ({t:.6g} s) for an iteration of "
                f"{plan.new_tokens} new tokens, {plan.num_seqs} sequences, {plan.kv_tokens_read} KV tokens read: "
                "check its negative coefficients")
        return t


def _interp(xs: list[float], ys: list[float], x: float, allow: bool, what: str) -> float:
    """Linear interpolation; outside [xs[0], xs[-1]] extrapolate linearly only when allowed."""
    if xs[0] <= x <= xs[-1]:
        if len(xs) == 1:
            return ys[0]
        i = min(max(bisect.bisect_right(xs, x), 1), len(xs) - 1)
    elif not allow:
        raise ExtrapolationError(f"{what} {x:.6g} is outside the measured range [{xs[0]:.6g}, {xs[-1]:.6g}]; "
                                 "measure that far, or set step_time.allow_extrapolation: true in the scenario "
                                 "to extrapolate linearly (warned once)")
    elif len(xs) == 1:
        return ys[0]
    else:
        i = 1 if x < xs[0] else len(xs) - 1
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    # extrapolating a falling line below its first point can cross zero: a step never takes < 0 s
    return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 0.0)


class ExtrapolationError(ConfigError):
    """A shape outside the measured range, without step_time.allow_extrapolation."""
    pass


class EfficiencyModel:
    """Decode: time interpolated on bytes read; prefill: FLOPs / (peak x MFU) or a measured override.
    A mixed iteration costs the sum of both parts (reference section 9's arithmetic), or with
    `mixed: one_pass` one forward pass (`one_pass_s`)."""

    def __init__(self, cfg: EfficiencyStepTime, spec: ModelSpec, weight_read_bytes: float,
                 kv_bytes_per_token: float, peak_flops_per_s: float, allow_extrapolation: bool):
        self.cfg, self.spec = cfg, spec
        self.weight_read_bytes = weight_read_bytes
        self.kv_bytes_per_token = kv_bytes_per_token
        self.peak = cfg.peak_tflops * 1e12 if cfg.peak_tflops else peak_flops_per_s
        self.allow = allow_extrapolation
        self._xs = [p.bytes for p in cfg.decode_table]
        self._ys = [p.time_s for p in cfg.decode_table]
        self._overrides = {(o.sequences, o.new_tokens_per_sequence, o.cached_tokens_per_sequence): o.time_s
                           for o in cfg.prefill_overrides}
        self._warned: set[str] = set()

    def _warn_once(self, key: str, text: str) -> None:
        """docs/scenarios.md's promise: every extrapolation or fallback is said once, on stderr."""
        if key not in self._warned:
            self._warned.add(key)
            say(f"efficiency:{key}", f"warning: step_time (efficiency): {text}; further cases are not reported")

    def _table(self, xs: list[float], ys: list[float], x: float, what: str) -> float:
        if self.allow and not xs[0] <= x <= xs[-1]:
            self._warn_once(what, f"{what} {x:.6g} is outside the measured range [{xs[0]:.6g}, {xs[-1]:.6g}]: "
                                  "extrapolating linearly (step_time.allow_extrapolation: true)")
        return _interp(xs, ys, x, self.allow, what)

    def decode_s(self, plan) -> float:
        """Decode (and speculative verify) part: the measured time for the bytes read, but never
        less than its FLOPs at the prefill efficiency (verifying many positions can be compute bound)."""
        if plan.decode_seqs == 0:
            return 0.0
        read = self.weight_read_bytes + self.kv_bytes_per_token * plan.decode_kv_tokens
        t = self._table(self._xs, self._ys, read, "decode bytes read")
        flops = forward_flops(self.spec, plan.decode_positions, plan.decode_pairs, plan.decode_logits)
        floor = flops / (self.peak * self._mfu_clamped(plan.decode_positions))
        if floor > t:
            self._note_clamp(plan.decode_positions)
        return max(t, floor)

    def _note_clamp(self, new_tokens: int) -> None:
        """The MFU held at the table's end decided a step's time: an extrapolation, said once."""
        m = self.cfg.prefill_mfu
        if not isinstance(m, float) and not m[0].new_tokens <= new_tokens <= m[-1].new_tokens:
            self._warn_once("mfu clamp", f"{new_tokens} tokens in one pass lie outside the prefill MFU table "
                                         f"[{m[0].new_tokens}, {m[-1].new_tokens}]: the MFU at its nearest end is used "
                                         "(a compute-bound verify step or one-pass iteration)")

    def _mfu_clamped(self, new_tokens: int) -> float:
        m = self.cfg.prefill_mfu
        if isinstance(m, float):
            return m
        n = min(max(new_tokens, m[0].new_tokens), m[-1].new_tokens)
        return _interp([p.new_tokens for p in m], [p.mfu for p in m], n, True, "")

    def prefill_mfu(self, new_tokens: int) -> float:
        """MFU at `new_tokens` from the constant or the interpolated table."""
        m = self.cfg.prefill_mfu
        if isinstance(m, float):
            return m
        mfu = self._table([p.new_tokens for p in m], [p.mfu for p in m], new_tokens, "prefill new tokens")
        if mfu <= 0:  # a falling line extrapolated past its end: no time could come of it
            raise ExtrapolationError(f"prefill MFU extrapolated to {mfu:g} at {new_tokens} new tokens (the table covers "
                                     f"{m[0].new_tokens}..{m[-1].new_tokens}); measure prefills of that size")
        return mfu

    def prefill_s(self, plan) -> float:
        """Prefill part: a matching measured override, else FLOPs / (peak x MFU)."""
        if plan.prefill_seqs == 0:
            return 0.0
        if self._overrides:
            shapes = {(n, h) for req, n, h in plan.items if n > 1 or req.in_prefill}
            if len(shapes) == 1:
                (n, h), = shapes
                hit = self._overrides.get((plan.prefill_seqs, n, h))
                if hit is not None:
                    return hit
            else:
                self._warn_once("override shapes", f"a prefill batch of {len(shapes)} different shapes matches no "
                                                   "prefill_overrides entry (each is one shape): FLOPs / MFU used")
        flops = forward_flops(self.spec, plan.prefill_tokens, plan.prefill_pairs, plan.prefill_logits)
        return flops / (self.peak * self.prefill_mfu(plan.prefill_tokens))

    def prefill_part_s(self, plan) -> float:
        """The prefill part of a step (chunked-prefill budgeting)."""
        return self.prefill_s(plan)

    def step_s(self, plan) -> float:
        """Decode part + prefill part, or one pass with `mixed: one_pass`."""
        if self.cfg.mixed == "one_pass" and plan.decode_seqs and plan.prefill_seqs:
            return self.one_pass_s(plan)
        return self.decode_s(plan) + self.prefill_s(plan)

    def one_pass_s(self, plan) -> float:
        """Decodes and prefill chunks in one forward pass: the weights are read once and the GEMMs see
        all tokens. Time = all tokens' FLOPs at the prefill MFU of that many tokens, plus the decodes' KV
        read (the table's time for weights + KV minus its time for the weights alone: attention is a
        kernel of its own, not hidden under the GEMMs), never below the decode part (a memory-bound
        pass) nor the prefill part, never above their sum."""
        dec, pre = self.decode_s(plan), self.prefill_s(plan)
        w = max(self.weight_read_bytes, self._xs[0])
        kv_read = max(dec - _interp(self._xs, self._ys, w, True, ""), 0.0)
        flops = forward_flops(self.spec, plan.new_tokens, plan.prefill_pairs, plan.prefill_logits + plan.decode_logits)
        compute = flops / (self.peak * self._mfu_clamped(plan.new_tokens))
        if dec + pre > compute + kv_read > max(dec, pre):
            self._note_clamp(plan.new_tokens)
        return min(dec + pre, max(dec, pre, compute + kv_read))


class KeptShapes:
    """One engine's kernel cache (a profile's `shape_cache`): the batch token counts it keeps built, least
    recently used first. The executor asks it once per executed iteration; step_s stays a pure function
    (a warm cache), so probes of made-up plans leave it alone."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.kept: OrderedDict[int, None] = OrderedDict()

    def miss_s(self, plan) -> float:
        """0 when the iteration's token count is kept (it becomes the most recent); otherwise the cost of
        building it (it is kept from now on, the least recently used shape leaving when full)."""
        n, kept = plan.new_tokens, self.kept
        if n in kept:
            kept.move_to_end(n)
            return 0.0
        kept[n] = None
        if len(kept) > self.cfg.entries:
            kept.popitem(last=False)
        return self.cfg.miss_s + self.cfg.per_miss_token_s * n


def shape_cache_of(model):
    """The `shape_cache` of the linear model inside `model`'s wrappers (None when there is none)."""
    while model is not None:
        if isinstance(model, LinearModel):
            return model.cfg.shape_cache
        model = getattr(model, "inner", None)
    return None


class GraphPadded:
    """Decode-only iterations run the smallest captured CUDA-graph size >= their token rows
    (reference section 5): 17..32 rows all cost the 32-row graph; a speculative round of one
    sequence verifying 9 positions runs the 16-row graph. Larger batches and prefills run eagerly."""

    def __init__(self, inner, graph_sizes: list[int]):
        self.inner = inner
        self.sizes = sorted(graph_sizes)

    def prefill_part_s(self, plan) -> float:
        """The inner model's prefill part (prefills run eagerly)."""
        return self.inner.prefill_part_s(plan)

    def step_s(self, plan) -> float:
        """A decode-only step costs the captured graph size it pads up to."""
        if plan.prefill_seqs or plan.new_tokens > self.sizes[-1]:
            return self.inner.step_s(plan)
        rows = self.sizes[bisect.bisect_left(self.sizes, plan.new_tokens)]
        pad = rows - plan.new_tokens
        if pad == 0:
            return self.inner.step_s(plan)
        padded = dataclasses.replace(plan, new_tokens=rows, pairs=plan.pairs + pad,
                                     num_seqs=plan.num_seqs + pad, decode_seqs=plan.decode_seqs + pad,
                                     decode_positions=plan.decode_positions + pad, decode_pairs=plan.decode_pairs + pad,
                                     decode_logits=plan.decode_logits + pad)
        return self.inner.step_s(padded)


class Scaled:
    """Every step `factor` times the inner model's (`step_time.scale`): a sensitivity knob for the step-time
    model's error, outermost, so CUDA-graph padding and the valid-range check see the unscaled shapes."""

    def __init__(self, inner, factor: float):
        self.inner, self.factor = inner, factor

    def prefill_part_s(self, plan) -> float:
        """The inner model's prefill part, scaled."""
        return self.inner.prefill_part_s(plan) * self.factor

    def step_s(self, plan) -> float:
        """The inner model's step, scaled."""
        return self.inner.step_s(plan) * self.factor


class RangeChecked:
    """Refuses shapes outside a fitted profile's calibrated range, or warns once when allowed."""

    def __init__(self, inner, valid: ValidRange, source: str | Path, allow: bool, stream=None):
        self.inner, self.valid, self.source, self.allow = inner, valid, str(source), allow
        self._warned = False
        self._stream = stream or sys.stderr

    def prefill_part_s(self, plan) -> float:
        """The inner model's prefill part."""
        return self.inner.prefill_part_s(plan)

    def step_s(self, plan) -> float:
        """The inner model's time after checking the shape against valid_range."""
        v = self.valid
        bad = None
        if plan.num_seqs > v.max_batch:
            bad = f"batch {plan.num_seqs} > max_batch {v.max_batch}"
        elif plan.new_tokens > v.max_new_tokens:
            bad = f"{plan.new_tokens} new tokens > max_new_tokens {v.max_new_tokens}"
        elif plan.max_context > v.max_context_tokens:
            bad = f"context {plan.max_context} > max_context_tokens {v.max_context_tokens}"
        if bad:
            if not self.allow:
                raise ExtrapolationError(
                    f"{self.source}: valid_range: iteration with {bad}; re-run `capsim calibrate` with a larger "
                    "grid or set step_time.allow_extrapolation: true in the scenario")
            if not self._warned:
                self._warned = True
                say(f"valid_range:{self.source}", f"warning: {self.source}: extrapolating beyond valid_range ({bad}); "
                    "further extrapolations are not reported", self._stream)
        return self.inner.step_s(plan)


class Overheads:
    """Costs outside the model's forward pass, added around the step-time model:

    - KV conversion: dequantising compressed KV costs time per KV token read (reference section 7:
      the net gain of a compressed format is dD / beta - T_c);
    - weight offload: offloaded layers stream in over the host link every step; one prefetch
      buffer serialises copy and compute, two overlap them (step >= the copy time);
    - multi-LoRA: a cost per distinct adapter in the batch (grouped low-rank work);
    - swaps: KV moved between GPU and host memory before the iteration, over the host link.
    """

    def __init__(self, inner, host_link_bytes_per_s: float | None = None, kv_conversion_s_per_token: float = 0.0,
                 offload_copy_s: float = 0.0, prefetch_buffers: int = 2, per_adapter_s: float = 0.0):
        self.inner, self.link = inner, host_link_bytes_per_s
        self.conversion = kv_conversion_s_per_token
        self.copy_s, self.buffers = offload_copy_s, prefetch_buffers
        self.per_adapter_s = per_adapter_s

    def prefill_part_s(self, plan) -> float:
        """The inner model's prefill part."""
        return self.inner.prefill_part_s(plan)

    def step_s(self, plan) -> float:
        """The inner model's time plus conversion, offload, LoRA and swap costs."""
        t = self.inner.step_s(plan) + self.conversion * plan.kv_tokens_read
        if self.copy_s:
            t = offload_step_s(t, self.copy_s, self.buffers, 1)
        if self.per_adapter_s and plan.adapters:
            t += self.per_adapter_s * len(plan.adapters)
        if plan.swap_bytes:
            t += plan.swap_bytes / self.link
        return t


class WithDrafts:
    """Speculative rounds: the draft source's time is added to the verify step (or hidden behind it
    when overlapped), and a drafter that must prefill too stretches prefill by `prefill_overhead`."""

    def __init__(self, inner, prefill_overhead: float):
        self.inner, self.prefill_overhead = inner, prefill_overhead

    def prefill_part_s(self, plan) -> float:
        """The inner model's prefill part, stretched by the drafter's own prefill."""
        return self.inner.prefill_part_s(plan) * (1 + self.prefill_overhead)

    def step_s(self, plan) -> float:
        """The target's step, plus the drafter's prefill share and its draft time (or the larger of the two
        when drafting overlaps the step)."""
        t = self.inner.step_s(plan)
        if self.prefill_overhead and plan.prefill_seqs:
            t += self.prefill_overhead * self.inner.prefill_part_s(plan)
        if plan.draft_s:
            t = max(t, plan.draft_s) if plan.draft_overlapped else t + plan.draft_s
        return t
