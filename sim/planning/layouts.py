"""Layout search: given a GPU budget (count, card) and SLOs, rank deployments by goodput per GPU
(or per dollar when a price per GPU-hour is given).

    capsim plan SCENARIO --gpus 8 [--card h100-sxm] [--tp 1,2,4,8] [--pp 1] [--ep 1]
                [--modes agg,disagg] [--price-per-gpu-hour 2.5] --out DIR

A *deployment* is either aggregated (`replicas` replicas of one layout tp x pp, ep) or disaggregated
(P prefill replicas of one layout and D decode replicas of another, KV over the scenario's link).
Every deployment the budget allows is enumerated, as long as no further replica of any of its
pools would still fit the budget (smaller ones waste GPUs the budget pays for). Deployments whose
replicas do not fit the card are listed with the reason and not run. Each of the others gets its
goodput capacity (DistServe: the highest total arrival rate whose mean SLO attainment meets the
target, sim.planning.capacity's definition), found by bisections that run side by side: every
round sends one rate per unfinished deployment x seeds to Dask as one batch.

goodput per GPU = capacity / GPUs used; per dollar = capacity x 3600 / (GPUs x price per GPU-hour),
i.e. requests per dollar at capacity. Ties keep enumeration order.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from sim.io.config import MIN_RATE_RPS
from sim.io.describe import step_time_fit, step_time_line
from sim.io.errors import ConfigError
from sim.planning.sweep import Override


CLIENT_KEYS = {"first_token", "wait_for_prefill_response"}
"""A disaggregated base scenario's settings every disaggregated candidate keeps beside its pools and link."""

KEPT_PARALLEL = ("expert_imbalance", "routing_skew", "ep_communication", "micro_batches", "attention_dp_routing")
"""A base scenario's `parallel` settings a planned layout keeps (Layout.mapping): all but the degrees."""


@dataclass(frozen=True)
class Layout:
    """One replica's GPUs: dp x tp x pp (dp attention data-parallel ranks), with ep of a stage's dp x tp GPUs
    holding experts."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def as_dict(self) -> dict:
        """The scenario's `parallel` mapping."""
        return {"tp": self.tp, "pp": self.pp, "ep": self.ep, **({"attention_dp": self.dp} if self.dp > 1 else {})}

    def mapping(self, stated=None) -> dict:
        """The `parallel` mapping of this layout on a base whose own is `stated` (a ParallelConfig or None): what the
        base states beside the degrees (expert imbalance, routing skew, the experts' communication, micro-batches,
        the ranks' routing) is kept where the layout can take it (all-to-all needs ep > 1, micro-batches pp > 1,
        a routing of ranks attention_dp > 1)."""
        kept = {} if stated is None else {k: v for k, v in stated.model_dump(exclude_defaults=True).items()
                                          if k in KEPT_PARALLEL}
        if self.ep == 1:
            kept.pop("ep_communication", None)
        if self.pp == 1:
            kept.pop("micro_batches", None)
        if self.dp == 1:
            kept.pop("attention_dp_routing", None)
        return {**self.as_dict(), **kept}

    def describe(self) -> str:
        """tp4 / tp4pp2 / tp8ep8 / dp4tp2ep8 (one-degree axes left out)."""
        return ((f"dp{self.dp}" if self.dp > 1 else "") + f"tp{self.tp}" + (f"pp{self.pp}" if self.pp > 1 else "")
                + (f"ep{self.ep}" if self.ep > 1 else ""))


