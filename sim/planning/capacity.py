"""Capacity plans: goodput capacity (DistServe), replicas for a target rate, the cheapest
configuration of a search space, and the memory / deadline plane (reference section 9).

    capsim plan SCENARIO --slo ttft=2,tpot=0.1,e2e=30 --attainment 0.9 [--target-rps R]
                [--search key=v1,v2 ...] [--replications 3] [--requests N] --out DIR
    capsim plan-plane FILES... [--deadline S] --out DIR

Definitions (docs/capacity.md):

* A request *attains* the SLOs when it finished, its answer is correct (always, unless the scenario
  sets accuracy.p_correct < 1) and it is within every bound given: TTFT <= ttft, TPOT <= tpot
  (one-token outputs have no TPOT and pass), E2E <= e2e, its largest inter-token gap <= itl.
  Rejected, cancelled and failed requests do not attain. Attainment = attaining / all requests.
* Goodput capacity (DistServe, OSDI'24): the highest arrival rate at which the attainment meets
  the target, per replica (total rate / cluster.replicas). Found by bisection on the rate; the
  attainment at a rate is the mean over `replications` seeds (scenario seed, seed + 1, ...).
* Request goodput (vLLM `bench serve --goodput`): attaining requests / the run's window, at
  each rate tried, with each SLO's own attainment next to it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from sim.io.describe import step_time_fit
from sim.io.errors import ConfigError
from sim.planning.plane import plot_plane
from sim.planning.sensitivity import check_error, step_time_sensitivity
from sim.planning.short_run import short_run_warning
from sim.planning.slo import SLO, attainment, slo_from_scenario
from sim.planning.sweep import Axis, Base, Override, Runner, display_value, flatten, grid_points, parse_axes, write_tables

SUMMARY_KEYS = ("requests", "completed", "rejected", "failed", "makespan_s", "request_throughput_rps", "goodput_rps",
                "gpu_seconds", "energy_j", "kv_need_bytes", "kv_budget_bytes", "memory_fit", "card_fit", "replicas",
                "ttft_s_median", "ttft_s_p99", "tpot_s_median", "tpot_s_p99", "e2e_s_median", "e2e_s_p99",
                "preemptions")


def run_case(base: Base, task: dict) -> dict:
    """One seeded run on a worker: the summary keys a plan uses and the attainment of its SLOs."""
    res = base.simulate(task["overrides"])
    flat = flatten(res.summary)
    out = {k: flat.get(k) for k in SUMMARY_KEYS}
    out.update(attainment(res.requests, SLO(**task["slo"]), task["target"]))
    window = res.summary["makespan_s"]
    out["request_goodput_rps"] = out["good"] / window if window else None
    return out


# ---- the rate knob ----------------------------------------------------------------------------

@dataclass(frozen=True)
class RateKnob:
    """How a plan sets the offered load: workload.arrival.rate_rps, or a trace's rate_scale."""

    kind: str              # "arrival" or "trace"
    rate: float            # the scenario's own total rate, requests/s
    scale: float = 1.0     # the trace's rate_scale at that rate

    def overrides(self, rate: float) -> list[Override]:
        """The scenario overrides that make the workload arrive at `rate` requests per second."""
        if self.kind == "arrival":
            return [("workload.arrival.rate_rps", float(rate))]
        return [("workload.rate_scale", float(self.scale * rate / self.rate))]


SUPPORTED = ("plan sets the arrival rate, so the workload must be synthetic with poisson, gamma or constant "
             "arrivals (workload.arrival.rate_rps) or a trace (workload.rate_scale)")


def rate_knob(base: Base, extra: Iterable[Override] = ()) -> RateKnob:
    """How the plan turns the rate up and down for this scenario: the arrival process, or a trace's rate scale."""
    sc = base.scenario(extra)
    wl = sc.workload
    if wl.kind == "synthetic":
        if wl.arrival.kind == "all_at_once":
            raise ConfigError(f"{base.source}: workload.arrival: all_at_once has no rate; {SUPPORTED}")
        return RateKnob("arrival", float(wl.arrival.rate_rps))
    if wl.kind == "trace":
        from sim.workloads.workload import build_workload
        w = build_workload(wl, sc.seed, Path(base.base_dir))
        span = float(w.arrival_s.max() - w.arrival_s.min()) if len(w) else 0.0
        if len(w) < 2 or span <= 0:
            raise ConfigError(f"{base.source}: workload: the trace needs two or more distinct arrival times "
                              "to have a rate")
        return RateKnob("trace", (len(w) - 1) / span, wl.rate_scale)
    raise ConfigError(f"{base.source}: workload.kind: {wl.kind} has no arrival rate; {SUPPORTED}")


