"""Golden numbers of the reference chapter (tests/golden/reference.yaml), computed through capsim.

Each entry names a calculator below. A calculator only glues project calls together (load a
profile, call sim.models.spec / sim.models.memory / sim.models.roofline / sim.planning.valuation, pick a field, add or
divide project outputs); it never restates a formula with the chapter's constants. The test then
converts the result from SI base units (B, s, FLOP, fraction) into the entry's printed `unit`
and compares it with `expected` within `tol` (absolute, in that unit; 0 means exact).
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path

import pytest
import yaml

from sim.models import speculative as sp
from sim.planning import valuation as va
from sim.models.formats import kv_bytes_per_element, weight_bytes_per_element
from sim.models.memory import blocks_for, kv_footprint, offload_layout, tokens_stored, unified_memory_free
from sim.models.spec import ModelSpec
from sim.io.profiles import load_hardware, load_model
from sim.models.roofline import b_kv, causal_pairs, decode_reads, iteration_bytes, mbu, mfu, sequence_flops, time_lower_bound_s
from sim.io.units import GiB, KiB, MiB, parse_bytes

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "reference.yaml"

# Printed unit -> its size in SI base units (bytes, seconds, FLOPs, fractions).
UNITS: dict[str, float] = {
    "1": 1, "x": 1, "%": 0.01, "bits": 1, "count": 1, "tokens": 1, "blocks": 1,
    "B": 1, "KiB": KiB, "MiB": MiB, "GiB": GiB, "GB": 1e9,
    "s": 1, "ms": 1e-3, "GPU-s": 1, "J": 1,
    "FLOP": 1, "GFLOP": 1e9, "TFLOP": 1e12,
    "tokens/s": 1, "GB/s": 1e9, "TB/s": 1e12, "ms/MiB": 1e-3 / MiB,
}


@cache
def _spec(model: str) -> ModelSpec:
    return ModelSpec(load_model(model))


@cache
def _hw(name: str):
    return load_hardware(name)


def _link(hardware: str | None = None, link_gbs: float | None = None) -> float:
    """A link bandwidth from a hardware profile's host link, or an assumed one in GB/s."""
    return link_gbs * 1e9 if link_gbs is not None else va.host_link_bytes_per_s(_hw(hardware))


def _size(x) -> int:
    return parse_bytes(x)


# ---------------------------------------------------------------------------------------------
# Calculators: name -> f(**inputs) in SI base units.

_PARAMS = {"total": "total_params", "layer_matrix": "layer_matrix_params",
           "active_matrix": "active_matrix_params", "lm_head": "lm_head_params", "embedding": "embedding_params"}


def c_params(model, kind):
    return getattr(_spec(model), _PARAMS[kind])


def c_weight_bytes(model, fmt="bf16", read=False):
    s = _spec(model)
    return s.weight_read_bytes(fmt) if read else s.weight_bytes(fmt)


def c_matrix_weight_bytes(model, fmt="bf16"):
    s = _spec(model)
    return (s.layer_matrix_params + s.lm_head_params) * weight_bytes_per_element(fmt)


def c_instance_headroom(model, capacity, kv_budget):
    return va.instance_headroom_bytes(_size(capacity), _spec(model).weight_bytes(), _size(kv_budget))


def c_kv_per_token(model, fmt="bf16", gqa=True):
    s = _spec(model)
    return s.kv_bytes_per_token(fmt) if gqa else s.kv_bytes_per_token_without_gqa(fmt)


def c_kv_tokens(model, tokens, fmt="bf16", gqa=True, count=1):
    return count * va.kv_bytes_for_tokens(_spec(model), tokens, fmt, gqa)


def _footprint(model, prompt, output, requests=1, shared_prefix=0, fmt="bf16", block=16, budget=None):
    return kv_footprint(_spec(model), prompt, output, requests=requests, shared_prefix_tokens=shared_prefix,
                   kv_format=fmt, block_tokens=block, kv_budget_bytes=None if budget is None else _size(budget))


def c_kv_footprint(field, **kw):
    return getattr(_footprint(**kw), field)


def c_kv_sharing(field, **kw):
    """References held by block tables vs physical blocks, and the fraction saved."""
    p = _footprint(**kw)
    refs = p.requests * (p.shared_prefix_blocks + p.blocks_per_request)
    return {"references": refs, "physical": p.total_blocks, "reduction": 1 - p.total_blocks / refs}[field]


