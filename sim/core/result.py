"""What a run produced: the per-request and per-iteration tables and the summary built from them."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.core.csvout import csv_bytes, write_csv, write_csv_chunks
from sim.core.metrics import Recorder, Timeline, stats, weighted_stats
from sim.core.tables import IterationTable, RequestTable


class _LazyFrame:
    """A Result table read as a pandas DataFrame, built from its columns on first use; an assigned
    DataFrame replaces it (changes to either are what gets written)."""

    def __init__(self, slot: str, csv_name: str):
        self.slot = slot
        self.__doc__ = f"{csv_name} as a pandas DataFrame (built on first use; changes to it are written)."

    def __get__(self, result, owner=None):
        if result is None:
            return self
        table = getattr(result, self.slot)
        if not _is_frame(table):
            table = _frame(_columns(table))
            setattr(result, self.slot, table)
        return table

    def __set__(self, result, value) -> None:
        setattr(result, self.slot, value)


class Result:
    """summary.json, requests.csv and iterations.csv of one run.

    The tables are held as numpy columns (name -> array), or as tables read from the run's spill
    files (sim.core.tables: written to CSV a block of rows at a time), and become pandas DataFrames
    only when `requests` or `iterations` is read (pandas is imported then, not by a run that only
    writes its outputs); a caller may also pass DataFrames."""

    def __init__(self, summary: dict, requests, iterations):
        self.summary = summary
        self._requests, self._iterations = requests, iterations

    requests = _LazyFrame("_requests", "requests.csv")
    iterations = _LazyFrame("_iterations", "iterations.csv")

    def write(self, out_dir: str | Path) -> None:
        """Write the three files into `out_dir` (created if needed)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(self.summary, indent=2) + "\n")
        for name, table in (("requests.csv", self._requests), ("iterations.csv", self._iterations)):
            if isinstance(table, (RequestTable, IterationTable)):  # from the spill files, a block at a time
                write_csv_chunks(out / name, table.names, table.chunks())
            else:
                write_csv(out / name, _columns(table))  # pandas' to_csv text, column by column

    def digest(self) -> str:
        """sha256 over the three outputs: equal digests mean byte-identical files."""
        h = hashlib.sha256(json.dumps(self.summary, sort_keys=True).encode())
        for table in (self._requests, self._iterations):
            if isinstance(table, (RequestTable, IterationTable)):
                h.update(csv_bytes({c: np.empty(0) for c in table.names}))  # the header
                for block in table.chunks():
                    h.update(csv_bytes(block, header=False))
            else:
                h.update(csv_bytes(_columns(table)))
        return h.hexdigest()


def _frame(columns: dict[str, np.ndarray]):
    import pandas as pd
    return pd.DataFrame(columns)


def _is_frame(table) -> bool:
    return not isinstance(table, (dict, RequestTable, IterationTable))


def _columns(table) -> dict[str, np.ndarray]:
    if isinstance(table, dict):
        return table
    if isinstance(table, (RequestTable, IterationTable)):
        return table.columns()
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
    return RequestTable(rec).columns()


def iteration_table(timelines: list[Timeline]) -> dict[str, np.ndarray]:
    """iterations.csv's columns: every replica's iterations, replica by replica."""
    return IterationTable(timelines).columns()


def _sum(values: np.ndarray):
    """Series.sum() of a column (pandas skips NaN)."""
    return np.nansum(values) if values.dtype.kind == "f" else values.sum()


def _decode_only(timelines: list[Timeline]) -> tuple[int, float, int]:
    """Iterations, and the seconds and output tokens of the decode-only ones, timeline by timeline as
    iterations.csv lists them (the seconds summed over the whole column at once, as pandas sums it)."""
    n, durations, tokens = 0, [], 0
    for t in timelines:
        m, d, k = t.decode_only()
        n, tokens = n + m, tokens + k
        durations.append(d)
    if not n:
        return 0, 0.0, 0
    return n, float(_sum(np.concatenate(durations))), tokens