# ---- results ------------------------------------------------------------------------------------

@dataclass
class Point:
    """The runs of one configuration at one total rate, one per seed."""

    rate: float
    replicas: int
    runs: list[dict]
    label: str = ""

    @property
    def per_replica(self) -> float:
        return self.rate / self.replicas

    def mean(self, key: str) -> float | None:
        """Mean of `key` over the replications (None when no run has it)."""
        vals = [r[key] for r in self.runs if r.get(key) is not None]
        return float(np.mean(vals)) if vals else None

    @property
    def att(self) -> float:
        return self.mean("attainment")

    @property
    def att_min(self) -> float:
        return min(r["attainment"] for r in self.runs)

    @property
    def att_max(self) -> float:
        return max(r["attainment"] for r in self.runs)

    def total(self, key: str) -> float | None:
        """Sum of `key` over the replications (None when any run lacks it)."""
        vals = [r[key] for r in self.runs]
        return None if any(v is None for v in vals) else float(sum(vals))

    def costs(self) -> dict:
        """GPU-seconds and energy per good result, over all replications together."""
        good = sum(r["good"] for r in self.runs)
        gpu, energy = self.total("gpu_seconds"), self.total("energy_j")
        return {"good": good,
                "gpu_hours_per_million_good": gpu / good * 1e6 / 3600 if good and gpu is not None else None,
                "energy_j_per_good": energy / good if good and energy is not None else None}

    def row(self) -> dict:
        """One row of rates.csv: the rate, the attainment and its spread, each SLO's attainment, costs."""
        keys = [k for k in self.runs[0] if k.startswith("attainment_")]
        return {"rate_rps": self.rate, "rate_per_replica_rps": self.per_replica, "replicas": self.replicas,
                "attainment": self.att, "attainment_min": self.att_min, "attainment_max": self.att_max,
                **{k: self.mean(k) for k in keys},
                "request_goodput_rps": self.mean("request_goodput_rps"),
                "request_goodput_rps_per_replica": _div(self.mean("request_goodput_rps"), self.replicas),
                "request_throughput_rps": self.mean("request_throughput_rps"),
                "ttft_s_p99": self.mean("ttft_s_p99"), "tpot_s_p99": self.mean("tpot_s_p99"),
                "e2e_s_p99": self.mean("e2e_s_p99"), "makespan_s": self.mean("makespan_s")}


def _div(a, b):
    return None if a is None or not b else a / b


@dataclass
class PlanResult:
    """Everything a plan found: capacity, the rates tried, replicas for the target, the search's ranking."""
    scenario: str
    slo: SLO
    target: float
    replications: int
    requests_per_run: int | None
    base_replicas: int
    rate_kind: str
    tol: float
    points: dict[float, Point] = field(default_factory=dict)
    capacity_rps: float | None = None           # total, highest rate whose mean attainment met the target
    bracket: tuple[float | None, float | None] = (None, None)
    interval: tuple[float | None, float | None] = (None, None)
    note: str = ""
    target_rps: float | None = None
    replicas: dict | None = None
    search: list[dict] | None = None
    search_rate_rps: float | None = None
    plane: list[dict] | None = None
    files: list[Path] = field(default_factory=list)
    step_time_fit: dict | None = None           # the base scenario's step-time fit error (sim.io.describe)
    sensitivity: dict | None = None             # capacity with steps faster / slower (sim.planning.sensitivity)
    warnings: list[str] = field(default_factory=list)  # why an answer may not hold (short_run_warning)

    def per_replica(self, x):
        """A cluster-wide rate as a per-replica one (None stays None)."""
        return None if x is None else x / self.base_replicas

    def as_dict(self) -> dict:
        """plan.json's content."""
        return {
            "scenario": self.scenario, "slo": self.slo.given(), "attainment_target": self.target,
            "replications": self.replications, "requests_per_run": self.requests_per_run,
            "rate_knob": self.rate_kind, "tolerance": self.tol, "base_replicas": self.base_replicas,
            "capacity": {
                "rate_rps": self.capacity_rps, "per_replica_rps": self.per_replica(self.capacity_rps),
                "bracket_rps": list(self.bracket), "bracket_per_replica_rps": [self.per_replica(x) for x in self.bracket],
                "interval_rps": list(self.interval),
                "interval_per_replica_rps": [self.per_replica(x) for x in self.interval],
                "note": self.note},
            "rates": [p.row() for p in sorted(self.points.values(), key=lambda p: p.rate)],
            "target_rps": self.target_rps, "replicas": self.replicas,
            "search_rate_rps": self.search_rate_rps, "search": self.search, "plane": self.plane,
            "step_time_fit": self.step_time_fit, "sensitivity": self.sensitivity, "warnings": list(self.warnings),
        }


