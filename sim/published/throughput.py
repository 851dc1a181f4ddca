"""TensorRT-LLM's published offline maximum throughput (docs/source/performance/perf-overview.md, as
transcribed in ../shared/data/benchmarks/trtllm_perf_overview_throughput.csv): `trtllm-bench throughput`
issues every request at once with fixed ISL/OSL and reports total output tokens per second.

capsim replays a row as a burst of requests on one replica under trtllm-serve's default scheduler
(sim.published.engines) and reports output tokens / makespan. Rows it cannot express (pipeline
parallelism, MoE, FP4, cards without a hardware profile or tables) are skipped with the reason.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from sim.io.errors import ConfigError
from sim.published.rows import integer_field, positive_field

COLUMNS = ("model", "checkpoint", "gpu", "num_gpus", "tp", "pp", "precision", "isl", "osl",
           "total_output_tokens_per_s")

GPUS = {"H100": "h100-sxm", "H200": "h200-sxm", "B200": "b200", "GB200": "gb200"}
"""perf-overview GPU names -> capsim hardware profiles (the RTX PRO 6000 Server has none; GB200's rows are FP4)."""

MODELS = {"Llama 3.1 8B": "llama-3.1-8b", "Llama 3.3 70B": "llama-3.1-70b", "Llama 3.1 405B": "llama-3.1-405b"}
"""Llama 3.3 70B has Llama 3.1 70B's architecture (same config.json shape). Qwen3-235B-A22B and Qwen3-30B-A3B
are MoE, which this replay does not compose yet."""

NUM_REQUESTS = 3000
"""Requests per replayed row (trtllm-bench's datasets in perf-overview are thousands of requests)."""


@dataclass(frozen=True)
class ThroughputRow:
    """One published maximum-throughput measurement."""

    line: int
    id: str
    model: str
    checkpoint: str
    gpu: str
    tp: int
    pp: int
    precision: str
    isl: int
    osl: int
    tok_s: float


def is_throughput_file(header: list[str]) -> bool:
    """True when a CSV header is the perf-overview throughput table's."""
    return "total_output_tokens_per_s" in header


def read_throughput(path: str | Path) -> list[ThroughputRow]:
    """Rows of the throughput table; a malformed one raises naming line and column."""
    path = Path(path)
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(f"{path}: line 1: missing column(s) {', '.join(missing)}")
        rows = []
        for rec in reader:
            where = f"{path}: line {reader.line_num}"
            if None in rec or any(v is None for v in rec.values()):
                raise ConfigError(f"{where}: the row's field count differs from the header's")
            ints = {c: integer_field(where, c, rec[c].strip(), None, 1) for c in ("tp", "pp", "isl", "osl")}
            tok = positive_field(where, "total_output_tokens_per_s", rec["total_output_tokens_per_s"].strip())
            rid = f"{rec['model']}|{rec['gpu']}|tp{ints['tp']}pp{ints['pp']}|{rec['precision']}|{ints['isl']}x{ints['osl']}"
            rows.append(ThroughputRow(reader.line_num, rid, rec["model"].strip(), rec["checkpoint"].strip(),
                                      rec["gpu"].strip(), ints["tp"], ints["pp"], rec["precision"].strip().lower(),
                                      ints["isl"], ints["osl"], tok))
    return rows


def throughput_case(row: ThroughputRow, num_requests: int = NUM_REQUESTS) -> tuple[dict | None, str | None]:
    """(scenario mapping, None) or (None, why it cannot be replayed)."""
    from sim.io.profiles import load_hardware, load_model
    from sim.models.spec import ModelSpec
    from sim.published.engines import ENGINES, kv_budget_bytes
    if row.pp > 1:
        return None, f"pipeline parallelism (pp {row.pp}) is not modelled"
    hardware = GPUS.get(row.gpu)
    if hardware is None:
        return None, f"no hardware profile / operator tables for {row.gpu!r}"
    model = MODELS.get(row.model)
    if model is None:
        moe = row.model.startswith("Qwen3-") and "-A" in row.model
        return None, (f"{row.model}: MoE models are not composed from operator tables yet" if moe
                      else f"{row.model}: no model profile")
    weight_format = {"fp8": "fp8", "bf16": "bf16", "fp4": "nvfp4"}.get(row.precision)
    if weight_format is None:
        return None, f"precision {row.precision!r}: no operator tables (have bf16, fp8, fp4)"
    from sim.models.ops_tables import find_table, load_table_set
    if weight_format == "nvfp4" and find_table(load_table_set(hardware).folder, "gemm_nvfp4") is None:
        return None, f"precision 'fp4': the {hardware} tables have no NVFP4 GEMMs (Blackwell cards only)"
    engine = ENGINES["trtllm"]
    spec, hw = ModelSpec(load_model(model)), load_hardware(hardware)
    budget = kv_budget_bytes(engine, hw.reported_memory_bytes, spec.weight_bytes(weight_format) / row.tp, row.tp)
    # NVIDIA's FP8 and FP4 checkpoints store the KV cache in FP8 (hf_quant_config kv_cache_quant_algo FP8): half
    # the bytes per token in the pool and half read by decode attention (sim.models.ops.KV_READ_SCALE)
    kv_format = "fp8" if row.precision in ("fp8", "fp4") and row.checkpoint.startswith("nvidia/") else "bf16"
    need = math.ceil((row.isl + row.osl) / 16) * 16 * spec.kv_bytes_per_token(kv_format)
    if budget < need:
        return None, "weights leave less KV than one request needs"
    return {
        "name": row.id, "seed": 0, "model": model, "hardware": hardware, "weight_format": weight_format,
        "kv": {"block_tokens": 16, "format": kv_format, "budget": budget, "admission": engine.kv_admission},
        "scheduler": dict(engine.scheduler),
        "step_time": {"model": {"kind": "ops", "tp": row.tp}},
        "workload": {"kind": "synthetic", "num_requests": num_requests, "arrival": {"kind": "all_at_once"},
                     "prompt_tokens": {"kind": "fixed", "value": row.isl},
                     "output_tokens": {"kind": "fixed", "value": row.osl}},
    }, None


def simulate_throughput(_shared, item: tuple) -> dict:
    """Replay one row (on a worker): output tokens per second, or the reason it was skipped."""
    from sim.core.simulation import Simulation
    from sim.io.config import Scenario
    from sim.io.schema import validate_mapping
    row, scenario, why = item
    if scenario is None:
        return {"skipped": why}
    try:
        res = Simulation(validate_mapping(Scenario, scenario, f"line {row.line}"), Path(".")).run()
    except ConfigError as exc:
        return {"skipped": "; ".join(exc.lines)}
    if res.summary["completed"] < res.summary["requests"]:
        return {"skipped": "simulated engine did not finish every request"}
    return {"output_tok_s": float(res.summary["output_throughput_tok_s"])}