@dataclass(frozen=True)
class Deployment:
    """An aggregated or disaggregated way to spend (part of) the GPU budget."""

    mode: str                       # "agg" or "disagg"
    layout: Layout                  # agg: the replicas' layout; disagg: the prefill pool's
    replicas: int                   # agg: replicas; disagg: prefill replicas
    decode_layout: Layout | None = None
    decode_replicas: int = 0

    @property
    def gpus(self) -> int:
        if self.mode == "agg":
            return self.replicas * self.layout.gpus
        return self.replicas * self.layout.gpus + self.decode_replicas * self.decode_layout.gpus

    @property
    def label(self) -> str:
        if self.mode == "agg":
            return f"agg {self.replicas}x{self.layout.describe()}"
        return (f"disagg {self.replicas}x{self.layout.describe()} : "
                f"{self.decode_replicas}x{self.decode_layout.describe()}")

    @property
    def pd_split(self) -> str | None:
        return None if self.mode == "agg" else f"{self.replicas}:{self.decode_replicas}"

    def overrides(self, base_scenario, with_layout: bool) -> list[Override]:
        """The scenario overrides that make the base scenario this deployment. The layouts go in `parallel`; a
        kind ops model's `step_time.model.tp` (the older way of giving tensor parallelism) is cleared with them,
        or it would clash with every other tp."""
        ov: list[Override] = []
        if with_layout and ops_tp(base_scenario) != 1:
            ov.append(("step_time.model.tp", 1))
        if self.mode == "agg":
            ov += [("disaggregation", None), ("cluster.replicas", self.replicas),
                   ("cluster.router.kind", "least_outstanding")]
            if with_layout:
                ov.append(("parallel", self.layout.mapping(getattr(base_scenario, "parallel", None))))
            return ov
        d = base_scenario.disaggregation
        pools = {}
        for name, layout, n in (("prefill", self.layout, self.replicas), ("decode", self.decode_layout,
                                                                           self.decode_replicas)):
            pool = {"replicas": n}
            old = getattr(d, name, None) if d is not None else None
            if old is not None and old.scheduler is not None:
                pool["scheduler"] = old.scheduler.model_dump(mode="json")
            if with_layout:  # what the base's pool (else the base) states beside the degrees is kept
                stated = old.parallel if old is not None and old.parallel is not None else getattr(
                    base_scenario, "parallel", None)
                pool["parallel"] = layout.mapping(stated)
            pools[name] = pool
        link = d.link.model_dump(mode="json", exclude_none=True) if d is not None else {}
        # how the client meets the pools (first_token, wait_for_prefill_response) is the base's, as stated
        client = {} if d is None else d.model_dump(mode="json", include=CLIENT_KEYS, exclude_defaults=True)
        return [*ov, ("cluster.replicas", 1), ("disaggregation", {**pools, "link": link, **client})]


def ops_tp(sc) -> int:
    """`step_time.model.tp` of a kind ops model (1 for other kinds): the replica's tensor parallelism when the
    scenario has no `parallel` section (sim.core.sizing.replica_layout)."""
    model = getattr(getattr(sc, "step_time", None), "model", None)
    return int(getattr(model, "tp", 1) or 1)