# ---- the plan --------------------------------------------------------------------------------

class Planner:
    """Runs the plan's simulations (on Dask) and caches each (configuration, rate) point."""
    def __init__(self, base: Base, slo: SLO, target: float, replications: int, requests: int | None,
                 runner: Runner, log: Callable[[str], None]):
        self.base, self.slo, self.target, self.k = base, slo, target, replications
        self.runner, self.log = runner, log
        sc = base.scenario()
        self.seed = sc.seed
        self.base_replicas = sc.cluster.replicas
        self.requests_override: list[Override] = []
        self.synthetic = sc.workload.kind == "synthetic"
        if requests is not None:
            key = "workload.num_requests" if self.synthetic else "workload.max_requests"
            self.requests_override = [(key, int(requests))]
        self.knob = rate_knob(base, self.requests_override)
        sc = base.scenario(self.requests_override)
        self.requests = sc.workload.num_requests if self.synthetic else getattr(sc.workload, "max_requests", None)
        self.cache: dict[float, Point] = {}
        self.replica_points: dict[int, Point] = {}

    # -- running ----------------------------------------------------------------------------
    def _scaled_requests(self, replicas: int) -> list[Override]:
        """Keep the requests per replica of the base scenario when the replica count changes."""
        if not self.synthetic or replicas == self.base_replicas:
            return list(self.requests_override)
        return [("workload.num_requests", max(1, math.ceil(self.requests * replicas / self.base_replicas)))]

    def _tasks(self, config: list[Override], rate: float, replicas: int) -> list[dict]:
        ov = [*config, *self._scaled_requests(replicas), *self.knob.overrides(rate)]
        return [{"overrides": [*ov, ("seed", self.seed + j)], "slo": self.slo.given(), "target": self.target}
                for j in range(self.k)]

    def run_configs(self, jobs: list[tuple[list[Override], float, int, str]]) -> list[Point]:
        """Run configurations (overrides, rate, replicas, label) x seeds as one parallel batch."""
        tasks, owner = [], []
        for j, (config, rate, replicas, _) in enumerate(jobs):
            for t in self._tasks(config, rate, replicas):
                tasks.append(t)
                owner.append(j)
        results = self.runner.map(run_case, tasks, self.base)
        runs: list[list[dict]] = [[] for _ in jobs]
        for j, r in zip(owner, results):
            runs[j].append(r)
        return [Point(rate, replicas, runs[j], label) for j, (_, rate, replicas, label) in enumerate(jobs)]

    def evaluate(self, rate: float) -> Point:
        """The base configuration at `rate`, over every replication (cached)."""
        rate = float(rate)
        if rate not in self.cache:
            p = self.run_configs([([], rate, self.base_replicas, "")])[0]
            self.cache[rate] = p
            self.log(f"  rate {rate:10.4f} req/s ({p.per_replica:.4f}/replica): attainment {p.att:.4f} "
                     f"[{p.att_min:.4f}, {p.att_max:.4f}] {'meets' if p.att >= self.target else 'misses'}")
        return self.cache[rate]

    # -- bisection --------------------------------------------------------------------------
    def _ok(self, stat: str) -> Callable[[float], bool]:
        get = {"mean": lambda p: p.att, "min": lambda p: p.att_min, "max": lambda p: p.att_max}[stat]
        return lambda r: get(self.evaluate(r)) >= self.target - 1e-12

    @staticmethod
    def _bisect(ok, lo: float, hi: float, tol: float, max_steps: int = 60) -> tuple[float, float]:
        for _ in range(max_steps):
            if hi - lo <= tol * hi:
                break
            mid = 0.5 * (lo + hi)
            if ok(mid):
                lo = mid
            else:
                hi = mid
        return lo, hi

    def _gallop_up(self, ok, lo: float, doublings: int = 30) -> tuple[float, float]:
        for _ in range(doublings):
            hi = 2 * lo
            if not ok(hi):
                return lo, hi
            lo = hi
        raise ConfigError(f"plan: the attainment target still holds at {lo:g} req/s: the workload never saturates "
                          "the replica (are the SLOs or the request count too loose?)")

    def _gallop_down(self, ok, hi: float, halvings: int = 14) -> tuple[float | None, float]:
        from sim.io.config import MIN_RATE_RPS
        for _ in range(halvings):
            lo = hi / 2
            if lo < MIN_RATE_RPS:  # slower than any scenario can be: the target is missed all the way down
                break
            if ok(lo):
                return lo, hi
            hi = lo
        return None, hi

    def _edge(self, stat: str, tol: float) -> tuple[float | None, float | None]:
        """Bracket of the largest rate where `stat` of the replications meets the target."""
        ok = self._ok(stat)
        tried = sorted(self.cache)
        fails = [r for r in tried if not ok(r)]
        hi = fails[0] if fails else None
        passes = [r for r in tried if ok(r) and (hi is None or r < hi)]
        lo = passes[-1] if passes else None
        if hi is None:
            lo, hi = self._gallop_up(ok, lo)
        elif lo is None:
            lo, hi = self._gallop_down(ok, hi)
            if lo is None:
                return None, hi
        return self._bisect(ok, lo, hi, tol)

    def capacity(self, tol: float, start: float | None = None) -> tuple:
        """Goodput capacity by bisection on the rate: the highest rate whose attainment meets the target."""
        r0 = start or self.knob.rate
        ok = self._ok("mean")
        self.log(f"capacity: bisection from {r0:g} req/s, {self.k} replication(s) per rate")
        if ok(r0):
            lo, hi = self._gallop_up(ok, r0)
        else:
            lo, hi = self._gallop_down(ok, r0)
            if lo is None:
                return None, (None, hi), (None, hi), (f"the attainment target is not met at any rate tried, down to "
                                                       f"{hi:g} req/s: the SLOs are tighter than a lone request's service")
        lo, hi = self._bisect(ok, lo, hi, tol)
        low = self._edge("min", tol)[0]
        high = self._edge("max", tol)[1]
        return lo, (lo, hi), (low, high), ""

    # -- replicas for a target ----------------------------------------------------------------
    def replicas_for(self, target_rps: float, per_replica: float, max_replicas: int) -> dict:
        """Replicas for `target_rps`: division by the per-replica capacity, then checked by simulation."""
        estimate = target_rps / per_replica
        n = max(1, math.ceil(estimate - 1e-9))
        cluster = lambda m: [("cluster.replicas", m), ("cluster.router.kind", "least_outstanding")]  # noqa: E731
        tried: dict[int, Point] = self.replica_points

        def ok(m: int) -> bool:
            if m not in tried:
                tried[m] = self.run_configs([(cluster(m), target_rps, m, f"{m} replicas")])[0]
                p = tried[m]
                self.log(f"  {m} replica(s) at {target_rps:g} req/s: attainment {p.att:.4f} "
                         f"[{p.att_min:.4f}, {p.att_max:.4f}] {'meets' if p.att >= self.target else 'misses'}")
            return tried[m].att >= self.target - 1e-12

        self.log(f"replicas for {target_rps:g} req/s: division gives {estimate:.3f}, checking {n} by simulation")
        needed = None
        if ok(n):
            while n > 1 and ok(n - 1):
                n -= 1
            needed = n
        else:
            while n < max_replicas:
                n += 1
                if ok(n):
                    needed = n
                    break
        return {"target_rps": target_rps, "per_replica_capacity_rps": per_replica, "division_estimate": estimate,
                "division_replicas": max(1, math.ceil(estimate - 1e-9)), "simulated_replicas": needed,
                "max_replicas": max_replicas,
                "tried": [{"replicas": m, "attainment": p.att, "attainment_min": p.att_min, "attainment_max": p.att_max,
                           "request_goodput_rps": p.mean("request_goodput_rps"), "e2e_s_p99": p.mean("e2e_s_p99"),
                           **p.costs()} for m, p in sorted(tried.items())]}

    # -- search -----------------------------------------------------------------------------
    def search(self, axes: list[Axis], rate: float, replicas: int | None = None) -> list[dict]:
        """Every configuration at `rate`, on `replicas` replicas (the size the replica check found)
        unless cluster.replicas is itself an axis."""
        fixed: list[Override] = []
        if replicas is not None and replicas != self.base_replicas and "cluster.replicas" not in [a.key for a in axes]:
            fixed = [("cluster.replicas", replicas), ("cluster.router.kind", "least_outstanding")]
        configs = [[*fixed, *ov] for ov in grid_points(axes)]
        shown = len(fixed)
        check_configs(self.base, configs)
        jobs = []
        for ov in configs:
            jobs.append((ov, rate, self.base.scenario(ov).cluster.replicas, _label(ov[shown:])))
        self.log(f"search: {len(configs)} configuration(s) x {self.k} replication(s) at {rate:g} req/s"
                 f"{f' on {replicas} replicas' if fixed else ''}")
        points = self.run_configs(jobs)
        rows = []
        for (ov, _, replicas, label), p in zip(jobs, points):
            ov = ov[shown:]
            kv_ratio = max(r["kv_need_bytes"] / r["kv_budget_bytes"] for r in p.runs)
            e2e_t = p.mean("e2e_at_target_s")
            row = {"config": label, **{k: display_value(v) for k, v in ov}, "replicas": replicas, "rate_rps": rate,
                   "attainment": p.att, "attainment_min": p.att_min, "attainment_max": p.att_max,
                   **{k: p.mean(k) for k in p.runs[0] if k.startswith("attainment_")},
                   "request_goodput_rps": p.mean("request_goodput_rps"),
                   "card_fit": all(r["card_fit"] for r in p.runs),
                   "feasible": bool(p.att >= self.target - 1e-12 and all(r["card_fit"] for r in p.runs)),
                   **p.costs(), "gpu_seconds": p.total("gpu_seconds"),
                   "kv_need_bytes": max(r["kv_need_bytes"] for r in p.runs),
                   "kv_budget_bytes": p.runs[0]["kv_budget_bytes"], "memory_ratio": kv_ratio,
                   "e2e_at_target_s": e2e_t,
                   "deadline_ratio": e2e_t / self.slo.e2e_s if self.slo.e2e_s and e2e_t is not None else None,
                   "e2e_s_p99": p.mean("e2e_s_p99"), "ttft_s_p99": p.mean("ttft_s_p99"),
                   "tpot_s_p99": p.mean("tpot_s_p99")}
            rows.append(row)
        inf = float("inf")
        rows.sort(key=lambda r: (not r["feasible"],
                                 (r["gpu_hours_per_million_good"] if r["gpu_hours_per_million_good"] is not None else inf)
                                 if r["feasible"] else -r["attainment"],
                                 r["energy_j_per_good"] if r["energy_j_per_good"] is not None else inf))
        for i, r in enumerate(rows, 1):
            r["rank"] = i
        return rows


