"""`capsim profile compose`: a fitted profile (sim.io.profiles.FittedProfile) from the ops model.

The ops model (sim.models.ops) is evaluated on a grid of iterations -- decode batches at several
contexts, single prompts, batched prompts, chunks over cached prefixes and mixed iterations -- and
summarised in the two kinds a fitted profile holds:

- `efficiency`: decode_table = the composed decode time of one sequence at 1..512 cached tokens, then
  along batch 1..max_batch at 1,024 cached tokens, then max_batch at growing context (indexed by weight + KV bytes, as the efficiency model
  reads it); prefill_mfu = FLOPs / (tp x peak x composed time) of single prompts of 16..max_new_tokens
  tokens, held flat below 16 (prompts that short are underestimated: use kind ops for them);
  peak_tflops = tp x the card's dense peak; `mixed` as composed;
- `linear`: least-squares fit of the linear model's six features to every grid point but each
  fifth, whose error is reported in `fit` (held out).
Both are approximations of the composition; the notes give each one's error on the whole grid.
"""

from __future__ import annotations

import datetime as _dt
import math
from pathlib import Path

import numpy as np

from sim.core.request import Request
from sim.core.step import StepPlan
from sim.io.errors import ConfigError
from sim.io.ops_schema import OpsStepTime
from sim.io.profiles import (EfficiencyStepTime, FittedProfile, FitSummary, LinearStepTime, Provenance, ValidRange,
                             load_fitted, load_hardware, load_model)
from sim.io.schema import dump_yaml, validate_mapping
from sim.models.ops import OpsModel
from sim.models.parallel import Layout, layout_problems
from sim.models.parallel_ops import build_replica_ops_model
from sim.models.roofline import forward_flops
from sim.models.spec import ModelSpec
from sim.models.step_time import EfficiencyModel, LinearModel

DECODE_CONTEXT = 1024
LINEAR_FEATURES = ("constant_s", "per_new_token_s", "per_pair_s", "per_kv_token_s", "per_sequence_s",
                   "per_decode_sequence_s")


def decode_plan(batch: int, context: int) -> StepPlan:
    """`batch` decode sequences of `context` cached tokens each."""
    p = StepPlan()
    p.add_decodes(batch, batch * context, context + 1)
    return p


def prefill_plan(seqs: int, new: int, cached: int = 0, plan: StepPlan | None = None) -> StepPlan:
    """`seqs` prompts computing `new` tokens after `cached` ones (finishing their prefill), added to `plan`."""
    p = plan if plan is not None else StepPlan()
    for i in range(seqs):
        r = Request(i, 0.0, cached + new, 1, 0.0)
        r.computed_tokens = cached
        p.add(r, new)
    return p


def _features(p: StepPlan) -> list[float]:
    return [1.0, p.new_tokens, p.pairs, p.kv_tokens_read, p.num_seqs, p.decode_seqs]


def _powers(lo: int, hi: int) -> list[int]:
    out, x = [], lo
    while x < hi:
        out.append(x)
        x *= 2
    return out + [hi]


