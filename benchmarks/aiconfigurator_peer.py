"""The peer's predictions of published rows: AIConfigurator 0.12.0 `cli estimate`, row by row (agg or disagg).

Not a capsim dependency: run it with AIConfigurator's own interpreter, in its own venv

    python -m venv /work/venvs/aic && /work/venvs/aic/bin/pip install aiconfigurator==0.12.0
    /work/venvs/aic/bin/python benchmarks/aiconfigurator_peer.py ROWS.csv --ids REPORT.json --out aic.csv
    /work/venvs/aic/bin/python benchmarks/aiconfigurator_peer.py ROWS.csv --mode disagg --ids REPORT.json --out aic_disagg.csv

It reads rows in the schema of aiconfigurator's silicon_sample.csv, keeps those of the chosen `--mode`
(agg, the default, or disagg) whose id is in a capsim validate-published report (`--ids report.json`,
predicted rows only) or every row of that mode, and writes one line per row: id, aic_ttft_ms, aic_tpot_ms
(empty with `aic_error` when it refuses).
AIConfigurator works offline with its shipped database; it uses its newest database version of
each backend (the rows' own engine versions are mostly not in it) and the checkpoint's own
quantisation unless the row's gemm_quant_mode / moe_quant_mode names one (`--checkpoint-quant`: always the
checkpoint's own; DeepSeek-V3/R1's is block FP8, which its rows label "fp8").

Disagg rows go through the same public entry point as `aiconfigurator cli estimate --estimate-mode disagg`:
`aiconfigurator.cli.api.cli_estimate(mode="disagg", ...)`. It is given the row's model (mapped to a config
AIConfigurator ships), system (prefill and decode on the same system), backend, ISL/OSL, quantisation, and
for each of prefill and decode the row's tp, pp, attention dp, moe tp, moe ep, worker count and batch size.
Batch sizes are the row's prefill_batch_size / decode_batch_size, which are per attention-DP rank: on every
disagg row they equal AIConfigurator's own adapter convention (sdk.config_adapter.dynamo_ci/inferencex:
prefill batch 1, decode batch = client concurrency / (decode workers x decode attention dp), which divides
exactly on the rows), so AIConfigurator's reported concurrency equals the row's silicon_concurrency.
AIConfigurator then runs one static context pass of the prefill worker (TTFT, times its fixed 1.8 TTFT
correction) and one static generation pass of the decode worker at that batch (TPOT), and rate-matches the
worker counts for throughput only; no queueing enters TTFT. MTP is off (nextn=0), AIConfigurator's default.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import re
import sys
import time

MODELS = {"meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
          "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
          "Qwen/Qwen3-32B": "Qwen/Qwen3-32B", "Qwen/Qwen3-235B-A22B-FP8": "Qwen/Qwen3-235B-A22B",
          "deepseek-ai/DeepSeek-R1": "deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-V3": "deepseek-ai/DeepSeek-V3",
          "moonshotai/Kimi-K2.5": "moonshotai/Kimi-K2.5"}
"""Published model ids -> the config names AIConfigurator ships (offline: no Hugging Face download)."""

GEMM = {"fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4"}


def _int(text: str, default: int = 1) -> int:
    return int(float(text)) if text.strip() else default


def batch_per_rank(row: dict) -> int:
    """The client concurrency per attention data-parallel rank: the silicon_concurrency the row's source text
    states over attention_dp_size, as capsim reads the row (sim.published.rows.PublishedRow.concurrency), else
    the file's batch_size (on 30 agg rows batch_size is not the client's concurrency)."""
    m = re.search(r"silicon_concurrency=(\d+(?:\.0*)?)\b", row.get("silicon_data_source", ""))
    if m is None:
        return _int(row["batch_size"])
    return -(-int(float(m.group(1))) // max(_int(row.get("attention_dp_size", ""), 1), 1))   # rounded up


def quant_kwargs(row: dict) -> dict:
    """The row's GEMM / MoE quantisation where it names one AIConfigurator knows, else nothing (checkpoint's own)."""
    kw = {}
    quant = GEMM.get(row.get("gemm_quant_mode", "").strip().lower())
    if quant:
        kw["gemm_quant_mode"] = quant
    moe = {"fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4"}.get(row.get("moe_quant_mode", "").strip().lower())
    if moe:
        kw["moe_quant_mode"] = moe
    return kw


def estimate(row: dict) -> tuple[float, float]:
    """AIConfigurator's agg TTFT and TPOT (ms) for one row."""
    from aiconfigurator.cli.api import cli_estimate
    kw = dict(model_path=MODELS.get(row["model_path"], row["model_path"]), system_name=row["system"],
              mode="agg", backend_name=row["backend"], isl=_int(row["isl"]), osl=_int(row["osl"]),
              batch_size=batch_per_rank(row), tp_size=_int(row["tp_size"]), pp_size=_int(row["pp_size"]))
    kw.update(quant_kwargs(row))
    for col in ("moe_tp_size", "moe_ep_size", "attention_dp_size"):  # MoE layouts, as the row states them
        if row.get(col, "").strip() and float(row[col]) >= 1:
            kw[col] = _int(row[col])
    res = cli_estimate(**kw)
    return float(res.ttft), float(res.tpot)