def check_configs(base: Base, configs: list[list[Override]]) -> None:
    """Every --search configuration is a valid scenario that builds (its layout, memory and step-time model: what
    validate-scenario checks), or one ConfigError naming each that is not."""
    from sim.core.simulation import Simulation
    lines = []
    for i, ov in enumerate(configs):
        try:
            Simulation(base.scenario(ov), base.base_dir).check()
        except ConfigError as exc:
            lines += [f"--search configuration {i} ({_label(ov)}): {x}" for x in exc.lines]
    if lines:
        raise ConfigError(lines)


def _label(ov: list[Override]) -> str:
    return ", ".join(f"{k.split('.')[-1]}={display_value(v)}" for k, v in ov) or "base"


def run_plan(scenario: str | Path, out_dir: str | Path, slo: SLO | None = None, target: float = 0.9,
             target_rps: float | None = None, search: Iterable[str | Axis] = (), overrides: Iterable[str] = (),
             replications: int = 3, requests: int | None = None, tol: float = 0.02, start_rps: float | None = None,
             workers: int | None = None, address: str | None = None, max_replicas: int = 64,
             log: Callable[[str], None] | None = None, plots: bool = True,
             step_time_error: float | None = None) -> PlanResult:
    """`capsim plan`: capacity, replicas for a target rate and the ranked search, written to `out_dir`; with
    `step_time_error` also the capacity with every step that much faster and slower (sim.planning.sensitivity)."""
    if not 0 < target <= 1:
        raise ConfigError(f"--attainment: expected a fraction in (0, 1], got {target}")
    if replications < 1:
        raise ConfigError(f"--replications: expected at least 1, got {replications}")
    if not 0 < tol < 1:
        raise ConfigError(f"--tol: expected a relative width in (0, 1), got {tol}")
    if target_rps is not None and not target_rps > 0:
        raise ConfigError(f"--target-rps: expected a positive rate, got {target_rps}")
    if requests is not None and requests < 1:
        raise ConfigError(f"--requests: expected a positive count, got {requests}")
    axes = parse_axes(search, "--search")
    base = Base.load(scenario, overrides)
    sc = base.scenario()
    check_error(step_time_error, sc.step_time.scale)
    fit = step_time_fit(sc, Path(base.base_dir))  # before any simulation: a bad file costs no compute
    if axes:  # a bad --search value is refused before the capacity search, not after it (or hidden by its answer)
        check_configs(base, grid_points(axes))
    slo = slo or slo_from_scenario(sc)
    if not slo.given():
        raise ConfigError(f"{scenario}: no SLO to plan for: give --slo ttft=..,tpot=..,e2e=.. or set slo: in the scenario")
    if target_rps is not None and getattr(sc, "disaggregation", None) is not None:
        raise ConfigError(f"{scenario}: --target-rps sizes cluster.replicas, which a disaggregated scenario does not "
                          "use (its pools have disaggregation.prefill.replicas and .decode.replicas); rank pool sizes "
                          "and P:D splits with --gpus N instead")
    log = log or (lambda s: None)
    n_configs = max(1, len(grid_points(axes))) if axes else 1
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with Runner(workers, address, max_parallel=replications * n_configs) as runner:
        pl = Planner(base, slo, target, replications, requests, runner, log)
        log(f"plan for {scenario}: {slo.describe()}, attainment >= {target:g}; running {runner.describe()}")
        res = PlanResult(str(scenario), slo, target, replications, pl.requests, pl.base_replicas, pl.knob.kind, tol)
        res.step_time_fit = fit
        cap, res.bracket, res.interval, res.note = pl.capacity(tol, start_rps)
        res.capacity_rps = cap
        res.points = pl.cache
        res.target_rps = target_rps
        if cap:
            res.warnings.append(short_run_warning(
                pl.cache[cap], "the goodput capacity", "likely too high; the goodput column, good requests over a "
                "run's makespan, is no steady rate either: it counts the run's drain"))
        if target_rps is not None and cap:
            res.replicas = pl.replicas_for(target_rps, cap / pl.base_replicas, max_replicas)
            n = res.replicas["simulated_replicas"]
            if n is not None:
                res.warnings.append(short_run_warning(pl.replica_points[n], f"the replica count ({n})",
                                                      "likely too few"))
        res.warnings = [w for w in res.warnings if w]
        rate = target_rps or cap
        if axes and rate:
            res.search_rate_rps = rate
            res.search = pl.search(axes, rate, (res.replicas or {}).get("simulated_replicas"))
        if step_time_error is not None:
            res.sensitivity = step_time_sensitivity(
                lambda extra: Planner(Base.load(scenario, [*overrides, *extra]), slo, target, replications, requests,
                                      runner, log), step_time_error, tol, cap or start_rps, target_rps, max_replicas, log)
        if res.search:
            res.plane = plane_points_from_search(res.search)
        elif cap:
            res.plane = _base_plane(pl, res)
    res.files = write_plan(res, out, plots)
    return res


