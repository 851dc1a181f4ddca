"""Simulation: assembles one scenario's serving system and runs it on SimPy's clock.

The pieces, each in its own module: the replica's memory (sim.core.sizing), its step-time model
(sim.core.step_time_builder), replicas with a KV pool and a scheduler (sim.core.cluster), the front
end that routes requests and takes them back (sim.core.frontend), faults (sim.core.faults), the
engine loop (sim.core.engine), and the summary (sim.core.result).
"""

from __future__ import annotations

import gc
import math
import sys
import threading
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np
import simpy

from sim.core.cluster import ROUTERS, Replica, unlink_finished
from sim.core.engine import ModelledExecutor, StepExecutor
from sim.core.faults import FaultInjector
from sim.core.frontend import Frontend
from sim.core.kv import BlockManager
from sim.core.kv_count import CountingBlockManager, counting_suffices
from sim.core.metrics import Recorder, Timeline
from sim.core.request import Request
from sim.core.result import Result, RunFacts, merge_speculation, summarise
from sim.core.schedulers import SCHEDULERS
from sim.core.schedulers.ranked import RankedScheduler, split_limits
from sim.core.schedulers.speculation import Speculator
from sim.core.sizing import replica_memory
from sim.core.step_time_builder import build_step_time
from sim.io.config import Scenario
from sim.io.describe import describe_setup
from sim.io.errors import ConfigError
from sim.io.notices import say_once
from sim.io.profiles import load_hardware, load_model
from sim.models import step_time as costmod
from sim.models.spec import scenario_spec
from sim.workloads.workload import build_workload, prefix_stream

__all__ = ["Simulation", "Result"]


GC_YOUNG_THRESHOLD = 50_000
"""Container objects allocated (net) between two collections of the youngest generation while a run simulates
(Python's default is 700)."""


_GC_LOCK = threading.Lock()
_gc_state = {"depth": 0, "threshold": None}  # runs inside fewer_collections now, and the thresholds to restore


@contextmanager
def fewer_collections():
    """While a run simulates, the cyclic garbage collector runs rarely: its youngest generation is collected every
    GC_YOUNG_THRESHOLD container allocations instead of every 700 (Python's default), so the older generations,
    which hold every object of every imported module, are walked rarely too. A run makes almost no reference cycles
    (a few dozen in a 100,000-request Poisson run), and the collector's share of such a run's CPU falls from about 6%
    to under 1% (docs/benchmarks.md). What earlier runs left in cycles is collected as the first run in starts (the
    young generations only: cheap), so runs one after another in a process (a sweep's points) hold no more than
    before. A process that turned automatic collection off (threshold 0) or collects more rarely already keeps its
    setting; the thresholds come back when the last run inside one ends (runs nest, and may overlap in threads)."""
    with _GC_LOCK:
        if _gc_state["depth"] == 0:
            old = _gc_state["threshold"] = gc.get_threshold()
            if old[0]:
                gc.collect(1)  # what earlier runs left in cycles (their tables' spill files, say) goes now
                gc.set_threshold(max(old[0], GC_YOUNG_THRESHOLD), *old[1:])
        _gc_state["depth"] += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _gc_state["depth"] -= 1
            if _gc_state["depth"] == 0:
                gc.set_threshold(*_gc_state["threshold"])


def _load(loader, name: str, base_dir: Path):
    """A profile by name, or by a YAML path relative to the scenario."""
    return loader(base_dir / name) if name.endswith(".yaml") else loader(name)