def c_kv_saved(model, tokens, to_fmt, from_fmt="bf16", output=1):
    return (_footprint(model, tokens, output, fmt=from_fmt).kv_bytes_per_request
            - _footprint(model, tokens, output, fmt=to_fmt).kv_bytes_per_request)


def c_tokens_stored(prompt, output):
    return tokens_stored(prompt, output)


def c_allocated_tokens(prompt, output, block=16):
    return blocks_for(tokens_stored(prompt, output), block) * block


def c_paged(lengths, block, field, shared_prefix=0, sharing=0):
    slots = va.paged_blocks(lengths, block, shared_prefix, sharing) * block
    return {"slots": slots, "unused": slots - sum(lengths)}[field]


def c_decode_reads(model, batch, context, field, hardware=None):
    hw = _hw(hardware) if hardware else None
    r = decode_reads(_spec(model), batch, context,
                     peak_flops_per_s=hw.peak_flops_per_s() if hw else None,
                     bandwidth_bytes_per_s=hw.bandwidth_bytes_per_s if hw else None)
    return getattr(r, field)


def c_decode_reads_ratio(model, context, batch_num, batch_den):
    return (decode_reads(_spec(model), batch_num, context).bytes_per_output_token
            / decode_reads(_spec(model), batch_den, context).bytes_per_output_token)


def c_b_kv(model, context):
    s = _spec(model)
    return b_kv(s.weight_read_bytes(), context, s.kv_bytes_per_token())


def c_iteration_bytes(model, kv_tokens, weights="read"):
    s = _spec(model)
    w = s.weight_read_bytes() if weights == "read" else s.weight_bytes()
    return iteration_bytes(w, s.kv_bytes_per_token(), kv_tokens)


def c_weight_read_time(model, hardware):
    hw = _hw(hardware)
    return time_lower_bound_s(0.0, _spec(model).weight_read_bytes(), hw.peak_flops_per_s(), hw.bandwidth_bytes_per_s)


def c_mbu(model, batch, context, hardware, measured_s):
    hw = _hw(hardware)
    return mbu(decode_reads(_spec(model), batch, context).bytes_per_iteration, measured_s, hw.bandwidth_bytes_per_s)


def c_effective_bandwidth(model, batch, context, hardware, measured_s):
    """MBU x peak bandwidth: the bandwidth a measured decode step actually achieved."""
    return c_mbu(model, batch, context, hardware, measured_s) * _hw(hardware).bandwidth_bytes_per_s


def c_host_overhead(model, batch, context, hardware, measured_s):
    """Measured step minus its roofline lower bound."""
    return measured_s - c_decode_reads(model, batch, context, "time_bound_s", hardware)


def c_flops(model, new, cached=0, logits=1, sequences=1):
    return sequences * sequence_flops(_spec(model), new, cached, logits)


def c_flops_ratio(model, num, den):
    return c_flops(model, **num) / c_flops(model, **den)


def c_prefill_mfu(model, new, hardware, measured_s, cached=0, logits=1, sequences=1):
    return mfu(c_flops(model, new, cached, logits, sequences), measured_s, _hw(hardware).peak_flops_per_s())


def c_causal_pairs(new, cached):
    return causal_pairs(new, cached)


def c_pairs_ratio(num, den):
    return c_causal_pairs(**num) / c_causal_pairs(**den)


def c_recompute(model, hardware, tokens, mfu, cached=0):
    return va.recompute_s(_spec(model), _hw(hardware), tokens, mfu, cached_tokens=cached)


def _prefix(model, hardware, prefix_tokens, p_hit, mfu, link_gbs=None):
    return va.value_prefix(_spec(model), _hw(hardware), prefix_tokens, p_hit, mfu,
                           link_bytes_per_s=None if link_gbs is None else _link(link_gbs=link_gbs))


def c_prefix_value(field, **kw):
    return getattr(_prefix(**kw), field)


def c_prefix_cache_value(field, cache_bytes, **kw):
    """Keep as many copies of one prefix as fit in a cache: total V_h, and V_h per cached byte."""
    v = _prefix(**kw)
    count = _size(cache_bytes) // v.prefix_bytes
    return {"count": count, "value_s": count * v.value_s, "value_s_per_byte": v.value_s_per_byte}[field]


def c_snapshot(matched, snapshots, field):
    restore, recompute = va.snapshot_restore(matched, snapshots)
    return {"restore": restore, "recompute": recompute}[field]