def _base_plane(pl: Planner, res: PlanResult) -> list[dict]:
    """Without a search space the plane shows the planned configuration: the cluster size the
    replica check settled on at the target rate, else the scenario at its capacity."""
    n = (res.replicas or {}).get("simulated_replicas")
    if n is not None:
        p, label = pl.replica_points[n], f"{n} replica(s) @ {res.target_rps:.4g} req/s"
    else:
        p, label = pl.cache[res.capacity_rps], f"{Path(pl.base.source).stem} @ {res.capacity_rps:.4g} req/s"
    e2e_t = p.mean("e2e_at_target_s")
    return [{"label": label, "memory_ratio": max(r["kv_need_bytes"] / r["kv_budget_bytes"] for r in p.runs),
             "deadline_ratio": e2e_t / res.slo.e2e_s if res.slo.e2e_s and e2e_t is not None else None,
             "feasible": bool(p.att >= pl.target - 1e-12 and all(r["card_fit"] for r in p.runs))}]


def plane_points_from_search(rows: list[dict]) -> list[dict]:
    """The search's configurations as points of the memory / deadline plane."""
    return [{"label": r["config"], "memory_ratio": r["memory_ratio"], "deadline_ratio": r["deadline_ratio"],
             "feasible": r["feasible"]} for r in rows]


