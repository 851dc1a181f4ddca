#!/usr/bin/env python
"""Measured H200 step times (`capsim calibrate`'s torch reference) against the ops model's composition of the same
iterations (AIConfigurator's H200 kernel tables). Run by hand, never by the tests:
`python benchmarks/h200_measured_vs_composed.py [--out docs/fidelity/h200-measured-vs-composed.md]`.
Every ok point of the five H200 points CSVs in profiles/fitted/ becomes the StepPlan of its shape key (checked
against the row's features) and is timed by the model `capsim profile step` builds (h200-sxm, bf16, tp 1,
one_pass, default host overhead, no extrapolation); shapes beyond the tables are listed as skipped, with why."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from calibration.points import read_points  # noqa: E402
from calibration.shapes import KINDS, Shape  # noqa: E402
from sim.core.step import StepPlan  # noqa: E402
from sim.io.errors import ConfigError  # noqa: E402
from sim.io.ops_schema import OpsStepTime  # noqa: E402
from sim.io.profiles import load_hardware, load_model  # noqa: E402
from sim.models.ops_compose import build_composed_model, cli_layout, prefill_plan  # noqa: E402
from sim.models.spec import ModelSpec  # noqa: E402

FILES = ["h200-sxm__qwen3-8b__bf16", "h200-sxm__qwen3-8b__bf16__graphs", "h200-sxm__qwen3-8b__bf16__graphs__standard",
         "h200-sxm__llama-3.1-8b__bf16", "h200-sxm__llama-3.1-8b__bf16__graphs"]
COMMAND = "python benchmarks/h200_measured_vs_composed.py --out docs/fidelity/h200-measured-vs-composed.md"
CHECKED = "new_tokens pairs kv_tokens_read num_seqs decode_seqs decode_kv_tokens prefill_seqs prefill_tokens prefill_pairs"
_MODELS: dict = {}


def ops_model(model: str):
    """The ops model `capsim profile step --model M --hardware h200-sxm --tp 1` builds (cached per model)."""
    if model not in _MODELS:
        spec = ModelSpec(load_model(model))
        _MODELS[model] = build_composed_model(OpsStepTime(tp=1), spec, load_hardware("h200-sxm"),
                                              cli_layout(spec, 1, 1, 1), "bf16", False)
    return _MODELS[model]


def plan_of(row: dict) -> StepPlan:
    """The StepPlan of a points row's shape key, checked against the row's recorded features."""
    plan = StepPlan()
    for g in sorted(Shape.parse(row["key"]).groups, key=lambda g: not g.is_decode):  # decodes first, as profile step
        if g.is_decode:  # what sim.models.ops_compose.decode_plan does, once per decode group
            plan.add_decodes(g.count, g.count * g.cached, g.cached + 1)
        else:
            prefill_plan(g.count, g.new, g.cached, plan)
    bad = [f for f in CHECKED.split() if getattr(plan, f) != row[f]]
    if bad:
        raise SystemExit(f"{row['key']}: plan features {bad} differ from the points row")
    return plan


def compare(name: str, fitted: Path) -> dict:
    """Measured and composed time of every ok row of one points file."""
    pts = read_points(fitted / f"{name}.csv")
    model = ops_model(pts.meta["model"])
    rows, skipped = [], []
    for r in pts.ok_rows:
        try:
            composed = model.step_s(plan_of(r))
        except ConfigError as exc:  # beyond the tables: the model's own reason, no extrapolation
            skipped.append((r["key"], " ".join(exc.lines)))
        else:
            rows.append(dict(key=r["key"], kind=r["kind"], measured=r["time_s"], composed=composed, mfu=r["mfu"],
                             mbu=r["mbu"], ratio=r["time_s"] / composed, err=abs(composed - r["time_s"]) / r["time_s"],
                             graph=r["note"] == "cuda graph"))
    return dict(name=name, meta=pts.meta, rows=rows, skipped=skipped)


def summary(results: list[dict]) -> list[str]:
    """One line per file and kind: n, skipped, median / p90 (linear interpolation) of ratio and relative error."""
    out = ["| file | kind | n | skipped | ratio median | ratio p90 | err median | err p90 |",
           "|---|---|---:|---:|---:|---:|---:|---:|"]
    for res in results:
        for kind in KINDS:
            rows = [r for r in res["rows"] if r["kind"] == kind]
            skip = sum(1 for k, _ in res["skipped"] if k.startswith(kind + ":"))
            q = [np.percentile([r[c] for r in rows], p) if rows else np.nan for c in ("ratio", "err") for p in (50, 90)]
            out.append(f"| {res['name']} | {kind} | {len(rows)} | {skip} | {q[0]:.2f} | {q[1]:.2f} | "
                       f"{q[2]:.0%} | {q[3]:.0%} |")
    return out


def file_table(res: dict) -> list[str]:
    """The per-point table of one file, then its skipped shapes with the model's reason."""
    m = res["meta"]
    out = [f"### {res['name']}", "", f"{m['model']}, {m.get('device_name')}, cuda_graphs={m['cuda_graphs']}, layers "
           f"timed {m['layers_timed']}/{m['layers_total']} (times scaled to all), torch {m.get('torch')}; `graph`: "
           "replayed as a CUDA graph.", "",
           "| key | measured ms | composed ms | ratio | MFU | MBU |", "|---|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        key = f"`{r['key']}`" + (" graph" if r["graph"] else "")
        out.append(f"| {key} | {r['measured'] * 1e3:.2f} | {r['composed'] * 1e3:.2f} | {r['ratio']:.2f} | "
                   f"{r['mfu']:.3f} | {r['mbu']:.3f} |")
    out += [""] + [f"- skipped `{k}`: {why}" for k, why in res["skipped"]]
    return out


def _span(res: dict, pred, f=lambda r: r["measured"] * 1e3) -> str:
    """'lo-hi' of f(row) over a file's rows satisfying pred (ms by default)."""
    v = [f(r) for r in res["rows"] if pred(r)] or [float("nan")]
    return "-".join(f"{x:.{1 if max(v) > 5 else 2}f}" for x in (min(v), max(v)))


def _med(res: dict, pred) -> float:
    """Median ratio over a file's rows satisfying pred (nan when none)."""
    v = [r["ratio"] for r in res["rows"] if pred(r)]
    return float(np.median(v)) if v else float("nan")


def non_monotone(res: dict) -> list[str]:
    """Points measured >10% slower than one of the same kind with at least as much work in every group."""
    out, rows = [], [(r, Shape.parse(r["key"]).groups) for r in res["rows"]]
    for a, ga in rows:
        for b, gb in rows:
            more = a is not b and a["kind"] == b["kind"] and len(ga) == len(gb) and all(
                y.count >= x.count and y.new >= x.new and y.cached >= x.cached for x, y in zip(ga, gb))
            if more and a["measured"] > 1.1 * b["measured"]:
                out.append(f"`{a['key']}` {a['measured'] * 1e3:.1f} ms > `{b['key']}` {b['measured'] * 1e3:.1f} ms")
    return out


def findings(results: list[dict]) -> list[str]:
    """A short factual paragraph, its numbers taken from the results."""
    by = {r["name"].split("__", 1)[1]: r for r in results}
    qe, qg, le, lg, std = (by[k] for k in ("qwen3-8b__bf16", "qwen3-8b__bf16__graphs", "llama-3.1-8b__bf16",
                                           "llama-3.1-8b__bf16__graphs", "qwen3-8b__bf16__graphs__standard"))
    dec, pre, mix = ((lambda r, k=k: r["kind"] == k) for k in ("decode", "prefill", "mixed"))
    comp, diff = (lambda r: r["composed"] * 1e3), (lambda r: (r["measured"] - r["composed"]) * 1e3)
    long = lambda r: pre(r) and r["measured"] > 0.2  # noqa: E731
    keyed = {r["key"]: r for r in std["rows"]}
    pairs = [(m, keyed[p]) for m in std["rows"] if mix(m) and (p := "prefill:" + m["key"].split("+")[1]) in keyed]
    chunk = {"rows": [{k: m[k] - p[k] for k in ("measured", "composed")} for m, p in pairs]}  # mixed minus its chunk
    x8k = [keyed.get(f"prefill:1x8192@{c}", {"ratio": float("nan")})["ratio"] for c in (0, 8192)]
    odd = sum((non_monotone(r) for r in results), [])
    return [
        f"Eager decode is launch-bound: eager decode steps measure {_span(qe, dec)} ms for Qwen3-8B ({_span(le, dec)} "
        f"ms Llama-3.1-8B) at any batch of 1-64 and 512-2048 cached tokens, where the composition gives "
        f"{_span(qe, dec, comp)} ms ({_span(le, dec, comp)}); an eager 1 x 128-token prefill "
        f"({_span(qe, lambda r: r['key'].startswith('prefill:1x128@'))} ms) sits on the same floor. CUDA-graph replay "
        f"of the decode shapes brings them to {_span(qg, dec)} ms ({_span(lg, dec)}), median ratio {_med(qg, dec):.2f} "
        f"({_med(lg, dec):.2f}). What remains is a near-constant offset: measured minus composed is "
        f"{_span(std, dec, diff)} ms on every graphed Qwen3 decode point of the standard grid (batch 1-256, 128-8192 "
        f"cached; Llama {_span(lg, dec, diff)} ms), so the ratio is largest where steps are shortest "
        f"({_med(std, lambda r: dec(r) and r['composed'] < 0.008):.2f} where the composed step is under 8 ms, "
        f"{_med(std, lambda r: dec(r) and r['composed'] > 0.02):.2f} above 20 ms), consistent with a fixed cost per "
        f"kernel: the reference runs RMSNorm (in fp32, in pieces), RoPE, SiLU-and-mul, residual adds and Qwen3's q/k "
        f"norms unfused, the tables' kernels are fused, and the composition adds "
        f"{ops_model('qwen3-8b').host_s * 1e3:.3f} ms host time. Prefill and mixed steps are never graphed (the "
        f"`graphs` files time them eagerly too: Qwen3 prefill median ratio {_med(qg, pre):.2f} there, "
        f"{_med(qe, pre):.2f} in the eager file). Prefills over 200 ms are "
        f"compute-bound: the reference reaches MFU {_span(std, long, lambda r: r['mfu'])} where the composition "
        f"implies {_span(std, long, lambda r: r['mfu'] * r['ratio'])} for the same FLOPs, and the gap grows with "
        f"cached context (1 x 8192 tokens: {x8k[0]:.2f}x at 0 cached, {x8k[1]:.2f}x at 8192): SDPA over a cached "
        f"prefix is further from the tables' context-attention kernel than torch's GEMMs are from theirs. Mixed steps "
        f"(one 512- or 2,048-token chunk plus 1-64 decodes, eager) add {_span(chunk, bool)} ms to their chunk's own "
        f"prefill where the one-pass composition adds {_span(chunk, bool, comp)} ms (standard grid, uncached chunks), "
        f"so their ratio (median {_med(std, mix):.2f}) is mostly the chunk's. These ratios compare an unfused torch "
        f"reference with TensorRT-LLM-class kernel tables: they measure the distance between the two, not the ops "
        f"model's error against a serving engine.", "",
        "Measured times that fall although the work grows (same kind, every group at least as large; each point's "
        "repeats are in its CSV): " + ("; ".join(odd) if odd else "none") + "."]


def render(results: list[dict]) -> str:
    """The markdown document."""
    lines = ["# H200: measured reference steps vs the composed ops model", "",
             f"Regenerate: `{COMMAND}`", "",
             "Measured: `capsim calibrate` on one NVIDIA H200 (torch reference transformer, random BF16 weights, unfused "
             "ops; `graphs` files replay decode shapes as CUDA graphs), points in profiles/fitted/. Composed: `kind: ops`"
             " on the h200-sxm tables, bf16, tp 1, one_pass, default host overhead, for exactly each point's iteration "
             "(as `capsim profile step`). ratio = measured / composed; err = |composed - measured| / measured.", "",
             "## Summary", ""]
    lines += summary(results) + ["", "## What the numbers say", ""] + findings(results) + ["", "## Points", ""]
    lines += sum((file_table(res) + [""] for res in results), [])
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    """Compare, write the markdown, print the summary."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "docs/fidelity/h200-measured-vs-composed.md"), help="markdown file to write")
    ap.add_argument("--fitted", default=str(ROOT / "profiles/fitted"), help="folder of the points CSVs")
    args = ap.parse_args(argv)
    results, out = [compare(name, Path(args.fitted)) for name in FILES], Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(results))
    print("\n".join(summary(results)) + f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
