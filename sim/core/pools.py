"""Pools of replicas, and the assembly of a disaggregated run (a prefill pool, a decode pool, the
KV link between them, the front end that hands requests over).

A :class:`Pool` is a named group of replicas built from the scenario as that pool sees it: the
scenario with the pool's own scheduler (and parallel layout, where the schema has one), sized and
timed by the same functions as an aggregated replica (sim.core.sizing, sim.core.step_time_builder).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import partial

import simpy

from sim.core.cluster import ROUTERS, Replica, unlink_finished
from sim.core.engine import ModelledExecutor
from sim.core.handoff import HANDOFF_COLUMNS, DisaggFrontend, KVLink
from sim.core.metrics import Recorder, stats
from sim.core.result import Result, RunFacts, card_fits, summarise
from sim.core.sizing import replica_memory
from sim.core.step_time_builder import build_step_time
from sim.io.errors import ConfigError
from sim.models.parallel import Layout, kv_transfer_share
from sim.models import step_time as costmod


def gpus_per_replica(memory) -> int:
    """GPUs one replica spans (its memory's layout; 1 for a one-GPU replica)."""
    return int(getattr(memory, "gpus", 1))


def pool_scenario(scenario, pool_cfg):
    """The scenario as one pool sees it: its own scheduler and layout where the pool gives them."""
    update = {"disaggregation": None}
    if pool_cfg.scheduler is not None:
        update["scheduler"] = pool_cfg.scheduler
    if pool_cfg.parallel is not None:
        update["parallel"] = pool_cfg.parallel
    if pool_cfg.kv_budget is not None:
        update["kv"] = scenario.kv.model_copy(update={"budget": pool_cfg.kv_budget})
    return scenario.model_copy(update=update)


def check_supported(scenario) -> None:
    """Refuse what a disaggregated run does not model yet, naming the field."""
    d = scenario.disaggregation
    problems = []
    if scenario.cluster.replicas != 1:
        problems.append("cluster.replicas: with disaggregation give replicas per pool "
                        "(disaggregation.prefill.replicas, disaggregation.decode.replicas)")
    if scenario.cluster.faults:
        problems.append("cluster.faults: faults are not modelled in disaggregated runs yet")
    if scenario.admission_control.reject_late:
        problems.append("admission_control.reject_late: not modelled in disaggregated runs yet")
    for where, sched in (("scheduler", scenario.scheduler), ("disaggregation.prefill.scheduler", d.prefill.scheduler),
                         ("disaggregation.decode.scheduler", d.decode.scheduler)):
        if getattr(sched, "speculative", None) is not None:
            problems.append(f"{where}.speculative: speculative decoding is not modelled in disaggregated runs yet")
    wl = scenario.workload
    if wl.kind == "requests" and any(r.n > 1 for r in wl.requests):
        problems.append("workload.requests: parallel sampling (n > 1) is not modelled in disaggregated runs yet")
    if problems:
        raise ConfigError(problems)


def link_bandwidth_bytes_per_s(scenario, hw) -> float:
    """Per-GPU bandwidth of the KV link: the scenario's, else the card's kv_transfer_link."""
    given = scenario.disaggregation.link.bandwidth_gbs
    if given is not None:
        return given * 1e9
    link = getattr(hw, "kv_transfer_link", None)
    value = None if link is None else link.bandwidth_gbs_per_direction.value
    if value is None:
        raise ConfigError(f"disaggregation.link.bandwidth_gbs: not given, and hardware {hw.name} has no "
                          "kv_transfer_link bandwidth; give the link's GB/s per GPU (e.g. 50 for 400 Gb/s "
                          "InfiniBand NDR)")
    return value * 1e9


@dataclass
class Pool:
    """A named group of replicas with its own scenario view, memory, step-time model and executor."""

    name: str
    view: object                # a Simulation whose scenario, memory and step time are this pool's
    first_index: int
    count: int
    replicas: list[Replica] = field(default_factory=list)
    executor: object = None

    @property
    def gpus_per_replica(self) -> int:
        return gpus_per_replica(self.view.memory)

    @property
    def gpus(self) -> int:
        return self.count * self.gpus_per_replica

    def build(self, env: simpy.Environment, rec: Recorder, executor=None) -> None:
        """Create the pool's replicas (indices first_index ...) and its executor."""
        self.replicas = [self.view._new_replica(env, self.first_index + k, rec, None, 0) for k in range(self.count)]
        self.executor = executor or ModelledExecutor(self.view.step_time)


def pool_view(sim, name: str, pool_cfg):
    """`sim` as the pool `name` sees it (a shallow copy: profiles and workload shared)."""
    view = copy.copy(sim)
    view.scenario = pool_scenario(sim.scenario, pool_cfg)
    try:
        view.memory = replica_memory(view.scenario, sim.spec, sim.hw)
        view.step_time = build_step_time(view.scenario, sim.base_dir, sim.spec, sim.hw, None)
    except ConfigError as exc:
        raise ConfigError([f"disaggregation.{name}: {line}" for line in exc.lines]) from None
    view._add_step_overheads()
    view._speculators = []
    return view


def state_link_bytes(spec, send: Layout, receive: Layout, kv_of):
    """For a linear-attention model, the bytes a request's handoff is timed with (None otherwise): its KV and its
    state (ModelSpec.kv_bytes_of_sequence), the state weighed by its own share of the busiest GPU link over the KV's
    (the link's lanes are the KV's, sim.models.parallel.kv_transfer_share). The state is split by heads over each
    stage's tp GPUs and by layers over the stages on both sides, so the busiest link carries 1 / (tp x pp) of it on
    the side with fewer GPUs a rank."""
    state = spec.state_bytes_per_sequence
    if not state:
        return None
    ratio = max(1 / (send.tp * send.pp), 1 / (receive.tp * receive.pp)) / kv_transfer_share(spec, send, receive)
    return lambda tokens: kv_of(tokens) - state + state * ratio


def check_disaggregated(sim) -> None:
    """What run_disaggregated checks and builds before it simulates (Simulation.check)."""
    sc = sim.scenario
    d = sc.disaggregation
    check_supported(sc)
    env, rec = simpy.Environment(), Recorder(sc.slo, track_request_gaps=False)
    for name, first, cfg in (("prefill", 0, d.prefill), ("decode", d.prefill.replicas, d.decode)):
        Pool(name, pool_view(sim, name, cfg), first, cfg.replicas).build(env, rec)
    link_bandwidth_bytes_per_s(sc, sim.hw)


def run_disaggregated(sim, executor=None, env: simpy.Environment | None = None) -> Result:
    """Assemble and run a disaggregated scenario: two pools, the link, the handing-over front end.
    Each pool's replicas ask their own step-time model; an `executor` given (a replay) runs both."""
    sc = sim.scenario
    d = sc.disaggregation
    check_supported(sc)
    env = env or simpy.Environment()
    rec = Recorder(sc.slo, track_request_gaps=sc.slo.itl_s is not None and sc.slo.itl_stat == "p99")
    sim._speculators = []
    pre = Pool("prefill", pool_view(sim, "prefill", d.prefill), 0, d.prefill.replicas)
    dec = Pool("decode", pool_view(sim, "decode", d.decode), d.prefill.replicas, d.decode.replicas)
    for pool in (pre, dec):
        pool.build(env, rec, executor)
    send, receive = (Layout.of(pool.view.scenario.parallel) for pool in (pre, dec))
    lanes = 1.0 / kv_transfer_share(sim.spec, send, receive)
    link = KVLink(link_bandwidth_bytes_per_s(sc, sim.hw), d.link.latency_s,
                  int(lanes) if lanes.is_integer() else lanes, pre.count, send.attention_dp)
    kind = sc.cluster.router.kind
    kv_of = partial(sim.spec.kv_bytes_of_sequence, fmt=sc.kv.format)
    frontend = DisaggFrontend(env, sc, sim.workload, pre.replicas, ROUTERS[kind](), dec.replicas, ROUTERS[kind](), link,
                              kv_of, rec, sim.progress, state_link_bytes(sim.spec, send, receive, kv_of))
    for pool in (pre, dec):
        for r in pool.replicas:
            frontend.start(r, pool.executor)
    frontend.open()
    try:
        env.run()
    except costmod.ExtrapolationError as exc:
        raise ConfigError(f"step_time: {exc}") from None
    result = _summarise(sim, rec, frontend, pre, dec, link)
    unlink_finished(env, pre.replicas + dec.replicas)
    return result


def _summarise(sim, rec: Recorder, frontend: DisaggFrontend, pre: Pool, dec: Pool, link: KVLink) -> Result:
    everyone = pre.replicas + dec.replicas
    demand = max(max(r.scheduler.kv_demand_peak_blocks, r.pool.peak_blocks) for r in everyone)
    busy_gpu_s = sum(r.timeline.busy_s * p.gpus_per_replica for p in (pre, dec) for r in p.replicas)
    facts = RunFacts(sim.scenario, sim.hw, dec.view.memory, everyone, [r.timeline for r in everyone], 0, demand,
                     None, gpus=pre.gpus + dec.gpus, busy_gpu_s=busy_gpu_s)
    result = summarise(rec, facts)
    extra = frontend.columns(result.requests["id"].to_numpy())
    for c in HANDOFF_COLUMNS:
        result.requests[c] = extra[c]
    fits = [card_fits(p.view.memory, sim.hw) for p in (pre, dec)]
    s = result.summary
    s["card_fit"] = all(fits)
    s["memory_fit"] = bool(s["memory_fit"] and all(fits))
    s["gpus"] = pre.gpus + dec.gpus
    s.pop("parallel", None)  # one layout per pool: each pool's part says its own
    s["disaggregation"] = {
        "prefill": _pool_part(pre, fits[0], result, "prefill"),
        "transfer": _transfer_part(result.requests, link),
        "decode": _pool_part(dec, fits[1], result, "decode"),
    }
    return result


def _pool_part(pool: Pool, fit: bool, result: Result, role: str) -> dict:
    """One pool's replicas, GPUs, busy time, iterations, memory, and its own latency share."""
    its = result.iterations
    mine = its[(its["replica"] >= pool.first_index) & (its["replica"] < pool.first_index + pool.count)]
    window = result.summary["makespan_s"]
    mem = pool.view.memory
    busy = float(sum(r.timeline.busy_s for r in pool.replicas))
    req = result.requests
    part = {"replicas": pool.count, "gpus_per_replica": pool.gpus_per_replica, "gpus": pool.gpus,
            "scheduler": pool.view.scenario.scheduler.kind, "busy_s": busy,
            "utilization": busy / (pool.count * window) if window > 0 else None,
            "iterations": int(len(mine)), "gpu_seconds": pool.gpus * window,
            "kv_capacity_blocks": int(mem.num_blocks), "kv_budget_bytes": int(mem.kv_budget_bytes),
            "weights_bytes": int(mem.weight_bytes), "card_fit": bool(fit),
            "peak_kv_blocks": int(max(r.pool.peak_blocks for r in pool.replicas))}
    if pool.gpus_per_replica > 1:
        part["parallel"] = mem.per_gpu()
    if role == "prefill":
        done = req["prefill_done_s"].notna()
        part["prefill_s"] = stats((req.loc[done, "prefill_done_s"] - req.loc[done, "arrival_s"]).to_numpy())
        part["queue_s"] = stats((req.loc[done, "admitted_s"] - req.loc[done, "arrival_s"]).to_numpy())
    else:
        ok = (req["status"] == "finished") & req["decode_admitted_s"].notna() & (req["output_tokens"] > 1)
        sub = req.loc[ok]
        part["queue_s"] = stats((sub["decode_admitted_s"] - sub["transfer_end_s"]).to_numpy())
        part["tpot_s"] = stats(((sub["finish_s"] - sub["decode_admitted_s"]) / (sub["output_tokens"] - 1)).to_numpy())
    return part


def _transfer_part(req, link: KVLink) -> dict:
    sent = req["transfer_end_s"].notna()
    sub = req.loc[sent]
    return {"bandwidth_bytes_per_s": link.bytes_per_s, "lanes": link.lanes,
            "channels": link.channels, "latency_s": link.latency_s,
            "transfers": int(sent.sum()), "bytes": float(sub["kv_transfer_bytes"].sum()),
            "bytes_per_request": stats(sub["kv_transfer_bytes"].to_numpy()),
            "transfer_s": stats((sub["transfer_end_s"] - sub["prefill_done_s"]).to_numpy()),
            "link_wait_s": stats((sub["transfer_start_s"] - sub["prefill_done_s"]).to_numpy())}


def describe_pools(part: dict) -> list[str]:
    """summary.json's `disaggregation` part as text lines (capsim run prints them)."""
    def ms(st) -> str:
        return "-" if st is None or st.get("median") is None else f"{1e3 * st['median']:.2f} ms median"
    pre, tr, dec = part["prefill"], part["transfer"], part["decode"]
    util = lambda p: "-" if p["utilization"] is None else f"{100 * p['utilization']:.0f}%"  # noqa: E731
    return [f"prefill pool: {pre['replicas']} x {pre['gpus_per_replica']} GPU(s), busy {util(pre)}, "
            f"queue {ms(pre['queue_s'])}, prefill done {ms(pre['prefill_s'])} after arrival",
            f"KV transfer: {tr['transfers']} transfers, {_mb(tr['bytes_per_request'])} MB median each, "
            f"{tr['bandwidth_bytes_per_s'] / 1e9:.4g} GB/s, {ms(tr['transfer_s'])} (link wait {ms(tr['link_wait_s'])})",
            f"decode pool: {dec['replicas']} x {dec['gpus_per_replica']} GPU(s), busy {util(dec)}, "
            f"queue after transfer {ms(dec['queue_s'])}, pool TPOT {ms(dec['tpot_s'])}"]


def _mb(st) -> str:
    return "-" if st is None or st.get("median") is None else f"{st['median'] / 1e6:.1f}"