def write_plan(res: PlanResult, out: Path, plots: bool = True) -> list[Path]:
    """Write plan.json, rates.csv, search.csv and (with `plots`) the plan's figures into `out`."""
    import pandas as pd
    files = [out / "plan.json"]
    files[0].write_text(json.dumps(res.as_dict(), indent=2, default=str) + "\n")
    runs = []
    for p in sorted(res.points.values(), key=lambda p: p.rate):
        for j, r in enumerate(p.runs):
            runs.append({"rate_rps": p.rate, "rate_per_replica_rps": p.per_replica, "seed_offset": j, **r})
    files += write_tables(pd.DataFrame(runs), out, "rates")
    if res.replicas:
        files += write_tables(pd.DataFrame(res.replicas["tried"]), out, "replicas")
    if res.search:
        files += write_tables(pd.DataFrame(res.search), out, "search")
    if plots:
        files.append(plot_attainment(res, out / "attainment.png"))
        if res.plane and any(p["deadline_ratio"] is not None for p in res.plane):
            deadline = f"E2E at the {res.target:g} quantile / {res.slo.e2e_s:g} s"
            files.append(plot_plane(res.plane, out / "memory_deadline_plane.png", y_label=deadline))
    return files


# ---- plots ------------------------------------------------------------------------------------

def plot_attainment(res: PlanResult, path: Path) -> Path:
    """SLO attainment against the offered rate, with the target and the capacity marked."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.subplots()
    pts = sorted(res.points.values(), key=lambda p: p.rate)
    x = [p.per_replica for p in pts]
    for j in range(res.replications):
        ax.plot(x, [p.runs[j]["attainment"] for p in pts], ".", color="0.6", ms=4,
                label="each replication" if j == 0 else None)
    ax.plot(x, [p.att for p in pts], "o-", color="C0", label="mean attainment")
    ax.axhline(res.target, color="C3", ls="--", label=f"target {res.target:g}")
    lo, hi = (res.per_replica(v) for v in res.interval)
    if lo is not None and hi is not None:
        ax.axvspan(lo, hi, color="C2", alpha=0.15, label="interval over seeds")
    if res.capacity_rps:
        ax.axvline(res.per_replica(res.capacity_rps), color="C2",
                   label=f"capacity {res.per_replica(res.capacity_rps):.4g} req/s/replica")
    ax.set_xlabel("arrival rate per replica (req/s)")
    ax.set_ylabel("SLO attainment")
    ax.set_title(f"{Path(res.scenario).name}: {res.slo.describe()}", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    return path
