"""A capacity plan's report: the plan's inputs and capacity, goodput against rate, the replica check,
the configurations searched, the memory / deadline plane, and the run sections of the scenario
simulated once at the capacity found (written to OUT/at-capacity/ so every number has a file)."""

from __future__ import annotations

import json
from pathlib import Path

from sim.report import figures
from sim.report.html import Cell, Page, definition_list, figure, number, paragraph, table
from sim.report.inputs import RunData, ScenarioInfo, load_run, read_json, record_overrides
from sim.report.run import add_run_sections

AT_CAPACITY = "at-capacity"
SRC = "plan.json"


def _slo_words(slo: dict) -> str:
    names = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E", "itl_s": "each request's largest ITL"}
    return ", ".join(f"{names.get(k, k)} <= {v:g} s" for k, v in slo.items()) or "none"


def capacity_section(plan: dict) -> str:
    """The plan's inputs and the goodput capacity with its bracket and interval over seeds."""
    cap = plan["capacity"]
    facts = [("scenario file", plan["scenario"]), ("SLOs", _slo_words(plan["slo"])),
             ("attainment target", f"{plan['attainment_target']:g} of requests meet every SLO"),
             ("replications", f"{plan['replications']} seed(s) per rate"
              + (f", {plan['requests_per_run']} requests per run" if plan.get("requests_per_run") else "")),
             ("rate knob", "workload.arrival.rate_rps" if plan["rate_knob"] == "arrival" else "the trace's rate_scale"),
             ("bisection tolerance", f"{plan['tolerance']:g} (relative width)"),
             ("replicas in the scenario", str(plan["base_replicas"]))]
    rows = [["goodput capacity per replica", number(cap["per_replica_rps"], 1, 4, "capacity.per_replica_rps", SRC),
             "req/s: highest rate whose mean attainment meets the target"],
            ["goodput capacity in all", number(cap["rate_rps"], 1, 4, "capacity.rate_rps", SRC), "req/s"]]
    for label, key in (("bisection bracket", "bracket_per_replica_rps"),
                       ("interval over seeds", "interval_per_replica_rps")):
        lo, hi = cap[key]
        rows.append([f"{label}, low", number(lo, 1, 4, f"capacity.{key}.0", SRC), "req/s per replica"])
        rows.append([f"{label}, high", number(hi, 1, 4, f"capacity.{key}.1", SRC), "req/s per replica"])
    body = definition_list(facts) + table(["quantity", "value", "unit / note"], rows, "Goodput capacity",
                                          numeric_columns={1})
    if cap.get("note"):
        body += paragraph(f"Note: {cap['note']}.")
    for warning in plan.get("warnings") or ():  # why the answer may not hold (sim.planning.short_run)
        body += paragraph(f"Warning: {warning}.")
    return body


def rates_section(plan: dict) -> str:
    """Goodput and attainment against the offered rate: figure and table."""
    rates = plan["rates"]
    if not rates:
        return paragraph("No rate was simulated.")
    svg = figures.goodput_vs_rate(rates, plan["attainment_target"], plan["capacity"]["per_replica_rps"],
                                  f"{plan['scenario']}: {_slo_words(plan['slo'])}")
    slo_keys = [k for k in rates[0] if k.startswith("attainment_") and k not in ("attainment_min", "attainment_max")]
    rows = []
    for i, r in enumerate(rates):
        rows.append([number(r["rate_per_replica_rps"], 1, 4, f"rates.{i}.rate_per_replica_rps", SRC),
                     number(r["attainment"], 0.01, 1, f"rates.{i}.attainment", SRC),
                     number(r["attainment_min"], 0.01, 1, f"rates.{i}.attainment_min", SRC),
                     number(r["attainment_max"], 0.01, 1, f"rates.{i}.attainment_max", SRC),
                     *(number(r[k], 0.01, 1, f"rates.{i}.{k}", SRC) for k in slo_keys),
                     number(r["request_goodput_rps_per_replica"], 1, 4, f"rates.{i}.request_goodput_rps_per_replica",
                            SRC),
                     number(r["ttft_s_p99"], 1e-3, 1, f"rates.{i}.ttft_s_p99", SRC),
                     number(r["e2e_s_p99"], 1, 2, f"rates.{i}.e2e_s_p99", SRC)])
    heads = ["rate / replica (req/s)", "attained (%)", "min (%)", "max (%)",
             *(f"{k[11:].upper()} alone (%)" for k in slo_keys), "goodput / replica (req/s)", "TTFT p99 (ms)",
             "E2E p99 (s)"]
    return (figure(svg, "SLO attainment and request goodput per replica against the offered rate per replica",
                   "Left: the share of requests meeting every SLO (mean over seeds, band: their range) with the "
                   "target; right: requests meeting every SLO per second per replica. Vertical line: the capacity.",
                   "fig-goodput")
            + table(heads, rows, "Every rate the bisection tried (means over seeds)",
                    numeric_columns=set(range(len(heads)))))


