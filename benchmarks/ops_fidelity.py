#!/usr/bin/env python
"""Sanity checks of the ops step-time model (sim.models.ops) against measurements it was not built from.
Run by hand (needs ../shared/data), never by the test suite:

    python benchmarks/ops_fidelity.py [--data ../shared/data] [--json OUT.json] [--all-reduce trtllm]

1. kernels: the AIConfigurator GEMM tables (what `ops` composes) against Vidur's independent per-layer
   GEMM measurements (profiling/vidur/compute/*/mlp.csv): QKV, O, gate/up, down at every token count
   and TP degree; median and p90 of predicted / measured.
2. splitwise: Llama-2-70B TP8 on H100 and A100 (profiling/splitwise_sim/perf_model.csv): decode
   iteration (`token_time`, batch 1-64 at 512-token prompts) and prefill (`prompt_time`, batch 1,
   128-8192 tokens) against the composed steps (no host overhead: a 2023 engine).
3. silicon: the closed-loop serving rows of benchmarks/aiconfigurator_silicon_sample.csv that kind ops
   can express (dense, agg, BF16/FP8 tables on the card): an analytic closed-loop TPOT
   (steady state: each of C users' requests decodes O tokens at batch C, context I + O/2, while the other
   C - 1 users each prefill once, costed under each mixed rule), TPOT only. The per-iteration host
   overhead is fitted (median residual) on the TRT-LLM H100 Llama-3.1-8B rows and then held fixed for
   every other group; each group is also reported with no host overhead. This is a check of the step
   model, not of the simulator: `capsim validate-published` simulates the rows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.io.ops_schema import OpsStepTime  # noqa: E402
from sim.io.profiles import load_hardware, load_model  # noqa: E402
from sim.models.ops import build_ops_model  # noqa: E402
from sim.models.ops_compose import decode_plan, prefill_plan  # noqa: E402
from sim.models.ops_tables import load_table_set  # noqa: E402
from sim.models.spec import ModelSpec  # noqa: E402

VIDUR = [("h100", "h100-sxm", "Llama-2-7b-hf"), ("h100", "h100-sxm", "Llama-2-70b-hf"),
         ("a100", "a100-80g-sxm", "Llama-2-7b-hf"), ("a100", "a100-80g-sxm", "Meta-Llama-3-8B")]
SILICON_MODELS = {"meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b", "meta-llama/Llama-3.1-70B": "llama-3.1-70b"}
SILICON_CARDS = {"h100_sxm": "h100-sxm", "b200_sxm": "b200"}
FIT_GROUP = ("trtllm", "h100_sxm", "meta-llama/Llama-3.1-8B-Instruct")


def kernels(data: Path) -> list[dict]:
    """Composed GEMMs vs Vidur's per-layer GEMMs."""
    out = []
    for gpu, tables, model in VIDUR:
        d = pd.read_csv(data / f"profiling/vidur/compute/{gpu}/meta-llama/{model}/mlp.csv")
        g = load_table_set(tables).gemm("bf16")
        for name, col in [("qkv", "attn_pre_proj"), ("o", "attn_post_proj"), ("gate_up", "mlp_up_proj"),
                          ("down", "mlp_down_proj")]:
            ratios = []
            for r in d.itertuples(index=False):
                tp, hd = r.num_tensor_parallel_workers, r.n_embd // r.n_head
                n, k = {"qkv": ((r.n_head + 2 * r.n_kv_head) * hd / tp, r.n_embd), "o": (r.n_embd, r.n_head * hd / tp),
                        "gate_up": (2 * r.n_expanded_embd / tp, r.n_embd), "down": (r.n_embd, r.n_expanded_embd / tp)}[name]
                if r.num_tokens > g.ms[-1]:
                    continue
                ratios.append(g.at(r.num_tokens, n, k) / (getattr(r, f"_{list(d.columns).index(f'time_stats.{col}.median')}") * 1e-3))
            ratios = np.array(ratios)
            out.append({"card": tables, "model": model, "gemm": name, "n": len(ratios),
                        "median_ratio": float(np.median(ratios)), "p10": float(np.percentile(ratios, 10)),
                        "p90": float(np.percentile(ratios, 90))})
    return out


