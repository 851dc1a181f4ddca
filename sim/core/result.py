"""What a run produced: the per-request and per-iteration tables and the summary built from them."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.core.csvout import csv_text, write_csv
from sim.core.metrics import ITERATION_COLUMNS, Recorder, Status, Timeline, stats, weighted_stats

STATUS_NAMES = [s.value for s in Status]
_INT_REQUEST_COLUMNS = ("id", "replica", "prompt_tokens", "output_tokens", "cached_tokens", "preemptions",
                        "recomputed_tokens", "attempts")


class Result:
    """summary.json, requests.csv and iterations.csv of one run.

    The tables are held as numpy columns (name -> array) and become pandas DataFrames only when
    `requests` or `iterations` is read (pandas is imported then, not by a run that only writes its
    outputs); a caller may also pass DataFrames."""

    def __init__(self, summary: dict, requests, iterations):
        self.summary = summary
        self._requests, self._iterations = requests, iterations

    @property
    def requests(self):
        """requests.csv as a pandas DataFrame (built on first use; changes to it are written)."""
        if isinstance(self._requests, dict):
            self._requests = _frame(self._requests)
        return self._requests

    @requests.setter
    def requests(self, value) -> None:
        self._requests = value

    @property
    def iterations(self):
        """iterations.csv as a pandas DataFrame (built on first use; changes to it are written)."""
        if isinstance(self._iterations, dict):
            self._iterations = _frame(self._iterations)
        return self._iterations

    @iterations.setter
    def iterations(self, value) -> None:
        self._iterations = value

    def write(self, out_dir: str | Path) -> None:
        """Write the three files into `out_dir` (created if needed)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(self.summary, indent=2) + "\n")
        write_csv(out / "requests.csv", _columns(self._requests))  # pandas' to_csv text, column by column
        write_csv(out / "iterations.csv", _columns(self._iterations))

    def digest(self) -> str:
        """sha256 over the three outputs: equal digests mean byte-identical files."""
        h = hashlib.sha256(json.dumps(self.summary, sort_keys=True).encode())
        h.update(csv_text(_columns(self._requests)).encode())
        h.update(csv_text(_columns(self._iterations)).encode())
        return h.hexdigest()


def _frame(columns: dict[str, np.ndarray]):
    import pandas as pd
    return pd.DataFrame(columns)


def _columns(table) -> dict[str, np.ndarray]:
    if isinstance(table, dict):
        return table
    return {c: table[c].to_numpy() for c in table.columns}


@dataclass(frozen=True)
class RunFacts:
    """What the summary needs besides the tables: the scenario, the card, the replica's memory, and
    the counters the run kept."""

    scenario: object
    hardware: object
    memory: object            # sim.core.sizing.ReplicaMemory
    replicas: list            # every replica incarnation (faults retire some)
    timelines: list[Timeline]
    fault_retries: int
    kv_demand_blocks: int
    speculation: dict | None
    gpus: int | None = None
    """GPUs of every replica of every pool (None: replicas x the replica memory's GPUs)."""
    busy_gpu_s: float | None = None
    """Sum over replicas of busy seconds x that replica's GPUs (None: busy_s x the memory's GPUs)."""


def card_fits(mem, hw) -> bool:
    """Whether one replica's memory fits its cards: weights, KV budget and activations (per GPU
    over several GPUs: the fullest GPU's weights, its share of the KV budget and activations)."""
    gpus = getattr(mem, "gpus", 1)
    if gpus == 1:
        return mem.weight_bytes + mem.kv_budget_bytes + mem.activation_bytes <= hw.memory_bytes
    return mem.weight_bytes_per_gpu + mem.kv_budget_bytes_per_gpu + mem.activation_bytes // gpus <= hw.memory_bytes


def merge_speculation(reports: list[dict]) -> dict | None:
    """Speculation counters of all replicas as one report."""
    if not reports:
        return None
    if len(reports) == 1:
        return reports[0]
    rounds = sum(r["rounds"] for r in reports)
    drafts = sum(r["draft_tokens"] for r in reports)
    acc = sum(r["accepted_tokens"] for r in reports)
    return {"rounds": rounds, "draft_tokens": drafts, "accepted_tokens": acc,
            "acceptance_rate": acc / drafts if drafts else None,
            "mean_acceptance_length": 1 + acc / rounds if rounds else None,
            "per_position_acceptance": None}