def c_format(kind, fmt, field, group=1):
    per_element = kv_bytes_per_element(fmt) if kind == "kv" else weight_bytes_per_element(fmt)
    base = kv_bytes_per_element("bf16") if kind == "kv" else weight_bytes_per_element("bf16")
    return {"bits": per_element * 8, "group_bytes": per_element * group, "of_bf16": per_element / base}[field]


def c_compressed_kv_net(model, context, to_fmt, conversion_s, bandwidth):
    beta = c_effective_bandwidth(model, **bandwidth)
    return va.compressed_kv_net_s(c_kv_saved(model, context, to_fmt), beta, conversion_s)


def c_unified_free(hardware, reserve, weights=None, weights_gib=None, kv=None):
    w = 0 if weights is None and weights_gib is None else (_size(weights) if weights is not None else weights_gib * GiB)
    free = unified_memory_free(_hw(hardware), _size(reserve), w)
    return free - (c_kv_footprint("kv_bytes_per_request", **kv) if kv else 0)


def c_ffn_bytes(model):
    return _spec(model).ffn_bytes_per_layer()


def c_ffn_copy(model, hardware=None, link_gbs=None):
    return va.transfer_s(_spec(model).ffn_bytes_per_layer(), _link(hardware, link_gbs))


def c_offload(model, layers, buffers, field, hardware=None, link_gbs=None):
    return getattr(offload_layout(_spec(model), layers, buffers, _link(hardware, link_gbs)), field)


def c_offload_extra_requests(model, layers, buffers, prompt, output):
    freed = offload_layout(_spec(model), layers, buffers, None).net_freed_bytes
    return freed // _footprint(model, prompt, output).kv_bytes_per_request


def c_offload_decode(model, layers, buffers, compute_step_s, batch, steps, field, hardware=None, link_gbs=None):
    r = va.offload_decode(_spec(model), layers, buffers, _link(hardware, link_gbs), compute_step_s, batch, steps)
    return getattr(r, field)


def c_compressed_transfer(size, ratio, field, hardware=None, link_gbs=None):
    return getattr(va.compressed_transfer(_size(size), ratio, _link(hardware, link_gbs)), field)


def c_compression_pays(ratio, decompress_gbs, hardware=None, link_gbs=None):
    return va.compression_pays(decompress_gbs * 1e9, _link(hardware, link_gbs), ratio)


def c_lora(model, rank, targets, count=1):
    return count * _spec(model).lora_adapter_bytes(rank, tuple(targets))


def c_decode_ceiling(model, fmt, bandwidth_gbs):
    return va.decode_ceiling_tokens_per_s(bandwidth_gbs * 1e9, _spec(model).weight_read_bytes(fmt))


def c_decode_throughput(batch, step_s):
    return va.decode_tokens_per_s(batch, step_s)


def c_little(rate_per_s, residence_s):
    return va.littles_law_in_system(rate_per_s, residence_s)


def c_amdahl(total_s, part_s, speedup, field):
    s = va.amdahl_speedup(part_s / total_s, speedup)
    return {"speedup": s, "time_s": total_s / s}[field]


def c_gpu_s(new_tokens, prefill_tokens_per_s, output_tokens, decode_calls_per_s, requests=1):
    return requests * va.gpu_s_per_request(new_tokens, prefill_tokens_per_s, output_tokens, decode_calls_per_s)


def c_cost_per_good(occupancy_s, num_good):
    return va.cost_per_good_result_s(occupancy_s, num_good)


def c_energy_per_good(occupancy_s, num_good, hardware):
    return va.energy_per_good_result_j(occupancy_s, _hw(hardware).tdp_w.value, num_good)


def c_expected_outputs(acceptance, drafts):
    return sp.expected_outputs_per_round([acceptance] * drafts)


def c_acceptance_rate(p, q):
    return sp.acceptance_rate(p, q)


def c_spec_per_token(round_s, outputs, weighted=True):
    """Mean per-token latency over rounds; `weighted: false` is the plain mean of per-round values."""
    if weighted:
        return sp.per_token_latency_s(round_s, outputs)
    return float(sp.per_round_latency_s(round_s, outputs).mean())


def c_spec_round(verify_s, draft_s):
    return sp.speculative_round_s(verify_s, draft_s)


