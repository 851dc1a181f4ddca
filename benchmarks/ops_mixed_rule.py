#!/usr/bin/env python
"""Which mixed-iteration rule fits real serving runs: closed-loop simulations of the silicon sample's
dense agg rows with `kind: ops` under `mixed: one_pass` and `mixed: sum`. Run by hand (needs
../shared/data), never by the test suite:

    python benchmarks/ops_mixed_rule.py [--data ../shared/data] [--requests-per-user 4] [--json OUT.json]

Rows: TensorRT-LLM 1.0.0rc3 Llama-3.1-8B on H100 (TP 1-8, BF16) and vLLM Llama-3.1-70B FP8 on H100
(TP 2-8). Each row is simulated as a closed loop of `batch_size` users at fixed ISL/OSL, chunked
prefill with 8,192 batched tokens and 2,048 sequences at most (TRT-LLM's and vLLM V1's default token
budget), prefix caching off (random prompts), users' first requests spread over about one request's
life (RAMP_S_PER_OUTPUT), KV budget = TP x 80 GB x 0.9 minus the weights (the
scenario schema has no TP layout yet: the budget stands in for it). The host overhead is the ops
model's default (fitted on the TRT-LLM rows by benchmarks/ops_fidelity.py). Measured TTFT/TPOT are
compared with the simulated means; per group and rule: median absolute and signed relative error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.core.simulation import Simulation  # noqa: E402
from sim.io.config import Scenario  # noqa: E402
from sim.io.profiles import load_model  # noqa: E402
from sim.models.spec import ModelSpec  # noqa: E402

RAMP_S_PER_OUTPUT = 0.01
"""Users start spread over osl x 10 ms (about one request's life): with fixed ISL/OSL a synchronous first
wave would stay synchronous forever (every iteration all-prefill or all-decode, no mixed iteration),
which real engines do not show (TTFT grows with OSL in the measurements)."""
MODELS = {"meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b", "meta-llama/Llama-3.1-70B": "llama-3.1-70b"}


def rows(data: Path) -> pd.DataFrame:
    """The expressible rows: dense models, agg, H100, BF16 (TRT-LLM 8B) or FP8 (vLLM 70B)."""
    d = pd.read_csv(data / "benchmarks/aiconfigurator_silicon_sample.csv")
    d = d[(d["mode"] == "agg") & (d.system == "h100_sxm") & d.model_path.isin(list(MODELS))]
    return d[d.pp_size.fillna(1) == 1].reset_index(drop=True)


def _ramp(total_s: float, users: int) -> float:
    """About total_s, with the users' spacing a power of two (start times exact in binary)."""
    if total_s <= 0:
        return 0.0
    return users * 2.0 ** round(np.log2(total_s / users))


def scenario(r, mixed: str, per_user: int, ramp_s_per_output: float = RAMP_S_PER_OUTPUT) -> Scenario:
    """A closed-loop scenario for one row."""
    model = MODELS[r.model_path]
    fmt = "fp8" if str(r.gemm_quant_mode) == "fp8" else "bf16"
    tp, users = int(r.tp_size), int(r.batch_size)
    weights = ModelSpec(load_model(model)).weight_bytes(fmt)
    budget = int(tp * 80e9 * 0.9 - weights)
    return Scenario.model_validate({
        "name": f"silicon-{r.id}-{mixed}", "seed": 0, "model": model, "hardware": "h100-sxm", "weight_format": fmt,
        "kv": {"block_tokens": 16, "format": "bf16", "budget": budget, "prefix_caching": False},
        "scheduler": {"kind": "chunked", "max_num_seqs": 2048, "max_num_batched_tokens": 8192, "chunk_tokens": 8192},
        "step_time": {"model": {"kind": "ops", "tp": tp, "mixed": mixed}, "allow_extrapolation": True},
        "workload": {"kind": "closed_loop", "users": users, "num_requests": max(per_user * users, 16),
                     "ramp_up_s": _ramp(ramp_s_per_output * int(r.osl), users),
                     "prompt_tokens": {"kind": "fixed", "value": int(r.isl)},
                     "output_tokens": {"kind": "fixed", "value": int(r.osl)}},
    })


def simulate(d: pd.DataFrame, per_user: int, ramp: float = RAMP_S_PER_OUTPUT) -> list[dict]:
    """Simulate every row under both rules."""
    out = []
    for i, r in enumerate(d.itertuples(index=False)):
        rec = {"id": r.id, "backend": r.backend, "model": MODELS[r.model_path], "tp": int(r.tp_size),
               "concurrency": int(r.batch_size), "isl": int(r.isl), "osl": int(r.osl),
               "measured_ttft_ms": float(r.silicon_ttft_ms), "measured_tpot_ms": float(r.silicon_tpot_ms)}
        for mixed in ("one_pass", "sum"):
            s = Simulation(scenario(r, mixed, per_user, ramp), ".", stream=open("/dev/null", "w")).run().summary
            rec[f"{mixed}_ttft_ms"] = s["ttft_s"]["mean"] * 1e3
            rec[f"{mixed}_tpot_ms"] = s["tpot_s"]["mean"] * 1e3
        out.append(rec)
        print(f"  [{i + 1}/{len(d)}] {rec['backend']} {rec['model']} tp{rec['tp']} c{rec['concurrency']} "
              f"{rec['isl']}/{rec['osl']}: TTFT {rec['measured_ttft_ms']:.0f} ms measured, one_pass "
              f"{rec['one_pass_ttft_ms']:.0f}, sum {rec['sum_ttft_ms']:.0f}; TPOT {rec['measured_tpot_ms']:.2f}, "
              f"{rec['one_pass_tpot_ms']:.2f}, {rec['sum_tpot_ms']:.2f}", flush=True)
    return out


def summary(recs: list[dict]) -> list[dict]:
    """Per (backend, model, tp), per rule and metric: median absolute and signed relative error."""
    df = pd.DataFrame(recs)
    out = []
    for key, g in df.groupby(["backend", "model", "tp"]):
        rec = dict(zip(["backend", "model", "tp"], key), n=len(g))
        for mixed in ("one_pass", "sum"):
            for m in ("ttft", "tpot"):
                e = (g[f"{mixed}_{m}_ms"] - g[f"measured_{m}_ms"]) / g[f"measured_{m}_ms"]
                rec[f"{mixed}_{m}"] = {"median_abs_err": float(e.abs().median()), "median_signed_err": float(e.median())}
        out.append(rec)
    return out


def main() -> int:
    """Run, print the per-group table, optionally write JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    ap.add_argument("--requests-per-user", type=int, default=4)
    ap.add_argument("--limit", type=int, help="first N rows only (a quick look)")
    ap.add_argument("--ramp-s-per-output", type=float, default=RAMP_S_PER_OUTPUT,
                    help="spread the first requests over osl x this (0: one synchronous wave)")
    ap.add_argument("--json")
    a = ap.parse_args()
    d = rows(Path(a.data))
    if a.limit:
        d = d.iloc[: a.limit]
    recs = simulate(d, a.requests_per_user, a.ramp_s_per_output)
    summ = summary(recs)
    print("group                        n   TTFT one_pass       sum    TPOT one_pass       sum   (median |err|, signed)")
    for r in summ:
        cells = []
        for m in ("ttft", "tpot"):
            for mixed in ("one_pass", "sum"):
                c = r[f"{mixed}_{m}"]
                cells.append(f"{c['median_abs_err']:5.1%} ({c['median_signed_err']:+.0%})")
        print(f"{r['backend']:6s} {r['model']:14s} tp{r['tp']}  {r['n']:3d}   " + "  ".join(cells))
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": recs, "summary": summ}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