def enumerate_deployments(gpus: int, layouts: list[Layout], modes: tuple[str, ...] = ("agg", "disagg")
                          ) -> list[Deployment]:
    """Every deployment within `gpus` GPUs that no further replica of one of its pools would fit."""
    out: list[Deployment] = []
    fitting = [lay for lay in layouts if lay.gpus <= gpus]
    if "agg" in modes:
        for lay in fitting:
            out.append(Deployment("agg", lay, gpus // lay.gpus))
    if "disagg" in modes:
        for lp, ld in itertools.product(fitting, fitting):
            for p in range(1, gpus // lp.gpus + 1):
                left = gpus - p * lp.gpus
                d = left // ld.gpus
                if d < 1:
                    continue
                if gpus - p * lp.gpus - d * ld.gpus >= lp.gpus:  # another prefill replica would still fit
                    continue
                out.append(Deployment("disagg", lp, p, ld, d))
    return out


def parse_degrees(text: str | None, flag: str, default: list[int]) -> list[int]:
    """'1,2,4' -> [1, 2, 4] (positive integers); None -> default."""
    if text is None:
        return default
    try:
        vals = [int(x) for x in text.split(",")]  # an empty item ('1,,2') is an error, not dropped
    except ValueError:
        raise ConfigError(f"{flag}: expected positive integers separated by commas, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise ConfigError(f"{flag}: expected positive integers separated by commas, got {text!r}")
    return sorted(set(vals))


def candidate_layouts(gpus: int, tp: list[int] | None, pp: list[int] | None, ep: list[int] | None,
                      with_layout: bool, dp: list[int] | None = None) -> list[Layout]:
    """The layouts to try: dp x tp x pp x ep with ep dividing dp x tp and dp x tp x pp within the budget."""
    if not with_layout:
        if any(v != [1] for v in (tp, pp, ep, dp) if v is not None):
            raise ConfigError("--tp/--pp/--ep/--attention-dp: this scenario schema has no parallel layout (`parallel`); "
                              "only tp=pp=ep=1 can be searched")
        return [Layout()]
    tp = tp or [d for d in (1, 2, 4, 8) if d <= gpus]
    pp, ep, dp = pp or [1], ep or [1], dp or [1]
    lays = [Layout(t, p, e, d) for d, t, p, e in itertools.product(dp, tp, pp, ep)
            if (t * d) % e == 0 and t * p * d <= gpus]
    if not lays:
        small = min(t * p * d for d, t, p in itertools.product(dp, tp, pp))
        why = (f"the smallest replica asked for takes {small} GPUs" if small > gpus
               else "ep must divide attention-dp x tp")
        raise ConfigError(f"--tp/--pp/--ep/--attention-dp: no layout fits {gpus} GPUs ({why})")
    return lays


# ---- memory fit ---------------------------------------------------------------------------------

def fit_problem(sc, base_dir: str | Path) -> str | None:
    """Why a deployment's replicas do not fit their cards, or cannot be timed (a layout whose collectives the
    card's kernel tables do not measure); None: they fit and can be."""
    from sim.core.pools import link_bandwidth_bytes_per_s, pool_scenario
    from sim.core.result import card_fits
    from sim.core.sizing import replica_memory
    from sim.core.step_time_builder import build_step_time
    from sim.io.profiles import load_hardware, load_model
    from sim.models.spec import scenario_spec
    base = Path(base_dir)
    try:
        spec = scenario_spec(sc, load_model(base / sc.model if sc.model.endswith(".yaml") else sc.model))
        hw = load_hardware(base / sc.hardware if sc.hardware.endswith(".yaml") else sc.hardware)
        views = ([("", sc)] if sc.disaggregation is None else
                 [(f"{n} pool: ", pool_scenario(sc, getattr(sc.disaggregation, n))) for n in ("prefill", "decode")])
        if sc.disaggregation is not None:
            link_bandwidth_bytes_per_s(sc, hw)
        for where, view in views:
            if not card_fits(replica_memory(view, spec, hw), hw):
                return f"{where}weights + KV budget + activations exceed {hw.name}'s memory"
        for where, view in views:
            try:
                build_step_time(view, base, spec, hw)
            except ConfigError as exc:
                return where + "; ".join(exc.lines)
    except ConfigError as exc:
        return "; ".join(exc.lines)
    return None


# ---- capacity of many deployments at once ---------------------------------------------------

@dataclass
class Bisection:
    """One deployment's search for its goodput capacity: gallop to a bracket, then halve it."""

    rate: float                    # the next rate to try
    lo: float | None = None        # highest rate known to meet the target
    hi: float | None = None        # lowest rate known to miss it
    steps: int = 0
    note: str = ""

    def done(self, tol: float, max_steps: int) -> bool:
        """Bracket narrow enough, the target missed all the way down, or out of steps."""
        if self.lo is None and self.note:
            return True
        if self.steps >= max_steps:
            if not self.note:
                self.note = f"stopped after {max_steps} rates"
            return True
        return self.lo is not None and self.hi is not None and self.hi - self.lo <= tol * self.hi

    def update(self, ok: bool) -> None:
        """Record the outcome at `rate` and choose the next one."""
        self.steps += 1
        if ok:
            self.lo = self.rate
        else:
            self.hi = self.rate
        if self.hi is None:
            self.rate = 2 * self.lo
        elif self.lo is None:
            self.rate = self.hi / 2
            if self.steps >= 14 or self.rate < MIN_RATE_RPS:
                self.note = f"the target is missed at every rate tried, down to {self.hi:g} req/s"
        else:
            self.rate = 0.5 * (self.lo + self.hi)


@dataclass
class LayoutPlan:
    """What the layout search found: one row per deployment, best first."""

    scenario: str
    gpus: int
    card: str
    price_per_gpu_hour: float | None
    rows: list[dict]
    files: list[Path]
    step_time_fit: dict | None = None
    warnings: list[str] = field(default_factory=list)
    """Why the ranking may mislead (layout_warnings)."""
    targets: dict = field(default_factory=dict)
    """What each capacity was searched for: slo (the bounds given), attainment_target, replications, tolerance."""
    """The base scenario's step-time fit error on this card (sim.io.describe.step_time_fit)."""

    def as_dict(self) -> dict:
        """layouts.json's content."""
        return {"scenario": self.scenario, "gpu_budget": self.gpus, "card": self.card,
                "price_per_gpu_hour": self.price_per_gpu_hour,
                "ranked_by": "goodput_per_dollar" if self.price_per_gpu_hour else "goodput_per_gpu",
                **self.targets, "deployments": self.rows, "step_time_fit": self.step_time_fit,
                "warnings": self.warnings}


def rank(rows: list[dict], price_per_gpu_hour: float | None) -> list[dict]:
    """Sort feasible deployments by goodput per GPU (per dollar with a price), best first; those
    without a capacity (not fitting, or never meeting the target) follow in enumeration order."""
    for r in rows:
        cap = r.get("capacity_rps")
        r["goodput_per_gpu_rps"] = cap / r["gpus"] if cap else None
        r["requests_per_dollar"] = (cap * 3600 / (r["gpus"] * price_per_gpu_hour)
                                    if cap and price_per_gpu_hour else None)
    key = "requests_per_dollar" if price_per_gpu_hour else "goodput_per_gpu_rps"
    ranked = sorted(rows, key=lambda r: (r[key] is None, -(r[key] or 0.0)))
    for i, r in enumerate(ranked, 1):
        r["rank"] = i
    return ranked


def scenario_gpus(sc) -> int:
    """GPUs a scenario's deployment uses (every replica of every pool)."""
    def per_replica(par) -> int:  # no `parallel`: one GPU, or step_time.model.tp GPUs of a kind ops model
        return ops_tp(sc) if par is None else (par.gpus if hasattr(par, "tp") else
                                               int(par.get("tp", 1)) * int(par.get("pp", 1))
                                               * int(par.get("attention_dp", 1)))
    d = sc.disaggregation
    if d is None:
        return sc.cluster.replicas * per_replica(getattr(sc, "parallel", None))
    top = getattr(sc, "parallel", None)
    return sum(p.replicas * per_replica(p.parallel if p.parallel is not None else top) for p in (d.prefill, d.decode))


def _row(dep: Deployment, problem: str | None) -> dict:
    dl = dep.decode_layout
    return {"deployment": dep.label, "mode": dep.mode, "gpus": dep.gpus, "pd_split": dep.pd_split,
            "replicas": dep.replicas + dep.decode_replicas,
            "tp": dep.layout.tp, "pp": dep.layout.pp, "ep": dep.layout.ep,
            "decode_tp": dl.tp if dl else None, "decode_pp": dl.pp if dl else None, "decode_ep": dl.ep if dl else None,
            "fits": problem is None, "problem": problem, "capacity_rps": None, "bracket_rps": None,
            "attainment_at_capacity": None, "requests_per_run": None, "e2e_p99_at_capacity_s": None,
            "arrival_window_s": None, "rates_tried": 0, "note": ""}


def search_layouts(base, dependencies: list[Deployment], slo, target: float, replications: int,
                   requests: int | None, tol: float, runner, log: Callable[[str], None],
                   max_steps: int = 24) -> list[dict]:
    """Goodput capacity of every deployment that fits, by side-by-side bisections (one Dask batch
    per round); one row per deployment in enumeration order."""
    from sim.planning.capacity import rate_knob, run_case
    sc = base.scenario()
    with_layout = "parallel" in type(sc).model_fields
    base_gpus = scenario_gpus(sc)
    synthetic = sc.workload.kind == "synthetic"
    n_base = requests or (sc.workload.num_requests if synthetic else None)
    knob = rate_knob(base, [("workload.num_requests", n_base)] if synthetic else [])
    rows, active = [], []
    for dep in dependencies:
        ov = dep.overrides(sc, with_layout)
        try:
            problem = fit_problem(base.scenario(ov), base.base_dir)
        except ConfigError as exc:
            problem = "; ".join(exc.lines)
        rows.append(_row(dep, problem))
        if problem is None:
            if synthetic:
                ov = [*ov, ("workload.num_requests", max(1, math.ceil(n_base * dep.gpus / base_gpus)))]
            elif requests is not None:
                ov = [*ov, ("workload.max_requests", requests)]
            active.append((len(rows) - 1, ov, Bisection(knob.rate * dep.gpus / base_gpus)))
    log(f"layouts: {len(rows)} deployment(s), {len(active)} fit; bisecting each on the rate "
        f"({replications} seed(s) per rate)")
    for round_no in itertools.count(1):
        todo = [(i, ov, b) for i, ov, b in active if not b.done(tol, max_steps)]
        if not todo:
            break
        tasks = [{"overrides": [*ov, *knob.overrides(b.rate), ("seed", sc.seed + j)], "slo": slo.given(),
                  "target": target} for _, ov, b in todo for j in range(replications)]
        results = runner.map(run_case, tasks, base)
        for k, (i, _, b) in enumerate(todo):
            runs = results[k * replications:(k + 1) * replications]
            att = sum(r["attainment"] for r in runs) / len(runs)
            if att >= target - 1e-12:
                e2e = [r["e2e_s_p99"] for r in runs if r.get("e2e_s_p99") is not None]
                rows[i].update(attainment_at_capacity=att, requests_per_run=runs[0]["requests"],
                               e2e_p99_at_capacity_s=max(e2e) if e2e else None)
            b.update(att >= target - 1e-12)
        log(f"  round {round_no}: {len(todo)} deployment(s) still bisecting")
    for i, _, b in active:
        _finish(rows[i], b)
    return rows


def _finish(row: dict, b: Bisection) -> None:
    """A deployment's row from its search. Met at every rate tried (no rate above it missed), the last rate is a
    lower bound, not a capacity: no capacity_rps (the row ranks after those with one), and the note says why."""
    row.update(capacity_rps=b.lo, bracket_rps=[b.lo, b.hi], rates_tried=b.steps, note=b.note)
    _flag_short_run(row)
    if b.lo is not None and b.hi is None:
        row.update(capacity_rps=None, note=(
            f"no capacity found: the target is met at every rate tried, up to {b.lo:.4g} req/s"
            + (f" ({row['note']})" if row["note"] else "")))


def _flag_short_run(row: dict) -> None:
    """A capacity measured on a run whose requests all arrive before the slowest ones leave is a
    transient, not a steady state: say so (raise --requests until the capacity stops moving)."""
    from sim.planning.short_run import arrival_window, is_short_run  # the check plan without --gpus makes too
    cap, n, e2e = row.get("capacity_rps"), row.get("requests_per_run"), row.get("e2e_p99_at_capacity_s")
    row["arrival_window_s"] = arrival_window(n, cap)
    if is_short_run(n, cap, e2e):
        row["note"] = ((row["note"] + "; ") if row["note"] else "") + (
            f"short run: {n} requests arrive within {row['arrival_window_s']:.3g} s, less than the p99 E2E "
            f"({e2e:.3g} s); raise --requests")


def run_layout_plan(scenario: str | Path, out_dir: str | Path, gpus: int, card: str | None = None,
                    price_per_gpu_hour: float | None = None, tp: list[int] | None = None,
                    pp: list[int] | None = None, ep: list[int] | None = None, dp: list[int] | None = None,
                    modes: tuple[str, ...] = ("agg", "disagg"), slo=None, target: float = 0.9,
                    replications: int = 1, requests: int | None = None, tol: float = 0.05,
                    overrides=(), workers: int | None = None, address: str | None = None,
                    log: Callable[[str], None] | None = None) -> LayoutPlan:
    """`capsim plan --gpus`: rank the deployments of `gpus` cards by goodput per GPU (or dollar)."""
    from sim.io.config import Scenario
    from sim.planning.slo import slo_from_scenario
    from sim.planning.sweep import Base, Runner
    if gpus < 1:
        raise ConfigError(f"--gpus: expected a positive GPU count, got {gpus}")
    if price_per_gpu_hour is not None and not 0 < price_per_gpu_hour < math.inf:
        raise ConfigError(f"--price-per-gpu-hour: expected a finite positive price, got {price_per_gpu_hour}")
    bad = [m for m in modes if m not in ("agg", "disagg")]
    if bad or not modes:
        raise ConfigError(f"--modes: expected agg, disagg or both (comma-separated), got {','.join(modes)!r}")
    extra = [f"hardware={card}"] if card else []
    base = Base.load(scenario, [*overrides, *extra])
    sc = base.scenario()
    fit = step_time_fit(sc, Path(base.base_dir))  # before the search: a bad file costs no compute
    slo = slo or slo_from_scenario(sc)
    if not slo.given():
        raise ConfigError(f"{scenario}: no SLO to plan for: give --slo ttft=..,tpot=..,e2e=.. or set slo: in the scenario")
    log = log or (lambda s: None)
    layouts = candidate_layouts(gpus, tp, pp, ep, "parallel" in Scenario.model_fields, dp)
    deps = enumerate_deployments(gpus, layouts, tuple(modes))
    if not deps:
        raise ConfigError(f"--gpus: no deployment of the layouts {[x.describe() for x in layouts]} fits {gpus} GPU(s)")
    with Runner(workers, address, max_parallel=replications * len(deps)) as runner:
        log(f"layout plan for {scenario} on {gpus} x {sc.hardware}: {slo.describe()}, attainment >= {target:g}; "
            f"running {runner.describe()}")
        rows = search_layouts(base, deps, slo, target, replications, requests, tol, runner, log)
    ranked = rank(rows, price_per_gpu_hour)
    res = LayoutPlan(str(scenario), gpus, sc.hardware, price_per_gpu_hour, ranked, [], fit, layout_warnings(sc),
                     {"slo": slo.given(), "attainment_target": target, "replications": replications, "tolerance": tol})
    res.files = write_layout_plan(res, Path(out_dir))
    return res


def layout_warnings(sc) -> list[str]:
    """What in the base scenario does not follow the searched layouts: a KV budget given in bytes is every layout's
    replica's whatever its GPUs, and a pool's own kv_budget is not carried to the candidates."""
    out = []
    if isinstance(sc.kv.budget, int):
        out.append(f"kv.budget is given in bytes ({sc.kv.budget / 2**30:.4g} GiB), so every layout's replica gets that "
                   "much KV whatever its GPUs; a {gpu_memory_utilization: ...} budget sizes the KV by each layout's cards")
    d = getattr(sc, "disaggregation", None)
    for name in ("prefill", "decode"):
        pool = getattr(d, name, None) if d is not None else None
        if pool is not None and pool.kv_budget is not None:
            out.append(f"disaggregation.{name}.kv_budget ({pool.kv_budget / 2**30:.4g} GiB) is not carried to the "
                       "searched layouts: each of their pools takes kv.budget")
    return out


def write_layout_plan(res: LayoutPlan, out: Path) -> list[Path]:
    """layouts.json and layouts.csv in `out`."""
    import pandas as pd
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "layouts.json", out / "layouts.csv"]
    files[0].write_text(json.dumps(res.as_dict(), indent=2, default=str) + "\n")
    pd.DataFrame(res.rows).to_csv(files[1], index=False)
    return files


def print_layout_plan(res: LayoutPlan, file=None) -> None:
    """The ranking as a text table."""
    file = file or sys.stdout
    per = "req/$" if res.price_per_gpu_hour else "rps/GPU"
    print(f"layout plan {res.scenario}: {res.gpus} x {res.card}"
          f"{f' at {res.price_per_gpu_hour:g} per GPU-hour' if res.price_per_gpu_hour else ''}", file=file)
    if res.step_time_fit is not None:
        print(step_time_line(res.step_time_fit), file=file)
    for warning in res.warnings:
        print(f"warning: {warning}", file=file)
    print(f"{'rank':>4}  {'deployment':<34}{'GPUs':>5}{'capacity rps':>14}{per:>10}  note", file=file)
    for r in res.rows:
        val = r["requests_per_dollar"] if res.price_per_gpu_hour else r["goodput_per_gpu_rps"]
        cap = "-" if r["capacity_rps"] is None else f"{r['capacity_rps']:.4g}"
        shown = "-" if val is None else f"{val:.4g}"
        note = r["problem"] or r["note"] or ""
        print(f"{r['rank']:>4}  {r['deployment']:<34}{r['gpus']:>5}{cap:>14}{shown:>10}  {note}", file=file)
