"""Builds a replica from a scenario (profiles, KV pool, step-time model, scheduler) and runs it."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import simpy

from sim.models import step_time as costmod
from sim.core.step_time_builder import build_step_time
from sim.io.config import EfficiencyStepTime, LinearStepTime, ProfileStepTime, Scenario
from sim.io.errors import ConfigError
from sim.core.kv import BlockManager
from sim.models.memory import kv_budget_from_utilization, offload_layout
from sim.core.cluster import ROUTERS, Replica
from sim.core.metrics import ITERATION_COLUMNS, REQUEST_COLUMNS, Recorder, Status, Timeline, stats, weighted_stats
from sim.models.spec import ModelSpec
from sim.io.profiles import load_fitted, load_hardware, load_model, profiles_dir
from sim.core.request import Request
from sim.core.schedulers import SCHEDULERS
from sim.core.schedulers.speculation import Speculator
from sim.workloads.closed_loop import closed_loop_clients
from sim.workloads.workload import build_workload, prefix_stream
from sim.core import engine

STATUS_NAMES = [s.value for s in Status]


@dataclass
class Result:
    summary: dict
    requests: pd.DataFrame
    iterations: pd.DataFrame

    def write(self, out_dir: str | Path) -> None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(self.summary, indent=2) + "\n")
        self.requests.to_csv(out / "requests.csv", index=False)
        self.iterations.to_csv(out / "iterations.csv", index=False)

    def digest(self) -> str:
        h = hashlib.sha256(json.dumps(self.summary, sort_keys=True).encode())
        h.update(self.requests.to_csv(index=False).encode())
        h.update(self.iterations.to_csv(index=False).encode())
        return h.hexdigest()


def _merge_reports(reports: list[dict]) -> dict | None:
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


class Simulation:
    """One replica serving one scenario. Constructors build; run() runs; the caller writes."""

    def __init__(self, scenario: Scenario, base_dir: Path | str = ".", progress: Callable[[int, int], None] | None = None,
                 stream=None, lazy_decode: bool = True):
        self.scenario = scenario
        self.base_dir = Path(base_dir)
        self.progress = progress
        self.lazy_decode = lazy_decode
        self.model = load_model(scenario.model) if not scenario.model.endswith(".yaml") else load_model(self.base_dir / scenario.model)
        self.hw = load_hardware(scenario.hardware) if not scenario.hardware.endswith(".yaml") else load_hardware(self.base_dir / scenario.hardware)
        self.spec = ModelSpec(self.model)
        kv = scenario.kv
        self.kv_bytes_per_token = self.spec.kv_bytes_per_token(kv.format)
        self.spec_cfg = getattr(scenario.scheduler, "speculative", None)
        self.drafter_spec = None
        self.draft_memory_bytes = 0
        if self.spec_cfg is not None:
            d = self.spec_cfg.draft
            if d.kind == "draft_model":
                self.drafter_spec = ModelSpec(load_model(d.model))
                self.draft_memory_bytes = self.drafter_spec.weight_bytes(scenario.weight_format)
                # the drafter keeps KV for every token too: charged per token, in the same blocks
                self.kv_bytes_per_token += self.drafter_spec.kv_bytes_per_token(kv.format)
            elif d.kind in ("parallel", "heads"):
                self.draft_memory_bytes = d.memory_bytes
        self.block_bytes = kv.block_tokens * self.kv_bytes_per_token
        self.weight_bytes = self.spec.weight_bytes(scenario.weight_format)
        self.offload = None
        if scenario.offload is not None:
            try:
                self.offload = offload_layout(self.spec, scenario.offload.layers, scenario.offload.prefetch_buffers,
                                            self.hw.host_link_bytes_per_s, scenario.weight_format)
            except ValueError as exc:
                raise ConfigError(f"offload: {exc}") from None
            if self.offload.copy_s_per_step is None:
                raise ConfigError(f"offload: hardware {self.hw.name} has no host link to stream weights over")
            self.weight_bytes -= self.offload.net_freed_bytes
        self.lora_memory_bytes = 0
        if scenario.lora is not None:
            self.lora_memory_bytes = scenario.lora.adapters * self.spec.lora_adapter_bytes(
                scenario.lora.rank, tuple(scenario.lora.targets), "bf16")
        if isinstance(kv.budget, int):
            self.kv_budget_bytes = kv.budget
            self.activation_bytes = 0
        else:
            try:
                self.kv_budget_bytes = kv_budget_from_utilization(self.hw, self.weight_bytes, kv.budget.gpu_memory_utilization,
                                                                  kv.budget.activation_bytes, kv.budget.other_bytes)
            except ValueError as exc:
                raise ConfigError(f"kv.budget: {exc}") from None
            self.activation_bytes = kv.budget.activation_bytes
        self.num_blocks = int((self.kv_budget_bytes - self.draft_memory_bytes - self.lora_memory_bytes)
                              // self.block_bytes)
        if self.num_blocks < 1:
            raise ConfigError(f"kv.budget: {self.kv_budget_bytes} B holds no {kv.block_tokens}-token block "
                              f"({self.block_bytes} B each)")
        self.cost = build_step_time(scenario, self.base_dir, self.spec, self.hw, stream)
        self.draft_pass_s, self.prefill_overhead = None, 0.0
        if self.spec_cfg is not None:
            d = self.spec_cfg.draft
            if d.kind == "draft_model":
                self.draft_pass_s = d.pass_s or self._drafter_pass_s()
                self.prefill_overhead = (d.prefill_overhead if d.prefill_overhead is not None else
                                         self.drafter_spec.active_matrix_params / self.spec.active_matrix_params)
            elif d.kind == "parallel":
                self.prefill_overhead = d.prefill_overhead
            self.cost = costmod.WithDrafts(self.cost, self.prefill_overhead)
        self.host_blocks = int(kv.host_budget // self.block_bytes)
        if self.host_blocks and not self.hw.host_link_bytes_per_s:
            raise ConfigError(f"kv.host_budget: hardware {self.hw.name} has no host link bandwidth to swap over")
        lora = scenario.lora
        if (self.host_blocks or kv.conversion_s_per_token or self.offload or (lora and lora.per_adapter_s)):
            self.cost = costmod.Overheads(
                self.cost, self.hw.host_link_bytes_per_s, kv.conversion_s_per_token,
                self.offload.copy_s_per_step if self.offload else 0.0,
                scenario.offload.prefetch_buffers if self.offload else 2,
                lora.per_adapter_s if lora else 0.0)
        self.workload = build_workload(scenario.workload, scenario.seed, self.base_dir)
        used = self.workload.adapter
        if used is not None and len(used) and used.max() >= 0:
            have = 0 if scenario.lora is None else scenario.lora.adapters
            if used.max() >= have:
                raise ConfigError(f"workload: request {int(np.argmax(used >= have))} uses LoRA adapter {int(used.max())} "
                                  f"but lora.adapters is {have}")

    # ---- helpers handed to the processes ----------------------------------------------------
    def _lower_bound_s(self, prompt_tokens: int, output_tokens: int) -> float:
        """Service time alone on the card (batch 1): prefill, then G - 1 decodes at the prompt's context."""
        from sim.core.schedulers.base import StepPlan
        pre = StepPlan(num_seqs=1, new_tokens=prompt_tokens, pairs=prompt_tokens * (prompt_tokens + 1) // 2,
                       prefill_tokens=prompt_tokens, prefill_pairs=prompt_tokens * (prompt_tokens + 1) // 2,
                       prefill_logits=1, prefill_seqs=1, max_context=prompt_tokens,
                       items=[(Request(-1, 0.0, prompt_tokens, output_tokens, 0.0), prompt_tokens, 0)])
        dec = StepPlan(num_seqs=1, new_tokens=1, pairs=prompt_tokens + 1, decode_seqs=1, decode_kv_tokens=prompt_tokens,
                       kv_tokens_read=prompt_tokens, max_context=prompt_tokens + 1,
                       items=[(Request(-1, 0.0, prompt_tokens, output_tokens, 0.0, output_tokens=1,
                                       computed_tokens=prompt_tokens), 1, prompt_tokens)])
        return self.cost.step_s(pre) + (output_tokens - 1) * self.cost.step_s(dec)

    def _decode_plan(self, context_tokens: int, drafts: int = 0):
        from sim.core.schedulers.base import StepPlan
        plan = StepPlan()
        plan.add(Request(-1, 0.0, context_tokens, drafts + 2, 0.0, output_tokens=1, computed_tokens=context_tokens),
                 1 + drafts, drafts)
        return plan

    def _drafter_pass_s(self) -> float:
        """A drafter pass reads its weights at the target's effective batch-1 decode bandwidth at a
        2K context (reference section 8: 15.44 GB / 26.26 ms = 588 GB/s)."""
        ctx = 2048
        read = self.spec.weight_read_bytes(self.scenario.weight_format) + ctx * self.spec.kv_bytes_per_token(
            self.scenario.kv.format)
        bandwidth = read / self.cost.step_s(self._decode_plan(ctx))
        return self.drafter_spec.weight_read_bytes(self.scenario.weight_format) / bandwidth

    def _round_time_s(self, req: Request, drafts: int) -> float:
        """One speculative round of `req` alone (adaptive draft length)."""
        ctx = req.prompt_tokens
        return self.cost.step_s(self._decode_plan(ctx, drafts)) + self._speculator.draft_s([drafts], include_index=False)

    def _block_value(self, block, now_s: float) -> float:
        """Value per byte of keeping a cached block (reference section 6, V_h / size): its hit rate
        so far times the time to recompute it at its depth, per byte. Deeper blocks cost more to
        recompute (their attention covers the whole prefix before them)."""
        from sim.models.roofline import sequence_flops
        bs = self.scenario.kv.block_tokens
        age = max(now_s - block.cached_since_s, 1e-9)
        recompute = sequence_flops(self.spec, bs, block.depth * bs, logits=0)
        return (block.hits / age) * recompute / self.block_bytes

    def _new_replica(self, env: simpy.Environment, index: int, rec: Recorder, deadline, incarnation: int) -> Replica:
        """A replica with an empty KV pool (warm prefixes cached) and its own scheduler."""
        sc = self.scenario
        pool = BlockManager(self.num_blocks, sc.kv.block_tokens, self.block_bytes, prefix_caching=sc.kv.prefix_caching,
                            eviction=sc.kv.eviction, host_blocks=self.host_blocks, snapshot_tokens=sc.kv.snapshot_tokens,
                            block_value=self._block_value)
        for wp in sc.kv.warm_prefixes:
            try:
                pool.warm(((prefix_stream(wp.name), 0, wp.tokens),), wp.tokens)
            except ValueError as exc:
                raise ConfigError(f"kv.warm_prefixes: {wp.name}: {exc}") from None
        _, sched_cls = SCHEDULERS[sc.scheduler.kind]
        scheduler = sched_cls(sc.scheduler, pool, sc.kv.admission, deadline,
                              lazy_decode=self.lazy_decode and self.spec_cfg is None,  # rounds differ per request
                              preemption=sc.kv.preemption)
        if self.spec_cfg is not None:
            # one acceptance stream per replica (and per restart), all from the scenario seed
            rng = np.random.default_rng([sc.seed, 5, index, incarnation])
            scheduler.speculator = Speculator(self.spec_cfg, rng, self._round_time_s, self.draft_pass_s,
                                              self.prefill_overhead, self.draft_memory_bytes)
            self._speculators.append(scheduler.speculator)
        timeline = Timeline(rec, index)
        scheduler.timeline = timeline
        return Replica(index, pool, scheduler, simpy.Store(env), timeline)

    def run(self) -> Result:
        sc, wl = self.scenario, self.workload
        cl = sc.cluster
        env = simpy.Environment()
        deadline = None
        if sc.admission_control.reject_late:
            def deadline(req: Request, now_s: float) -> bool:
                limit = min(x for x in (req.deadline_s, sc.slo.e2e_s, math.inf) if x is not None)
                return now_s - req.arrival_s + self._lower_bound_s(req.prompt_tokens, req.max_output_tokens) <= limit
        rec = Recorder(sc.slo, track_request_gaps=sc.slo.itl_s is not None and sc.slo.itl_stat == "p99")
        self._speculators = []
        replicas = [self._new_replica(env, i, rec, deadline, 0) for i in range(cl.replicas)]
        timelines = [r.timeline for r in replicas]
        self._speculator = self._speculators[0] if self._speculators else None
        router = ROUTERS[cl.router.kind]()
        acc_rng = np.random.default_rng(sc.seed).spawn(4)[3]
        state = {"finished": 0, "fault_retries": 0}
        n_total = len(wl)
        warm = frozenset(prefix_stream(wp.name) for wp in sc.kv.warm_prefixes)
        retried = sc.accuracy.max_retries > 0 and sc.accuracy.p_correct < 1

        def shareable(i: int) -> int:
            # a retried request re-sends its prompt: all of it may be hit again
            return int(wl.prompt_tokens[i]) if retried else wl.shareable_tokens(i, warm)

        def make_request(i: int, sent_s: float | None = None) -> Request:
            a = float(wl.arrival_s[i]) if sent_s is None else sent_s  # closed loop: sent when a user frees up
            cancel = float(wl.cancel_at_s[i])
            dl = float(wl.deadline_s[i])
            adapter = int(wl.adapter[i]) if wl.adapter is not None and wl.adapter[i] >= 0 else None
            return Request(i, a, int(wl.prompt_tokens[i]), int(wl.output_tokens[i]), a + float(wl.outside_wait_s[i]),
                           adapter=adapter,
                           deadline_s=None if math.isnan(dl) else dl, cancel_at_s=None if math.isnan(cancel) else cancel,
                           segments=wl.segments_of(i), shareable_tokens=shareable(i))

        def leave(req: Request, now_s: float) -> None:
            rec.on_leave(req, now_s)
            state["finished"] += 1
            if clients is not None:
                clients.on_leave(req)
            if self.progress is not None:
                self.progress(state["finished"], n_total)

        def route(req: Request) -> None:
            """Send a request to a replica the router believes healthy; a replica that is actually
            down refuses it (it fails, or is routed again without that replica)."""
            while True:
                replica = router.choose(req, [r for r in replicas if r.marked_up and r.index not in req.avoid])
                if replica is None:
                    req.status = Status.FAILED
                    req.reject_reason = "cluster: no healthy replica"
                    req.finish_s = env.now
                    leave(req, env.now)
                    return
                if replica.up:
                    req.replica = replica.index
                    replica.inbox.put(req)
                    return
                if not fail_or_retry(req, replica):
                    return

        def fail_or_retry(req: Request, replica: Replica) -> bool:
            """A request lost on a failed replica: True when it should be routed again."""
            req.avoid = req.avoid + (replica.index,)
            if cl.on_failure == "retry" and len(req.avoid) < len(replicas):
                state["fault_retries"] += 1
                req.reset_for_retry()
                return True
            req.status = Status.FAILED
            req.reject_reason = f"cluster: replica {replica.index} failed"
            req.finish_s = env.now
            leave(req, env.now)
            return False

        held: dict[int, list[Request]] = {}   # parallel sampling: branches waiting for their prompt's prefill
        forked: set[int] = set()

        def deliver(req: Request) -> None:
            rec.on_enter(req, env.now)
            lead = int(wl.leader[req.rid]) if wl.leader is not None else -1
            if lead >= 0 and lead not in forked:
                held.setdefault(lead, []).append(req)
            else:
                route(req)

        def make_handlers(replica: Replica):
            scheduler = replica.scheduler
            finished_forks: list[Request] = []

            def release(lead: int, leader: Request | None = None) -> None:
                """The leader's prompt is computed: its branches fork from it (or queue on their own)."""
                forked.add(lead)
                for r in held.pop(lead, []):
                    if leader is not None and scheduler.can_fork(r, leader):
                        r.replica = replica.index
                        scheduler.fork(r, leader, env.now)
                        if r.status is Status.FINISHED:
                            finished_forks.append(r)
                    else:
                        route(r)

            def on_outcome(outcome, now_s: float) -> None:
                if held:
                    for req in outcome.emitted:
                        if req.rid in held and req.output_tokens == 1:
                            release(req.rid, req)
                for req in outcome.finished_decodes + outcome.emitted + finished_forks:
                    if req.status is not Status.FINISHED:
                        continue
                    req.correct = bool(acc_rng.random() < sc.accuracy.p_correct) if sc.accuracy.p_correct < 1 else True
                    if not req.correct and req.attempt <= sc.accuracy.max_retries:
                        retry = Request(req.rid, req.arrival_s, req.prompt_tokens, req.max_output_tokens, now_s,
                                        deadline_s=req.deadline_s, attempt=req.attempt + 1,
                                        preemptions=req.preemptions, recomputed_tokens=req.recomputed_tokens,
                                        segments=req.segments, shareable_tokens=req.shareable_tokens,
                                        adapter=req.adapter)
                        route(retry)
                        continue
                    leave(req, now_s)
                finished_forks.clear()

            def on_dropped(now_s: float) -> None:
                for req in scheduler.dropped:
                    if req.rid in held:
                        release(req.rid)
                    if req.finish_s is None:
                        req.finish_s = now_s
                    leave(req, now_s)
                scheduler.dropped.clear()

            return on_outcome, on_dropped

        def start(replica: Replica) -> None:
            on_outcome, on_dropped = make_handlers(replica)
            replica.process = env.process(engine.replica_loop(env, replica.inbox, replica.scheduler, self.cost,
                                                              replica.timeline, on_outcome, on_dropped))

        def cancel(req: Request) -> None:
            if req.replica is not None and replicas[req.replica].up:
                replicas[req.replica].scheduler.cancel(req, env.now)

        def fault(f) -> object:
            yield env.timeout(f.start_s - env.now) if f.start_s > env.now else env.timeout(0)
            old = replicas[f.replica]
            if not old.up:
                return
            old.up = False
            old.process.interrupt()
            lost = old.requests()
            yield env.timeout(0)  # let the interrupted loop unwind first
            for req in lost:
                if fail_or_retry(req, old):
                    route(req)
            yield env.timeout(f.end_s - env.now)
            fresh = self._new_replica(env, f.replica, rec, deadline, old.incarnation + 1)
            fresh.incarnation = old.incarnation + 1
            fresh.marked_up = old.marked_up
            fresh.timeline = old.timeline  # one iteration log per replica index
            fresh.scheduler.timeline = old.timeline
            fresh.scheduler.iteration = old.timeline.iterations  # iteration indices continue the log
            fresh.retired = old.retired + [old]
            replicas[f.replica] = fresh
            start(fresh)

        def health_checks():
            """Every interval, find each replica up or down; a down one is marked down after the timeout."""
            rc = cl.router
            while state["finished"] < n_total:
                for r in replicas:
                    if r.up:
                        r.marked_up = True
                    elif r.marked_up:
                        env.process(_mark_down(r.index, rc.health_check_timeout_s))
                yield env.timeout(rc.health_check_interval_s)

        def _mark_down(index: int, delay: float):
            yield env.timeout(delay)
            if not replicas[index].up:
                replicas[index].marked_up = False

        for r in replicas:
            start(r)
        clients = closed_loop_clients(env, wl, make_request, deliver)  # None: open loop, arrivals from the workload
        if clients is None:
            env.process(engine.arrivals(env, wl, make_request, deliver, cancel))
        if cl.faults:
            for f in cl.faults:
                env.process(fault(f))
            env.process(health_checks())
        try:
            env.run()
        except costmod.ExtrapolationError as exc:
            raise ConfigError(f"step_time: {exc}") from None
        everyone = [x for r in replicas for x in r.retired + [r]]
        self._kv_demand_blocks = max(max(r.scheduler.kv_demand_peak_blocks, r.pool.peak_blocks) for r in everyone)
        return self._result(rec, everyone, timelines, state)

    # ---- summary ------------------------------------------------------------------------------
    def _result(self, rec: Recorder, replicas: list, timelines: list[Timeline], state: dict) -> Result:
        sc = self.scenario
        cols = rec.table()
        order = np.argsort(cols["id"], kind="stable")
        ints = ("id", "replica", "prompt_tokens", "output_tokens", "cached_tokens", "preemptions", "recomputed_tokens",
                "attempts")
        req = pd.DataFrame({c: (v[order].astype(np.int64) if c in ints
                                else np.array(STATUS_NAMES, dtype=object)[v[order].astype(np.int64)] if c == "status"
                                else v[order].astype(bool) if c in ("met_slo", "kv_waited") else v[order])
                            for c, v in cols.items()})
        tables = [t.table() for t in timelines]
        its = pd.DataFrame({c: np.concatenate([tb[c] for tb in tables]) for c in ITERATION_COLUMNS})
        for c in ITERATION_COLUMNS:
            if c not in ("start_s", "duration_s", "swap_bytes"):
                its[c] = its[c].astype(np.int64)
        busy_s = sum(t.busy_s for t in timelines)
        n_rep = len(timelines)

        finished = req["status"] == "finished"
        served = req["admitted_s"].notna()  # prompts that reached a replica's batch (hit rate's base)
        correct = req["correct"].fillna(0).astype(bool)
        good = finished & correct & req["met_slo"]
        n_good = int(good.sum())
        t0 = float(req["arrival_s"].min()) if len(req) else 0.0
        t1 = float(np.nanmax(req["finish_s"])) if finished.any() else t0
        window = t1 - t0
        itl = weighted_stats(np.frombuffer(rec.itl_gap, dtype=float), np.frombuffer(rec.itl_weight, dtype=np.int64))
        decode_only = (its["prefill_tokens"] == 0) if len(its) else pd.Series([], dtype=bool)
        dec_time = float(its.loc[decode_only, "duration_s"].sum()) if len(its) else 0.0
        dec_tokens = int(its.loc[decode_only, "output_tokens"].sum()) if len(its) else 0
        cap_w = self.hw.tdp_w.value
        if sc.power.model == "cap":
            energy = n_rep * cap_w * window if cap_w is not None else None
        else:
            energy = sc.power.busy_w * busy_s + sc.power.idle_w * max(0.0, n_rep * window - busy_s)
        peak_blocks = max(r.pool.peak_blocks for r in replicas)
        peak_kv = peak_blocks * self.block_bytes
        stats_of = [r.pool.stats for r in replicas]
        kv_limited = int(req["kv_waited"].sum())
        kv_rejected = sum(1 for r in rec.reject_reasons if r.startswith("kv:"))
        card_fit = self.weight_bytes + self.kv_budget_bytes + self.activation_bytes <= self.hw.memory_bytes
        memory_fit = bool(card_fit and kv_limited == 0 and kv_rejected == 0 and int(req["preemptions"].sum()) == 0)
        summary = {
            "scenario": sc.name,
            "seed": sc.seed,
            "requests": int(len(req)),
            "completed": int(finished.sum()),
            "rejected": int((req["status"] == "rejected").sum()),
            "cancelled": int((req["status"] == "cancelled").sum()),
            "good": n_good,
            "makespan_s": window,
            "output_throughput_tok_s": float(req.loc[finished, "output_tokens"].sum() / window) if window > 0 else None,
            "request_throughput_rps": float(finished.sum() / window) if window > 0 else None,
            "goodput_rps": n_good / window if window > 0 else None,
            "decode_throughput_tok_s": dec_tokens / dec_time if dec_time > 0 else None,
            "slo_attainment": n_good / len(req) if len(req) else None,
            "ttft_s": stats(req.loc[finished, "ttft_s"].to_numpy()),
            "itl_s": itl,
            "tpot_s": stats(req.loc[finished, "tpot_s"].to_numpy()),
            "e2e_s": stats(req.loc[finished, "e2e_s"].to_numpy()),
            "iterations": int(len(its)),
            "busy_s": busy_s,
            "replicas": n_rep,
            "failed": int((req["status"] == "failed").sum()),
            "fault_retries": state["fault_retries"],
            "peak_kv_bytes": float(peak_kv),
            "peak_kv_blocks": int(peak_blocks),
            "kv_budget_bytes": int(self.kv_budget_bytes),
            "kv_capacity_bytes": float(self.num_blocks * self.block_bytes),
            "kv_capacity_blocks": int(self.num_blocks),
            "weights_bytes": int(self.weight_bytes),
            "memory_fit": memory_fit,
            "card_fit": bool(card_fit),
            "kv_limited_requests": kv_limited,
            "kv_rejected_requests": kv_rejected,
            "preemptions": int(req["preemptions"].sum()),
            "recomputed_tokens": int(req["recomputed_tokens"].sum()),
            "prefix_hit_tokens": int(req["cached_tokens"].sum()),
            "prefix_hit_rate": (float(req.loc[served, "cached_tokens"].sum() / req.loc[served, "prompt_tokens"].sum())
                                if served.any() else None),
            "evictions": sum(x.evictions for x in stats_of),
            "swap_outs": sum(x.swap_outs for x in stats_of),
            "swap_ins": sum(x.swap_ins for x in stats_of),
            "swapped_bytes": float(sum(x.swapped_bytes for x in stats_of)),
            "cow_copies": sum(x.cow_copies for x in stats_of),
            "gpu_seconds": n_rep * window,
            "gpu_seconds_per_good": n_rep * window / n_good if n_good else None,
            "energy_j": energy,
            "energy_j_per_good": energy / n_good if (n_good and energy is not None) else None,
            "draft_memory_bytes": int(self.draft_memory_bytes),
            "lora_memory_bytes": int(self.lora_memory_bytes),
            "offload_copy_s_per_step": self.offload.copy_s_per_step if self.offload else None,
            "kv_need_bytes": float(self._kv_demand_blocks * self.block_bytes + self.draft_memory_bytes
                                   + self.lora_memory_bytes),
            "speculative": _merge_reports([sp.report() for sp in self._speculators]),
            "little_area": rec.area,
        }
        return Result(summary, req, its)