def replicas_section(plan: dict) -> str:
    """The replica check at --target-rps: division estimate, simulated size, every size tried."""
    r = plan.get("replicas")
    if not r:
        return paragraph("No --target-rps was given, so no cluster was sized.")
    found = r["simulated_replicas"]
    rows = [["target rate", number(r["target_rps"], 1, 3, "replicas.target_rps", SRC), "req/s"],
            ["division estimate", number(r["division_estimate"], 1, 3, "replicas.division_estimate", SRC),
             "replicas (target / capacity per replica)"],
            ["replicas needed (simulated)", Cell("more than " + str(r["max_replicas"]) if found is None else str(found),
                                                 "replicas.simulated_replicas", found, source=SRC, num=True),
             "smallest cluster whose attainment meets the target"]]
    tried = [[str(t["replicas"]), number(t["attainment"], 0.01, 1, f"replicas.tried.{i}.attainment", SRC),
              number(t["attainment_min"], 0.01, 1, f"replicas.tried.{i}.attainment_min", SRC),
              number(t["attainment_max"], 0.01, 1, f"replicas.tried.{i}.attainment_max", SRC),
              number(t.get("gpu_hours_per_million_good"), 1, 2, f"replicas.tried.{i}.gpu_hours_per_million_good", SRC),
              number(t.get("energy_j_per_good"), 1, 1, f"replicas.tried.{i}.energy_j_per_good", SRC)]
             for i, t in enumerate(r["tried"])]
    svg = figures.replicas_figure(r["tried"], plan["attainment_target"], r["target_rps"])
    return (table(["quantity", "value", "unit / note"], rows, "Cluster size for the target rate", numeric_columns={1})
            + figure(svg, "SLO attainment against the number of replicas at the target rate",
                     "Mean attainment over seeds (bars: their range) for each cluster size simulated.", "fig-replicas")
            + table(["replicas", "attainment (%)", "min (%)", "max (%)", "GPU-hours per million good",
                     "J per good"], tried, "Cluster sizes simulated", numeric_columns=set(range(6))))


def search_section(plan: dict) -> str:
    """The configurations searched, ranked by GPU-hours per million good requests."""
    rows = []
    for i, r in enumerate(plan["search"]):
        rows.append([str(r["rank"]), Cell(r["config"]), "yes" if r["feasible"] else "no",
                     number(r["attainment"], 0.01, 1, f"search.{i}.attainment", SRC),
                     number(r.get("gpu_hours_per_million_good"), 1, 2, f"search.{i}.gpu_hours_per_million_good", SRC),
                     number(r.get("energy_j_per_good"), 1, 1, f"search.{i}.energy_j_per_good", SRC),
                     number(r["memory_ratio"], 1, 2, f"search.{i}.memory_ratio", SRC),
                     number(r.get("deadline_ratio"), 1, 2, f"search.{i}.deadline_ratio", SRC)])
    return table(["rank", "configuration", "feasible", "attainment (%)", "GPU-hours per million good", "J per good",
                  "KV need / budget", "E2E at target quantile / SLO"], rows,
                 f"Configurations at {plan['search_rate_rps']:g} req/s, cheapest feasible first",
                 numeric_columns={0, 3, 4, 5, 6, 7},
                 row_classes=["" if r["feasible"] else "bad" for r in plan["search"]])