class Simulation:
    """A scenario's serving system. The constructor builds (profiles, memory, step-time model,
    workload); run() assembles replicas, router, front end and faults on a clock and runs them.

    `step_time` is the step-time model the replicas' executor asks; a caller may wrap or replace it
    before run() (calibration evaluates measured durations that way). `speculator_factory` builds each
    replica's Speculator (same signature as the class); a replay passes its own.
    """

    def __init__(self, scenario: Scenario, base_dir: Path | str = ".", progress: Callable[[int, int], None] | None = None,
                 stream=None, lazy_decode: bool = True, speculator_factory=Speculator, arrival_feed: bool = True):
        self.scenario = scenario
        self.base_dir = Path(base_dir)
        self.progress = progress
        self.lazy_decode = lazy_decode
        self.arrival_feed = arrival_feed
        """Let a lone engine loop release the arrivals itself (engine.ArrivalFeed; False: `arrivals` as a process)."""
        self.speculator_factory = speculator_factory
        self.model = _load(load_model, scenario.model, self.base_dir)
        self.hw = _load(load_hardware, scenario.hardware, self.base_dir)
        self.spec = scenario_spec(scenario, self.model)
        self.spec_cfg = getattr(scenario.scheduler, "speculative", None)
        sized = scenario  # a disaggregated scenario's defaults are its decode pool's (sim.core.pools builds each pool)
        if getattr(scenario, "disaggregation", None) is not None:
            from sim.core.pools import pool_scenario
            sized = pool_scenario(scenario, scenario.disaggregation.decode)
        try:
            self.memory = replica_memory(sized, self.spec, self.hw)
            self.step_time = build_step_time(sized, self.base_dir, self.spec, self.hw, stream)
        except ConfigError as exc:  # a pool's layout or budget: name the pool's fields
            if sized is scenario:
                raise
            raise ConfigError([f"disaggregation.decode: {line}" for line in exc.lines]) from None
        self._add_step_overheads()
        self.workload = build_workload(scenario.workload, scenario.seed, self.base_dir)
        latency = scenario.cluster.frontend_latency_s
        if latency > 0:  # every request reaches the engine that long after its send: a wait outside the engine
            self.workload = replace(self.workload, outside_wait_s=self.workload.outside_wait_s + latency)
        self._check_adapters()
        self._warn_beyond_context(stream or sys.stderr)
        self._counting: bool | None = None  # whether replicas get a count-only KV pool (decided at the first one)
        self._note_linear_prefix_reuse(stream or sys.stderr)

    def _warn_beyond_context(self, stream) -> None:
        """Say when requests need more positions (prompt + output) than the model has: the simulator serves
        them as asked, a real engine would refuse them (vLLM: max_model_len)."""
        limit = self.model.max_position_embeddings
        need = self.workload.prompt_tokens + self.workload.output_tokens
        over = int((need > limit).sum())
        if over:  # once per process: a plan or sweep builds it for every point
            say_once((self.scenario.name, self.scenario.model, over, int(need.max())),
                     f"warning: workload: {over:,} of {len(need):,} requests need more than {self.scenario.model}'s "
                     f"{limit:,} positions (prompt + output, up to {int(need.max()):,}); simulated as asked, a real "
                     "engine would refuse them", stream)

    def _note_linear_prefix_reuse(self, stream) -> None:
        """Say when a linear-attention model's prompts share prefixes and every match is reused whole: the KV cache
        does not hold the layers' recurrent state at the match, which engines restore only where they snapshot it
        (kv.snapshot_tokens), so the hits are an upper bound."""
        sc = self.scenario
        if self.model.linear_attention is None or not sc.kv.prefix_caching or sc.kv.snapshot_tokens:
            return
        if self.workload.shared_streams or sc.kv.warm_prefixes:  # prompts that can match another's blocks
            say_once((sc.name, sc.model, "linear prefix"),
                     f"note: kv: {sc.model} has linear-attention layers, whose state at a matched prefix the KV cache "
                     "does not hold; every prefix hit is reused whole, an upper bound (engines restore the state only "
                     "where they snapshot it: set kv.snapshot_tokens)", stream)

    def _add_step_overheads(self) -> None:
        """Drafts, swaps, KV conversion, weight streaming and LoRA on top of the step-time model."""
        sc, mem, kv = self.scenario, self.memory, self.scenario.kv
        self.draft_pass_s, self.prefill_overhead = None, 0.0
        if self.spec_cfg is not None:
            d = self.spec_cfg.draft
            if d.kind == "draft_model":
                self.draft_pass_s = d.pass_s or self._drafter_pass_s()
                self.prefill_overhead = (d.prefill_overhead if d.prefill_overhead is not None else
                                         mem.drafter_spec.active_matrix_params / self.spec.active_matrix_params)
            elif d.kind == "parallel":
                self.prefill_overhead = d.prefill_overhead
            self.step_time = costmod.WithDrafts(self.step_time, self.prefill_overhead)
        lora = sc.lora
        if mem.host_blocks or kv.conversion_s_per_token or mem.offload or (lora and lora.per_adapter_s):
            self.step_time = costmod.Overheads(
                self.step_time, self.hw.host_link_bytes_per_s, kv.conversion_s_per_token,
                mem.offload.copy_s_per_step if mem.offload else 0.0,
                sc.offload.prefetch_buffers if mem.offload else 2,
                lora.per_adapter_s if lora else 0.0)

    def _check_adapters(self) -> None:
        used = self.workload.adapter
        if used is not None and len(used) and used.max() >= 0:
            have = 0 if self.scenario.lora is None else self.scenario.lora.adapters
            if used.max() >= have:
                raise ConfigError(f"workload: request {int(np.argmax(used >= have))} uses LoRA adapter "
                                  f"{int(used.max())} but lora.adapters is {have}")

    # ---- what the replicas' processes ask ---------------------------------------------------
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
        return self.step_time.step_s(pre) + (output_tokens - 1) * self.step_time.step_s(dec)

    def _decode_plan(self, context_tokens: int, drafts: int = 0):
        """A probe: one decode (or speculative round) of a made-up request at `context_tokens`."""
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
        bandwidth = read / self.step_time.step_s(self._decode_plan(ctx))
        return self.memory.drafter_spec.weight_read_bytes(self.scenario.weight_format) / bandwidth

    def _round_time_s(self, req: Request, drafts: int) -> float:
        """One speculative round of `req` alone (adaptive draft length)."""
        ctx = req.prompt_tokens
        return self.step_time.step_s(self._decode_plan(ctx, drafts)) + self._speculator.draft_s([drafts], include_index=False)

    def _block_value(self, block, now_s: float) -> float:
        """Value per byte of keeping a cached block (reference section 6, V_h / size): its hit rate
        so far times the time to recompute it at its depth, per byte. Deeper blocks cost more to
        recompute (their attention covers the whole prefix before them)."""
        from sim.models.roofline import sequence_flops
        bs = self.scenario.kv.block_tokens
        age = max(now_s - block.cached_since_s, 1e-9)
        recompute = sequence_flops(self.spec, bs, block.depth * bs, logits=0)
        return (block.hits / age) * recompute / self.memory.block_bytes

    def _new_replica(self, env: simpy.Environment, index: int, rec: Recorder, deadline, incarnation: int) -> Replica:
        """A replica with an empty KV pool (warm prefixes cached) and its own scheduler."""
        sc = self.scenario
        mem = self.memory
        if self._counting is None:
            self._counting = counting_suffices(sc, self.workload)
        if self._counting:  # no block can ever be matched or shared: counts are the same
            pool = CountingBlockManager(mem.num_blocks, sc.kv.block_tokens, mem.block_bytes, host_blocks=mem.host_blocks,
                                        prefix_caching=sc.kv.prefix_caching)
        else:
            pool = BlockManager(mem.num_blocks, sc.kv.block_tokens, mem.block_bytes,
                                prefix_caching=sc.kv.prefix_caching, eviction=sc.kv.eviction,
                                host_blocks=mem.host_blocks, snapshot_tokens=sc.kv.snapshot_tokens,
                                block_value=self._block_value, prefix_index=sc.kv.prefix_index)
        for wp in sc.kv.warm_prefixes:
            try:
                pool.warm(((prefix_stream(wp.name), 0, wp.tokens),), wp.tokens)
            except ValueError as exc:
                raise ConfigError(f"kv.warm_prefixes: {wp.name}: {exc}") from None
        scheduler = self._scheduler(pool, deadline, index, incarnation)
        if self.spec_cfg is not None:
            # one acceptance stream per replica (and per restart), all from the scenario seed
            rng = np.random.default_rng([sc.seed, 5, index, incarnation])
            scheduler.speculator = self.speculator_factory(self.spec_cfg, rng, self._round_time_s, self.draft_pass_s,
                                                           self.prefill_overhead, mem.draft_memory_bytes)
            self._speculators.append(scheduler.speculator)
        timeline = Timeline(rec, index)
        scheduler.timeline = timeline
        replica = Replica(index, pool, scheduler, simpy.Store(env), timeline)
        replica.balance_ranks = getattr(getattr(sc, "parallel", None), "attention_dp", 1)
        return replica

    def _scheduler(self, pool, deadline, index: int, incarnation: int):
        """The replica's scheduler: the scenario's policy, or one per attention-DP rank when the ranks are bound to
        their requests (parallel.attention_dp_routing; sim.core.schedulers.ranked), its draws from the seed."""
        sc = self.scenario
        _, sched_cls = SCHEDULERS[sc.scheduler.kind]
        make = lambda cfg: sched_cls(cfg, pool, sc.kv.admission, deadline,  # noqa: E731
                                     lazy_decode=self.lazy_decode and self.spec_cfg is None,  # rounds differ per request
                                     preemption=sc.kv.preemption)
        cfg, slots = sc.scheduler, self.memory.state_slots
        if slots is not None and slots < cfg.max_num_seqs:  # the linear-attention state pool's slots (sim.core.sizing)
            cfg = cfg.model_copy(update={"max_num_seqs": slots})
        par = getattr(sc, "parallel", None)
        if par is None or par.attention_dp == 1 or par.attention_dp_routing == "shared_queue":
            return make(cfg)
        if self.spec_cfg is not None:
            raise ConfigError("parallel.attention_dp_routing: speculative decoding on ranks bound to their requests "
                              "is not modelled; allowed with scheduler.speculative: shared_queue (or leave it out)")
        per_rank = split_limits(cfg, par.attention_dp)
        return RankedScheduler([make(per_rank) for _ in range(par.attention_dp)], par.attention_dp_routing,
                               [sc.seed, 9, index, incarnation])

    def _deadline_check(self):
        """Admission control's test (None when late requests are not rejected): can `req` still meet
        its deadline if it started now, alone on the card?"""
        sc = self.scenario
        if not sc.admission_control.reject_late:
            return None

        def deadline(req: Request, now_s: float) -> bool:
            limit = min(x for x in (req.deadline_s, sc.slo.e2e_s, math.inf) if x is not None)
            return now_s - req.arrival_s + self._lower_bound_s(req.prompt_tokens, req.max_output_tokens) <= limit
        return deadline

    def check(self) -> None:
        """Build what a run builds before it simulates (the replicas, their KV pools and warm prefixes, a disaggregated
        scenario's two pools) and raise its ConfigError, without simulating (capsim validate-scenario)."""
        if getattr(self.scenario, "disaggregation", None) is not None:
            from sim.core.pools import check_disaggregated
            check_disaggregated(self)
            return
        env, rec = simpy.Environment(), Recorder(self.scenario.slo, track_request_gaps=False)
        self._speculators = []
        for i in range(self.scenario.cluster.replicas):
            self._new_replica(env, i, rec, None, 0)

    def run(self, executor: StepExecutor | None = None, env: simpy.Environment | None = None) -> Result:
        """Run the scenario to the end: on SimPy's virtual clock with the step-time model by default;
        a replay passes its own executor (and environment) to run the same loop for real. summary.json
        ends with `setup`: model, card, scheduler, SLOs and the step-time fit error (sim.io.describe)."""
        with fewer_collections():
            result = self._run(executor, env)
        result.summary["setup"] = describe_setup(self.scenario, self.base_dir)
        return result

    def _run(self, executor: StepExecutor | None, env: simpy.Environment | None) -> Result:
        sc = self.scenario
        if getattr(sc, "disaggregation", None) is not None:  # a prefill pool and a decode pool (sim.core.pools)
            from sim.core.pools import run_disaggregated
            return run_disaggregated(self, executor, env)
        own_clock = env is None  # nothing is scheduled on it but what this run schedules
        env = env or simpy.Environment()
        if executor is None and costmod.shape_cache_of(self.step_time) is not None:
            executors = {}   # each replica's engine keeps its own kernels (a restarted one starts empty)
            own = lambda replica: executors.setdefault(id(replica), ModelledExecutor(self.step_time))  # noqa: E731
        else:
            executor = executor or ModelledExecutor(self.step_time)
            own = lambda replica: executor  # noqa: E731
        deadline = self._deadline_check()
        rec = Recorder(sc.slo, track_request_gaps=sc.slo.itl_s is not None and sc.slo.itl_stat == "p99")
        self._speculators = []
        replicas = [self._new_replica(env, i, rec, deadline, 0) for i in range(sc.cluster.replicas)]
        timelines = [r.timeline for r in replicas]
        self._speculator = self._speculators[0] if self._speculators else None
        frontend = Frontend(env, sc, self.workload, replicas, ROUTERS[sc.cluster.router.kind](), rec, self.progress)
        # the arrivals released by the engine loop itself when they and it are all there is to schedule
        feed = (frontend.arrival_feed() if self.arrival_feed and own_clock and not sc.cluster.faults
                and all(type(own(r)) is ModelledExecutor for r in replicas) else None)
        for r in replicas:
            frontend.start(r, own(r), feed)
        frontend.open(feed)
        if sc.cluster.faults:
            FaultInjector(env, sc.cluster, frontend, lambda index, inc: self._new_replica(env, index, rec, deadline, inc),
                          lambda replica: frontend.start(replica, own(replica))).begin()
        try:
            env.run()
        except costmod.ExtrapolationError as exc:
            raise ConfigError(f"step_time: {exc}") from None
        everyone = [x for r in replicas for x in r.retired + [r]]
        demand = max(max(r.scheduler.kv_demand_peak_blocks, r.pool.peak_blocks) for r in everyone)
        facts = RunFacts(sc, self.hw, self.memory, everyone, timelines, frontend.fault_retries, demand,
                         merge_speculation([sp.report() for sp in self._speculators]))
        result = summarise(rec, facts)
        unlink_finished(env, everyone)
        return result