def _latency_part(req: dict, its: IterationTable, rec: Recorder) -> dict:
    """Counts, throughput, goodput and latency statistics (`req`: RequestTable.totals())."""
    n, n_done, n_good = req["n"], req["finished"], req["good"]
    t0 = req["first_arrival_s"] if n else 0.0
    t1 = req["last_finish_s"] if n_done else t0
    window = t1 - t0
    itl = weighted_stats(*rec.itl_entries())
    n_its, dec_time, dec_tokens = _decode_only(its.timelines)
    return {
        "requests": n,
        "completed": n_done,
        "rejected": req["rejected"],
        "cancelled": req["cancelled"],
        "good": n_good,
        "makespan_s": window,
        "output_throughput_tok_s": float(np.int64(req["output_tokens"]) / window) if window > 0 else None,
        "request_throughput_rps": float(np.int64(n_done) / window) if window > 0 else None,
        "goodput_rps": n_good / window if window > 0 else None,
        "decode_throughput_tok_s": dec_tokens / dec_time if dec_time > 0 else None,
        "slo_attainment": n_good / n if n else None,
        "ttft_s": stats(req["ttft_s"]),
        "itl_s": itl,
        "tpot_s": stats(req["tpot_s"]),
        "e2e_s": stats(req["e2e_s"]),
        "iterations": int(n_its),
    }


def _memory_part(req: dict, rec: Recorder, facts: RunFacts) -> dict:
    """KV use against the budget, whether memory fits, prefix cache and swap counters (`req`:
    RequestTable.totals(); prompts that reached a replica's batch are the hit rate's base)."""
    mem, hw = facts.memory, facts.hardware
    peak_blocks = max(r.pool.peak_blocks for r in facts.replicas)
    stats_of = [r.pool.stats for r in facts.replicas]
    kv_limited = req["kv_waited"]
    preemptions = req["preemptions"]
    kv_rejected = sum(1 for r in rec.reject_reasons if r.startswith("kv:"))
    gpus = getattr(mem, "gpus", 1)
    if gpus == 1:
        card_fit = mem.weight_bytes + mem.kv_budget_bytes + mem.activation_bytes <= hw.memory_bytes
    else:  # per GPU: the fullest GPU's weights, its share of the KV budget and activations
        card_fit = (mem.weight_bytes_per_gpu + mem.kv_budget_bytes_per_gpu + mem.activation_bytes // gpus
                    <= hw.memory_bytes)
    memory_fit = bool(card_fit and kv_limited == 0 and kv_rejected == 0 and preemptions == 0)
    state = {}
    if getattr(mem, "state_slots", None) is not None:  # linear-attention layers' fixed state (sim.core.sizing)
        state = {"state_slots": int(mem.state_slots), "state_pool_bytes": int(mem.state_bytes),
                 "state_bytes_per_request": int(mem.state_bytes_per_sequence)}
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
        "recomputed_tokens": req["recomputed_tokens"],
        "prefix_hit_tokens": req["cached_tokens"],
        "prefix_hit_rate": (float(np.int64(req["served_cached"]) / np.int64(req["served_prompt"]))
                            if req["served"] else None),
        "evictions": sum(x.evictions for x in stats_of),
        "swap_outs": sum(x.swap_outs for x in stats_of),
        "swap_ins": sum(x.swap_ins for x in stats_of),
        "swapped_bytes": float(sum(x.swapped_bytes for x in stats_of)),
        "cow_copies": sum(x.cow_copies for x in stats_of),
        **state,
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
    requests, its = RequestTable(rec), IterationTable(facts.timelines)
    req = requests.totals()
    lat = _latency_part(req, its, rec)
    summary = {"scenario": facts.scenario.name, "seed": facts.scenario.seed, **lat}
    summary["busy_s"] = sum(t.busy_s for t in facts.timelines)
    summary["replicas"] = len(facts.timelines)
    summary["failed"] = req["failed"]
    summary["fault_retries"] = facts.fault_retries
    summary.update(_memory_part(req, rec, facts))
    summary.update(_cost_part(summary, facts))
    if getattr(facts.memory, "gpus", 1) > 1:  # one-GPU summaries stay as they were
        summary["parallel"] = dict(facts.memory.per_gpu(), gpus=summary["replicas"] * facts.memory.gpus)
    summary["speculative"] = facts.speculation
    summary["little_area"] = rec.area
    return Result(summary, requests, its)