def c_spec_per_token_at(acceptance, drafts, verify_s, draft_s=0.0):
    """Per-token time of rounds of `drafts` drafts at constant acceptance: round / E[N]."""
    return sp.per_token_latency_s(sp.speculative_round_s(verify_s, draft_s),
                                  sp.expected_outputs_per_round([acceptance] * drafts))


def c_spec_draft_budget(acceptance, drafts, step_s):
    return sp.draft_time_budget_s(sp.expected_outputs_per_round([acceptance] * drafts), step_s)


def c_spec_index_recovery(build_s, step_s, acceptance, drafts, verify_s, draft_s=0.0):
    """Tokens to repay an index build: plain decode is one output per step."""
    return sp.index_recovery_tokens(build_s, sp.per_token_latency_s(step_s, 1),
                                    c_spec_per_token_at(acceptance, drafts, verify_s, draft_s))


def c_spec_decode(output_tokens, round_s, outputs_per_round=1, first_token_s=0.0):
    return first_token_s + sp.decode_s(output_tokens, round_s, outputs_per_round)


def c_spec_rounds(output_tokens, outputs_per_round):
    return sp.rounds_needed(output_tokens, outputs_per_round)


def c_spec_verify(model, hardware, positions, context, mfu, field, step_s=None, sequences=1):
    """A verify's compute time at `mfu`, or the round: max(that, the measured plain step)."""
    hw, flops = _hw(hardware), sp.verify_flops(_spec(model), positions, context, sequences)
    if field == "compute_s":
        return sp.verify_compute_s(flops, hw.peak_flops_per_s(), mfu)
    return sp.verify_round_s(step_s, flops, hw.peak_flops_per_s(), mfu)


def c_spec_drafter(drafter_bytes, bandwidth, field, drafts=1, parallel=False, verify_s=None, outputs=None):
    """A memory-bound drafter at the bandwidth a measured decode step achieved (c_effective_bandwidth):
    one pass, the round's drafting, or the per-token time of (verify + drafting) / outputs."""
    pass_s = sp.drafter_pass_s(_size(drafter_bytes), c_effective_bandwidth(**bandwidth))
    draft_s = sp.drafting_s(drafts, pass_s, parallel)
    if field == "pass_s":
        return pass_s
    if field == "draft_s":
        return draft_s
    return sp.per_token_latency_s(sp.speculative_round_s(verify_s, draft_s), outputs)


CALCULATORS = {name[2:]: fn for name, fn in globals().items() if name.startswith("c_") and callable(fn)}


# ---------------------------------------------------------------------------------------------

def _entries() -> list[dict]:
    return yaml.safe_load(GOLDEN.read_text())["entries"]


def _params():
    for e in _entries():
        marks = [pytest.mark.xfail(strict=True, raises=AssertionError, reason=e["xfail"])] if e.get("xfail") else []
        yield pytest.param(e, id=e["id"], marks=marks)


def test_golden_file_is_well_formed():
    entries = _entries()
    ids = [e["id"] for e in entries]
    assert len(ids) == len(set(ids)), "duplicate ids"
    for e in entries:
        assert set(e) <= {"id", "source", "calc", "inputs", "unit", "expected", "tol", "xfail"}, e["id"]
        assert e["source"].startswith("reference §"), e["id"]
        assert e["calc"] in CALCULATORS, f"{e['id']}: unknown calculator {e['calc']!r}"
        assert isinstance(e["expected"], bool) or e["unit"] in UNITS, e["id"]
        assert isinstance(e["expected"], bool) or e["tol"] >= 0, e["id"]
    unused = set(CALCULATORS) - {e["calc"] for e in entries}
    assert not unused, f"calculators no entry uses: {sorted(unused)}"


@pytest.mark.parametrize("entry", list(_params()))
def test_reference_number(entry):
    got = CALCULATORS[entry["calc"]](**entry.get("inputs", {}))
    expected = entry["expected"]
    where = f"{entry['id']} ({entry['source']})"
    if isinstance(expected, bool):
        assert got is expected, f"{where}: got {got!r}, reference says {expected!r}"
        return
    value = float(got) / UNITS[entry["unit"]]
    tol = entry["tol"]
    if tol == 0:
        assert value == expected, f"{where}: got {value!r} {entry['unit']}, reference prints {expected} exactly"
    else:
        assert math.isclose(value, expected, rel_tol=0, abs_tol=tol * (1 + 1e-9)), (
            f"{where}: got {value:.6g} {entry['unit']}, reference prints {expected} (tol {tol})")
