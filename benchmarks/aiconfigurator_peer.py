"""The peer's predictions of published rows: AIConfigurator 0.12.0 `cli estimate` (agg), row by row.

Not a capsim dependency: run it with AIConfigurator's own interpreter, in its own venv

    python -m venv /work/venvs/aic && /work/venvs/aic/bin/pip install aiconfigurator==0.12.0
    /work/venvs/aic/bin/python benchmarks/aiconfigurator_peer.py ROWS.csv --ids REPORT.json --out aic.csv

It reads rows in the schema of aiconfigurator's silicon_sample.csv, keeps those whose id is in a
capsim validate-published report (`--ids report.json`, predicted rows only) or every agg row, and
writes one line per row: id, aic_ttft_ms, aic_tpot_ms (empty with `aic_error` when it refuses).
AIConfigurator works offline with its shipped database; it uses its newest database version of
each backend (the rows' own engine versions are mostly not in it) and the checkpoint's own
quantisation unless the row's gemm_quant_mode names one.
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
          "Qwen/Qwen3-32B": "Qwen/Qwen3-32B", "Qwen/Qwen3-235B-A22B-FP8": "Qwen/Qwen3-235B-A22B"}
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


def estimate(row: dict) -> tuple[float, float]:
    """AIConfigurator's agg TTFT and TPOT (ms) for one row."""
    from aiconfigurator.cli.api import cli_estimate
    kw = dict(model_path=MODELS.get(row["model_path"], row["model_path"]), system_name=row["system"],
              mode="agg", backend_name=row["backend"], isl=_int(row["isl"]), osl=_int(row["osl"]),
              batch_size=batch_per_rank(row), tp_size=_int(row["tp_size"]), pp_size=_int(row["pp_size"]))
    quant = GEMM.get(row.get("gemm_quant_mode", "").strip().lower())
    if quant:
        kw["gemm_quant_mode"] = quant
    moe = {"fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4"}.get(row.get("moe_quant_mode", "").strip().lower())
    if moe:
        kw["moe_quant_mode"] = moe
    for col in ("moe_tp_size", "moe_ep_size", "attention_dp_size"):  # MoE layouts, as the row states them
        if row.get(col, "").strip() and float(row[col]) >= 1:
            kw[col] = _int(row[col])
    res = cli_estimate(**kw)
    return float(res.ttft), float(res.tpot)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", help="CSV in the silicon_sample schema")
    ap.add_argument("--ids", help="capsim validate-published report.json: only its predicted rows")
    ap.add_argument("--out", required=True, help="output CSV")
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)
    wanted = None
    if args.ids:
        report = json.loads(open(args.ids).read())
        wanted = {r["id"] for r in report["rows"] if "predicted" in r}
    with open(args.rows, newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["mode"] == "agg" and (wanted is None or r["id"] in wanted)]
    start = time.perf_counter()
    with open(args.out, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "aic_ttft_ms", "aic_tpot_ms", "aic_error"])
        for k, row in enumerate(rows, start=1):
            try:
                ttft, tpot = estimate(row)
                w.writerow([row["id"], f"{ttft:.4f}", f"{tpot:.4f}", ""])
            except Exception as exc:  # noqa: BLE001 - the peer's refusal is a result, recorded per row
                w.writerow([row["id"], "", "", f"{type(exc).__name__}: {exc}"[:300]])
            fh.flush()
            print(f"\r{k}/{len(rows)} rows {time.perf_counter() - start:.0f} s", end="", file=sys.stderr)
    print(file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