def request_table(rec: Recorder) -> dict[str, np.ndarray]:
    """requests.csv's columns: one row per request, in id order."""
    cols = rec.table()
    order = np.argsort(cols["id"], kind="stable")
    return {c: (v[order].astype(np.int64) if c in _INT_REQUEST_COLUMNS
                else np.array(STATUS_NAMES, dtype=object)[v[order].astype(np.int64)] if c == "status"
                else v[order].astype(bool) if c in ("met_slo", "kv_waited") else v[order])
            for c, v in cols.items()}


def iteration_table(timelines: list[Timeline]) -> dict[str, np.ndarray]:
    """iterations.csv's columns: every replica's iterations, replica by replica."""
    tables = [t.table() for t in timelines]

    def joined(c: str) -> np.ndarray:  # one replica: its column as it is (no copy of the whole table)
        return tables[0][c] if len(tables) == 1 else np.concatenate([tb[c] for tb in tables])
    return {c: (joined(c) if c in ("start_s", "duration_s", "swap_bytes") else joined(c).astype(np.int64))
            for c in ITERATION_COLUMNS}


def _sum(values: np.ndarray):
    """Series.sum() of a column (pandas skips NaN)."""
    return np.nansum(values) if values.dtype.kind == "f" else values.sum()


def _latency_part(req: dict, its: dict, rec: Recorder) -> dict:
    """Counts, throughput, goodput and latency statistics."""
    n, status = len(req["id"]), req["status"]
    finished = status == "finished"
    correct = np.nan_to_num(req["correct"], nan=0.0).astype(bool)
    n_good = int((finished & correct & req["met_slo"]).sum())
    t0 = float(req["arrival_s"].min()) if n else 0.0
    t1 = float(np.nanmax(req["finish_s"])) if finished.any() else t0
    window = t1 - t0
    itl = weighted_stats(np.frombuffer(rec.itl_gap, dtype=float), np.frombuffer(rec.itl_weight, dtype=np.dtype(rec.itl_weight.typecode)))
    decode_only = its["prefill_tokens"] == 0
    n_its = len(its["prefill_tokens"])
    dec_time = float(_sum(its["duration_s"][decode_only])) if n_its else 0.0
    dec_tokens = int(_sum(its["output_tokens"][decode_only])) if n_its else 0
    return {
        "requests": int(n),
        "completed": int(finished.sum()),
        "rejected": int((status == "rejected").sum()),
        "cancelled": int((status == "cancelled").sum()),
        "good": n_good,
        "makespan_s": window,
        "output_throughput_tok_s": float(_sum(req["output_tokens"][finished]) / window) if window > 0 else None,
        "request_throughput_rps": float(finished.sum() / window) if window > 0 else None,
        "goodput_rps": n_good / window if window > 0 else None,
        "decode_throughput_tok_s": dec_tokens / dec_time if dec_time > 0 else None,
        "slo_attainment": n_good / n if n else None,
        "ttft_s": stats(req["ttft_s"][finished]),
        "itl_s": itl,
        "tpot_s": stats(req["tpot_s"][finished]),
        "e2e_s": stats(req["e2e_s"][finished]),
        "iterations": int(n_its),
    }