def estimate_disagg(row: dict) -> tuple[float, float]:
    """AIConfigurator's disagg TTFT and TPOT (ms) for one row: prefill and decode workers as the row states
    them (tp, pp, attention dp, moe tp, moe ep, workers, per-rank batch size); see the module docstring."""
    from aiconfigurator.cli.api import cli_estimate
    kw = dict(model_path=MODELS.get(row["model_path"], row["model_path"]), system_name=row["system"],
              mode="disagg", backend_name=row["backend"], isl=_int(row["isl"]), osl=_int(row["osl"]))
    kw.update(quant_kwargs(row))
    for role in ("prefill", "decode"):
        for col in ("tp_size", "pp_size", "attention_dp_size", "num_workers", "batch_size"):
            kw[f"{role}_{col}"] = _int(row[f"{role}_{col}"])
        for col in ("moe_tp_size", "moe_ep_size"):  # MoE layouts, where the row states them
            if row.get(f"{role}_{col}", "").strip() and float(row[f"{role}_{col}"]) >= 1:
                kw[f"{role}_{col}"] = _int(row[f"{role}_{col}"])
    res = cli_estimate(**kw)
    return float(res.ttft), float(res.tpot)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", help="CSV in the silicon_sample schema")
    ap.add_argument("--ids", help="capsim validate-published report.json: only its predicted rows")
    ap.add_argument("--out", required=True, help="output CSV")
    ap.add_argument("--mode", choices=("agg", "disagg"), default="agg", help="which rows to estimate (default agg)")
    ap.add_argument("--checkpoint-quant", action="store_true",
                    help="ignore the rows' gemm/moe_quant_mode: AIConfigurator uses the checkpoint's own quantisation")
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)
    wanted = None
    if args.ids:
        report = json.loads(open(args.ids).read())
        wanted = {r["id"] for r in report["rows"] if "predicted" in r}
    with open(args.rows, newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["mode"] == args.mode and (wanted is None or r["id"] in wanted)]
    start = time.perf_counter()
    with open(args.out, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "aic_ttft_ms", "aic_tpot_ms", "aic_error"])
        for k, row in enumerate(rows, start=1):
            if args.checkpoint_quant:
                row = dict(row, gemm_quant_mode="", moe_quant_mode="")
            try:
                ttft, tpot = (estimate_disagg if args.mode == "disagg" else estimate)(row)
                w.writerow([row["id"], f"{ttft:.4f}", f"{tpot:.4f}", ""])
            except Exception as exc:  # noqa: BLE001 - the peer's refusal is a result, recorded per row
                w.writerow([row["id"], "", "", f"{type(exc).__name__}: {exc}"[:300]])
            fh.flush()
            print(f"\r{k}/{len(rows)} rows {time.perf_counter() - start:.0f} s", end="", file=sys.stderr)
    print(file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