def plane_section(plan: dict) -> str:
    """The memory / deadline plane of the planned (or searched) configurations."""
    pts = plan.get("plane") or []
    if not any(p.get("deadline_ratio") is not None for p in pts):
        return paragraph("No plane: it needs an E2E SLO (the deadline) and a capacity or a search.")
    y = f"E2E at the {plan['attainment_target']:g} quantile / {plan['slo'].get('e2e_s', 0):g} s"
    return figure(figures.plane_figure(pts, y), "Configurations on the memory / deadline plane",
                  "Each configuration at (KV need / KV budget, E2E at the attainment quantile / the E2E SLO); "
                  "feasible configurations lie in the lower-left quadrant (filled markers).", "fig-plane")


def run_at_capacity(out_dir: Path, info: ScenarioInfo, plan: dict) -> tuple[ScenarioInfo, RunData] | None:
    """Simulate the scenario once (its own seed) at the capacity found and write it to OUT/at-capacity/."""
    from sim.planning.capacity import rate_knob
    from sim.planning.sweep import Base
    rate = plan["capacity"]["rate_rps"]
    if not rate:
        return None
    sc = info.scenario
    extra = []
    if plan.get("requests_per_run"):
        key = "workload.num_requests" if sc.workload.kind == "synthetic" else "workload.max_requests"
        extra.append((key, int(plan["requests_per_run"])))
    # the plan's SLOs (--slo, else the scenario's) judge the run; scenarios bound no TPOT (the plan's note says so)
    slo = {k: v for k, v in plan["slo"].items() if k in ("ttft_s", "e2e_s", "itl_s")}
    if "itl_s" in slo:
        slo["itl_stat"] = "max"
    base = Base.load(info.source, info.overrides)
    knob = rate_knob(base, extra)
    ov = [*extra, *knob.overrides(rate), ("slo", slo)]
    folder = out_dir / AT_CAPACITY
    base.simulate(ov).write(folder)
    at = record_overrides(folder, info, [f"{k}={json.dumps(v)}" for k, v in ov])
    return at, load_run(folder)


def plan_page(out_dir: Path, info: ScenarioInfo) -> Page:
    """The whole report of a plan folder."""
    plan = read_json(out_dir / "plan.json")
    cap = plan["capacity"]
    lead = (f"Goodput capacity {cap['per_replica_rps']:.4g} req/s per replica for {_slo_words(plan['slo'])} "
            f"at {plan['attainment_target']:g} attainment." if cap["per_replica_rps"] else
            f"No goodput capacity: {cap.get('note') or 'the target is met at no rate tried'}.")
    page = Page(f"capsim plan report: {Path(plan['scenario']).stem}", lead)
    page.add("plan", "Capacity", capacity_section(plan))
    page.add("goodput", "Goodput against rate", rates_section(plan))
    page.add("replicas", "Replicas", replicas_section(plan))
    if plan.get("search"):
        page.add("search", "Configurations searched", search_section(plan))
    page.add("plane", "Memory / deadline plane", plane_section(plan))
    at = run_at_capacity(out_dir, info, plan)
    if at is not None and "tpot_s" in plan["slo"]:
        page.add("cap-note", "About the run at capacity", paragraph(
            f"The plan also bounds TPOT <= {plan['slo']['tpot_s']:g} s; a scenario has no TPOT SLO, so the run "
            "below counts a request as good on the other bounds alone."))
    if at is not None:
        add_run_sections(page, at[0], at[1], "cap-", f"(at capacity, {cap['rate_rps']:.4g} req/s, seed "
                                                      f"{at[0].scenario.seed})", f"{AT_CAPACITY}/summary.json")
    page.footer = (f"Written by capsim from {out_dir}: plan.json, and {AT_CAPACITY}/ (the scenario simulated once at "
                   "the capacity). Times are seconds unless marked ms.")
    return page