def _memory_part(req: dict, rec: Recorder, facts: RunFacts) -> dict:
    """KV use against the budget, whether memory fits, prefix cache and swap counters."""
    mem, hw = facts.memory, facts.hardware
    served = ~np.isnan(req["admitted_s"])  # prompts that reached a replica's batch (hit rate's base)
    peak_blocks = max(r.pool.peak_blocks for r in facts.replicas)
    stats_of = [r.pool.stats for r in facts.replicas]
    kv_limited = int(req["kv_waited"].sum())
    preemptions = int(req["preemptions"].sum())
    kv_rejected = sum(1 for r in rec.reject_reasons if r.startswith("kv:"))
    gpus = getattr(mem, "gpus", 1)
    if gpus == 1:
        card_fit = mem.weight_bytes + mem.kv_budget_bytes + mem.activation_bytes <= hw.memory_bytes
    else:  # per GPU: the fullest GPU's weights, its share of the KV budget and activations
        card_fit = (mem.weight_bytes_per_gpu + mem.kv_budget_bytes_per_gpu + mem.activation_bytes // gpus
                    <= hw.memory_bytes)
    memory_fit = bool(card_fit and kv_limited == 0 and kv_rejected == 0 and preemptions == 0)
    return {
        "peak_kv_bytes": float(peak_blocks * mem.block_bytes),
        "peak_kv_blocks": int(peak_blocks),
        "kv_budget_bytes": int(mem.kv_budget_bytes),
        "kv_capacity_bytes": float(mem.num_blocks * mem.block_bytes),
        "kv_capacity_blocks": int(mem.num_blocks),
        "weights_bytes": int(mem.weight_bytes),
        "memory_fit": memory_fit,
        "card_fit": bool(card_fit),
        "kv_limited_requests": kv_limited,
        "kv_rejected_requests": kv_rejected,
        "preemptions": preemptions,
        "recomputed_tokens": int(req["recomputed_tokens"].sum()),
        "prefix_hit_tokens": int(req["cached_tokens"].sum()),
        "prefix_hit_rate": (float(req["cached_tokens"][served].sum() / req["prompt_tokens"][served].sum())
                            if served.any() else None),
        "evictions": sum(x.evictions for x in stats_of),
        "swap_outs": sum(x.swap_outs for x in stats_of),
        "swap_ins": sum(x.swap_ins for x in stats_of),
        "swapped_bytes": float(sum(x.swapped_bytes for x in stats_of)),
        "cow_copies": sum(x.cow_copies for x in stats_of),
    }


def _cost_part(summary: dict, facts: RunFacts) -> dict:
    """GPU-seconds and energy, in all and per good result."""
    sc, mem = facts.scenario, facts.memory
    # every GPU of every replica counts (a replica spans getattr(mem, 'gpus', 1) GPUs)
    n_rep, window, n_good = len(facts.timelines) * getattr(mem, "gpus", 1), summary["makespan_s"], summary["good"]
    busy_s = summary["busy_s"] * getattr(mem, "gpus", 1)  # a busy replica keeps all its GPUs busy
    if facts.gpus is not None:  # pools of different layouts (disaggregated serving) count their own
        n_rep, busy_s = facts.gpus, facts.busy_gpu_s
    cap_w = facts.hardware.tdp_w.value
    if sc.power.model == "cap":
        energy = n_rep * cap_w * window if cap_w is not None else None
    else:
        energy = sc.power.busy_w * busy_s + sc.power.idle_w * max(0.0, n_rep * window - busy_s)
    return {
        "gpu_seconds": n_rep * window,
        "gpu_seconds_per_good": n_rep * window / n_good if n_good else None,
        "energy_j": energy,
        "energy_j_per_good": energy / n_good if (n_good and energy is not None) else None,
        "draft_memory_bytes": int(mem.draft_memory_bytes),
        "lora_memory_bytes": int(mem.lora_memory_bytes),
        "offload_copy_s_per_step": mem.offload.copy_s_per_step if mem.offload else None,
        "kv_need_bytes": float(facts.kv_demand_blocks * mem.block_bytes + mem.draft_memory_bytes
                               + mem.lora_memory_bytes),
    }


def summarise(rec: Recorder, facts: RunFacts) -> Result:
    """The Result of a finished run: tables from the recorder and timelines, and summary.json."""
    req = request_table(rec)
    its = iteration_table(facts.timelines)
    lat = _latency_part(req, its, rec)
    summary = {"scenario": facts.scenario.name, "seed": facts.scenario.seed, **lat}
    summary["busy_s"] = sum(t.busy_s for t in facts.timelines)
    summary["replicas"] = len(facts.timelines)
    summary["failed"] = int((req["status"] == "failed").sum())
    summary["fault_retries"] = facts.fault_retries
    summary.update(_memory_part(req, rec, facts))
    summary.update(_cost_part(summary, facts))
    if getattr(facts.memory, "gpus", 1) > 1:  # one-GPU summaries stay as they were
        summary["parallel"] = dict(facts.memory.per_gpu(), gpus=summary["replicas"] * facts.memory.gpus)
    summary["speculative"] = facts.speculation
    summary["little_area"] = rec.area
    return Result(summary, req, its)