def composition_grid(max_batch: int, max_new: int, max_context: int) -> list[StepPlan]:
    """The iterations a composed profile is fitted on and checked against."""
    plans = []
    contexts = [c for c in _powers(128, max_context)]
    for b in _powers(1, max_batch):
        for c in contexts:
            if b * c <= 4 * 1024 * 1024:
                plans.append(decode_plan(b, c))
    for n in _powers(16, max_new):
        plans.append(prefill_plan(1, n))
    for b in (2, 4, 8):
        for n in _powers(128, max(128, max_new // b)):
            plans.append(prefill_plan(b, n))
    for n in _powers(256, min(max_new, 8192)):
        for h in (2048, 8192):
            if n + h <= max_context:
                plans.append(prefill_plan(1, n, h))
    for b in _powers(4, max_batch):
        for n in _powers(256, min(max_new - b, 4096)):
            plans.append(prefill_plan(1, n, 0, decode_plan(b, DECODE_CONTEXT)))
    return plans


def _efficiency(model: OpsModel, spec: ModelSpec, weight_format: str, kv_bytes: float, peak: float,
                max_batch: int, max_new: int, max_context: int) -> EfficiencyStepTime:
    w = spec.weight_read_bytes(weight_format)
    table = {}
    for c in (1, 128, 512):  # a first decode reads little KV: the table starts at the weights alone
        table[w + c * kv_bytes] = model.step_s(decode_plan(1, c))
    for b in _powers(1, max_batch):
        table[w + b * DECODE_CONTEXT * kv_bytes] = model.step_s(decode_plan(b, DECODE_CONTEXT))
    for c in _powers(2 * DECODE_CONTEXT, max_context):
        table[w + max_batch * c * kv_bytes] = model.step_s(decode_plan(max_batch, c))
    mfu = []
    for n in _powers(16, max_new):
        p = prefill_plan(1, n)
        mfu.append({"new_tokens": n, "mfu": min(forward_flops(spec, n, p.prefill_pairs, 1) / (peak * model.step_s(p)), 1.0)})
    # below 16 tokens held flat: a prefill that small is bandwidth bound, which FLOPs / MFU cannot say, and
    # the decode part's FLOPs bound (at the MFU of its positions) must not undercut the decode table
    mfu.insert(0, {"new_tokens": 1, "mfu": mfu[0]["mfu"]})
    return EfficiencyStepTime.model_validate({
        "decode_table": [{"bytes": float(x), "time_s": table[x]} for x in sorted(table)],
        "prefill_mfu": mfu, "peak_tflops": peak / 1e12, "mixed": model.mixed})


def _linear(plans: list[StepPlan], times: list[float]) -> tuple[LinearStepTime, FitSummary]:
    x = np.array([_features(p) for p in plans])
    y = np.array(times)
    held = np.arange(len(y)) % 5 == 4
    scale = np.abs(x[~held]).max(axis=0)
    scale[scale == 0] = 1.0
    coef, *_ = np.linalg.lstsq(x[~held] / scale / y[~held, None], np.ones((~held).sum()), rcond=None)
    coef = coef / scale  # least squares on relative error: short and long iterations count alike
    coef[0] = max(coef[0], 0.0)
    lin = LinearStepTime.model_validate(dict(zip(LINEAR_FEATURES, (float(c) for c in coef))))
    pred = np.array([LinearModel(lin).step_s(p) for p in plans])
    rel = np.abs(pred - y) / y
    ss = float(((y - y.mean()) ** 2).sum())
    fit = FitSummary(n_points=int((~held).sum()), n_heldout=int(held.sum()), mape=float(rel[held].mean()),
                     max_abs_rel_err=float(rel[held].max()), r2=1 - float(((pred - y) ** 2).sum()) / ss if ss else None)
    return lin, fit


def cli_layout(spec: ModelSpec, tp: int = 1, pp: int = 1, ep: int = 1) -> Layout:
    """The replica layout of `--tp/--pp/--ep`, refused (naming the flag and the allowed values) when the
    model cannot take it."""
    for flag, v in (("tp", tp), ("pp", pp), ("ep", ep)):
        if v < 1:
            raise ConfigError(f"--{flag}: expected a positive GPU count, got {v}")
    layout = Layout(tp=tp, pp=pp, ep=ep)
    problems = layout_problems(spec, layout, "layout")
    if problems:
        flags = [p.replace("layout.", "--", 1) for p in problems]
        raise ConfigError([p.replace("--attention_dp", "--attention-dp", 1) for p in flags])
    return layout


def build_composed_model(cfg: OpsStepTime, spec: ModelSpec, hw, layout: Layout, weight_format: str,
                         allow_extrapolation: bool = False) -> OpsModel:
    """The ops model of one replica of `layout`: dense, MoE or MLA, one GPU or several."""
    return build_replica_ops_model(cfg.model_copy(update={"tp": layout.tp}), spec, hw, layout, weight_format, "bf16",
                                   allow_extrapolation)


def compose_profile(model: str, hardware: str, tp: int = 1, dtype: str | None = None, tables: str | None = None,
                    mixed: str = "one_pass", host_overhead_s: float | None = None, max_batch: int = 256,
                    max_new_tokens: int = 8192, max_context: int | None = None,
                    all_reduce: str = "nccl", pp: int = 1, ep: int = 1) -> tuple[FittedProfile, dict]:
    """Compose the profile of one replica of tp x pp GPUs (ep of them holding the experts of a MoE
    model); returns it and the composition's report (errors of each summary)."""
    prof, hw = load_model(model), load_hardware(hardware)
    spec = ModelSpec(prof)
    weight_format = dtype or "bf16"
    layout = cli_layout(spec, tp, pp, ep)
    cfg = OpsStepTime(tables=tables, dtype=dtype, tp=tp, mixed=mixed, host_overhead_s=host_overhead_s,
                      all_reduce=all_reduce)
    ops = build_composed_model(cfg, spec, hw, layout, weight_format)
    max_context = max_context or min(prof.max_position_embeddings, 32768)
    gemm_max = int(min(c.ms[-1] for c in ops.gemms.values()))
    if max_new_tokens > gemm_max:
        raise ConfigError(f"--max-new-tokens {max_new_tokens}: the GEMM table of {ops.tables.name} stops at "
                          f"m = {gemm_max} tokens")
    kv_bytes = spec.kv_bytes_per_token("bf16")
    peak = tp * hw.peak_flops_per_s(ops.dtype)
    plans = composition_grid(max_batch, max_new_tokens, max_context)
    times = [ops.step_s(p) for p in plans]
    eff = _efficiency(ops, spec, weight_format, kv_bytes, peak, max_batch, max_new_tokens, max_context)
    lin, fit = _linear(plans, times)
    effm = EfficiencyModel(eff, spec, spec.weight_read_bytes(weight_format), kv_bytes, peak, True)
    err = {"efficiency": _errors([effm.step_s(p) for p in plans], times),
           "linear": _errors([LinearModel(lin).step_s(p) for p in plans], times)}
    shape = f"tensor parallel {tp}" + (f", pipeline {pp}" if pp > 1 else "") + (f", expert parallel {ep}" if ep > 1 else "")
    kinds = ", ".join(k for k, on in (("MoE", prof.moe is not None), ("MLA", prof.mla is not None)) if on)
    notes = (f"Composed from measured kernel tables by sim.models.ops (kind ops): tables {ops.tables.name}, "
             f"GEMM dtype {ops.dtype}, {shape}{' (' + kinds + ')' if kinds else ''} (times are for one replica of "
             f"{layout.gpus} GPU(s); efficiency peak_tflops = {tp} x the card's dense peak), mixed iterations {mixed}, host overhead "
             f"{ops.host_s * 1e3:.3f} ms per iteration, {all_reduce} all-reduce. Error against the composition over the {len(plans)} grid "
             f"iterations: efficiency median {err['efficiency'][0]:.1%} / max {err['efficiency'][1]:.1%}; "
             f"linear median {err['linear'][0]:.1%} / max {err['linear'][1]:.1%}. For exact composed times use "
             f"step_time.model: {{kind: ops, tables: {ops.tables.name}, tp: {tp}, dtype: {ops.dtype}"
             f"{'' if all_reduce == 'nccl' else ', all_reduce: ' + all_reduce}}}"
             f"{f' with parallel: {{tp: {tp}, pp: {pp}, ep: {ep}}}' if (pp > 1 or ep > 1) else ''}.")
    data = {
        "model": prof.name, "hardware": hw.name, "dtype": ops.dtype if ops.dtype in ("fp8", "nvfp4") else "bf16",
        "cuda_graphs": True, "linear": lin, "efficiency": eff,
        "valid_range": ValidRange(max_batch=max_batch, max_new_tokens=max_new_tokens, max_context_tokens=max_context),
        "parallel": {"tp": tp, "pp": pp, "ep": ep},
        "fit": fit,
        # the named set under profiles/ops whose published check applies (not a folder given by path)
        "composed_from": ops.tables.name if tables is None or ("/" not in tables and "\\" not in tables) else None,
        "provenance": Provenance(source=f"capsim profile compose; kernel tables profiles/ops/{ops.tables.name}: {ops.tables.source()}",
                                 date=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
                                 grid=f"{len(plans)} iterations: decode batch 1-{max_batch} x context 128-{max_context}, "
                                      f"prompts 16-{max_new_tokens} tokens (batch 1-8), chunks over 2K/8K cached "
                                      f"tokens, mixed decode + prefill", notes=notes),
    }
    profile = validate_mapping(FittedProfile, _plain(data), "composed profile")
    return profile, {"grid_points": len(plans), "errors": err}


def _errors(pred: list[float], want: list[float]) -> tuple[float, float]:
    rel = np.abs(np.array(pred) - np.array(want)) / np.array(want)
    return float(np.median(rel)), float(rel.max())


def _plain(v):
    if hasattr(v, "model_dump"):
        return v.model_dump(mode="json", exclude_none=True)
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items() if x is not None}
    return v


def write_composed(profile: FittedProfile, path: str | Path, command: str) -> FittedProfile:
    """Write the YAML (with the command that made it as a comment) and read it back through load_fitted."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = dump_yaml(profile.model_dump(mode="json", exclude_none=True), sort_keys=False, width=110)
    path.write_text(f"# Written by `{command}`.\n# Schema: sim.io.profiles.FittedProfile.\n{body}", encoding="utf-8")
    back = load_fitted(path)
    if not math.isclose(back.efficiency.decode_table[0].time_s, profile.efficiency.decode_table[0].time_s):
        raise AssertionError(f"{path}: profile changed in the YAML round trip")
    return back