def splitwise(data: Path) -> list[dict]:
    """Composed Llama-2-70B TP8 steps vs Splitwise's measured iterations."""
    d = pd.read_csv(data / "profiling/splitwise_sim/perf_model.csv")
    d = d[(d.model == "llama2-70b") & (d.tensor_parallel == 8)]
    spec = ModelSpec(load_model("llama-2-70b"))
    out = []
    for hw_name, card in [("h100-80gb", "h100-sxm"), ("a100-80gb", "a100-80g-sxm")]:
        ops = build_ops_model(OpsStepTime(tp=8, host_overhead_s=0.0), spec, load_hardware(card), "bf16", "bf16", True)
        x = d[d.hardware == hw_name].groupby(["prompt_size", "batch_size"], as_index=False)[["prompt_time", "token_time"]].median()
        for r in x.itertuples(index=False):
            dec = ops.step_s(decode_plan(int(r.batch_size), int(r.prompt_size) + 64)) * 1e3
            pre = ops.step_s(prefill_plan(int(r.batch_size), int(r.prompt_size))) * 1e3
            out.append({"card": card, "prompt": int(r.prompt_size), "batch": int(r.batch_size),
                        "token_ms": float(r.token_time), "composed_decode_ms": dec,
                        "prompt_ms": float(r.prompt_time), "composed_prefill_ms": pre})
    return out


def _tpot(ops, c: int, isl: int, osl: int, mixed: str) -> float:
    """Analytic closed-loop TPOT without host overhead, and the number of iterations per output token."""
    ctx = isl + osl // 2
    dec = ops.step_s(decode_plan(c, ctx)) - ops.host_s
    pre_alone = ops.step_s(prefill_plan(1, isl)) - ops.host_s
    if mixed == "sum" or c == 1:
        extra = pre_alone
    else:
        extra = ops.step_s(prefill_plan(1, isl, 0, decode_plan(c - 1, ctx))) - ops.step_s(decode_plan(c - 1, ctx))
    return dec + (c - 1) / osl * extra


ALL_REDUCE = "nccl"
"""Whose all-reduce the composed steps use (step_time.model.all_reduce; --all-reduce)."""


def silicon(data: Path) -> tuple[list[dict], dict]:
    """Analytic closed-loop TPOT on the expressible agg rows; host overhead fitted on FIT_GROUP."""
    d = pd.read_csv(data / "benchmarks/aiconfigurator_silicon_sample.csv")
    d = d[(d["mode"] == "agg") & d.model_path.isin(list(SILICON_MODELS)) & d.system.isin(list(SILICON_CARDS))]
    d = d[d.pp_size.fillna(1) == 1]
    rows, models = [], {}
    for r in d.itertuples(index=False):
        dtype = "fp8" if str(r.gemm_quant_mode) == "fp8" else ("bf16" if str(r.gemm_quant_mode) in ("nan", "bf16") else None)
        card = SILICON_CARDS[r.system]
        if dtype is None or (dtype == "fp8" and card != "h100-sxm"):
            continue
        key = (r.model_path, card, int(r.tp_size), dtype)
        if key not in models:
            spec = ModelSpec(load_model(SILICON_MODELS[r.model_path]))
            models[key] = {m: build_ops_model(OpsStepTime(tp=int(r.tp_size), mixed=m, host_overhead_s=0.0,
                                                          all_reduce=ALL_REDUCE), spec,
                                              load_hardware(card), dtype, "bf16", True) for m in ("one_pass", "sum")}
        c, isl, osl = int(r.batch_size), int(r.isl), int(r.osl)
        row = {"id": r.id, "backend": r.backend, "system": r.system, "model": SILICON_MODELS[r.model_path],
               "tp": int(r.tp_size), "dtype": dtype, "concurrency": c, "isl": isl, "osl": osl,
               "measured_tpot_ms": float(r.silicon_tpot_ms)}
        for m, ops in models[key].items():
            row[f"tpot0_{m}_ms"] = _tpot(ops, c, isl, osl, m) * 1e3
        row["iters_per_token"] = 1 + (c - 1) / osl  # decode iterations plus (under sum) the others' prefills
        rows.append(row)
    fit = {}
    for m in ("one_pass", "sum"):
        f = [r for r in rows if (r["backend"], r["system"], SILICON_MODEL_PATH(r)) == FIT_GROUP]
        per_iter = [(r["measured_tpot_ms"] - r[f"tpot0_{m}_ms"]) / (1 + ((r["concurrency"] - 1) / r["osl"] if m == "sum" else 0))
                    for r in f]
        fit[m] = float(np.median(per_iter)) if per_iter else 0.0
        for r in rows:
            iters = 1 + ((r["concurrency"] - 1) / r["osl"] if m == "sum" else 0)
            r[f"tpot_{m}_ms"] = r[f"tpot0_{m}_ms"] + fit[m] * iters
    return rows, {"host_overhead_ms": fit, "fit_rows": len([r for r in rows if (r['backend'], r['system'], SILICON_MODEL_PATH(r)) == FIT_GROUP])}


def SILICON_MODEL_PATH(row: dict) -> str:  # noqa: N802 - the inverse of SILICON_MODELS
    """The silicon sample's model_path of a row's capsim model."""
    return {v: k for k, v in SILICON_MODELS.items()}[row["model"]]


def summarise(rows: list[dict]) -> list[dict]:
    """Median / p90 absolute relative TPOT error per (backend, system, model, dtype), per mixed rule."""
    out = []
    df = pd.DataFrame(rows)
    for key, g in df.groupby(["backend", "system", "model", "dtype", "tp"]):
        rec = dict(zip(["backend", "system", "model", "dtype", "tp"], key), n=len(g),
                   fitted_on=key[:3] == (FIT_GROUP[0], FIT_GROUP[1], SILICON_MODELS[FIT_GROUP[2]]))
        for col in ("tpot_one_pass_ms", "tpot_sum_ms", "tpot0_one_pass_ms", "tpot0_sum_ms"):
            e = (g[col] - g.measured_tpot_ms).abs() / g.measured_tpot_ms
            s = (g[col] - g.measured_tpot_ms) / g.measured_tpot_ms
            rec[col.replace("_ms", "")] = {"median_abs_err": float(e.median()), "p90_abs_err": float(e.quantile(0.9)),
                                           "median_signed_err": float(s.median())}
        out.append(rec)
    return out


def main() -> int:
    """Print every check; --json writes the rows too."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    ap.add_argument("--json", help="write every row and summary here")
    ap.add_argument("--all-reduce", choices=["nccl", "vllm", "sglang", "trtllm"], default="nccl",
                    help="whose all-reduce the composed steps use (the host overhead is fitted under it)")
    a = ap.parse_args()
    global ALL_REDUCE
    ALL_REDUCE = a.all_reduce
    data = Path(a.data)
    k = kernels(data)
    print("1. GEMM tables (AIConfigurator) vs Vidur's per-layer GEMMs: predicted / measured")
    for r in k:
        print(f"  {r['card']:13s} {r['model']:16s} {r['gemm']:8s} n={r['n']:5d} median {r['median_ratio']:.2f} "
              f"(p10 {r['p10']:.2f}, p90 {r['p90']:.2f})")
    s = splitwise(data)
    print("2. Llama-2-70B TP8 (Splitwise perf_model, median of repeats) vs composed, no host overhead")
    for r in s:
        print(f"  {r['card']:13s} prompt {r['prompt']:5d} batch {r['batch']:3d}: decode {r['token_ms']:7.2f} ms measured, "
              f"{r['composed_decode_ms']:7.2f} composed; prefill {r['prompt_ms']:8.1f} measured, {r['composed_prefill_ms']:8.1f} composed")
    rows, fit = silicon(data)
    summ = summarise(rows)
    print(f"3. silicon sample, analytic closed-loop TPOT: host overhead fitted on {FIT_GROUP} "
          f"({fit['fit_rows']} rows): one_pass {fit['host_overhead_ms']['one_pass']:.3f} ms, sum {fit['host_overhead_ms']['sum']:.3f} ms")
    for r in summ:
        o, sm, z, zs = r["tpot_one_pass"], r["tpot_sum"], r["tpot0_one_pass"], r["tpot0_sum"]
        print(f"  {r['backend']:6s} {r['system']:8s} {r['model']:13s} {r['dtype']:4s} tp{r['tp']} n={r['n']:3d}{' (fit)' if r['fitted_on'] else '      '} "
              f"one_pass median |err| {o['median_abs_err']:.1%} (p90 {o['p90_abs_err']:.1%}, signed {o['median_signed_err']:+.1%}); "
              f"sum {sm['median_abs_err']:.1%} (p90 {sm['p90_abs_err']:.1%}, signed {sm['median_signed_err']:+.1%}); "
              f"no host: one_pass {z['median_abs_err']:.1%} ({z['median_signed_err']:+.1%}), sum {zs['median_abs_err']:.1%} ({zs['median_signed_err']:+.1%})")
    if a.json:
        Path(a.json).write_text(json.dumps({"kernels": k, "splitwise": s, "silicon_fit": fit, "silicon_summary": summ,
                                            "silicon_rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
