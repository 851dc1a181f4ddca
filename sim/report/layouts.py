"""A layout plan's report (`capsim plan --gpus`): the GPU budget and the targets, every deployment ranked by goodput
per GPU (or per dollar) with its capacity bracket, the ranking as a figure, and why the others have no capacity.

Drawn from layouts.json alone: every number shown carries its key there (sim.report.html)."""

from __future__ import annotations

from pathlib import Path

from sim.io.describe import step_time_line
from sim.report import figures
from sim.report.html import Cell, Page, bullet_list, definition_list, figure, number, paragraph, shown_path, table
from sim.report.inputs import read_json

SRC = "layouts.json"

SLO_WORDS = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E", "itl_s": "each request's largest ITL"}


def _slo_text(slo: dict | None) -> str:
    if not slo:
        return "not recorded (a layouts.json written before 2026-12-06)"
    return ", ".join(f"{SLO_WORDS.get(k, k)} <= {v:g} s" for k, v in slo.items())


def budget_section(plan: dict) -> str:
    """What was searched and against what: the budget, the targets, the ranking's measure, the step-time model's
    trust line and the plan's warnings."""
    per_dollar = plan.get("price_per_gpu_hour")
    facts = [("scenario file", plan["scenario"]), ("GPU budget", f"{plan['gpu_budget']} x {plan['card']}"),
             ("SLOs", _slo_text(plan.get("slo"))),
             ("ranked by", f"requests per dollar at capacity ({per_dollar:g} per GPU-hour)" if per_dollar
              else "goodput capacity per GPU")]
    if plan.get("attainment_target") is not None:
        facts.append(("attainment target", f"{plan['attainment_target']:g} of requests meet every SLO"))
    if plan.get("replications") is not None:
        facts.append(("replications", f"{plan['replications']} seed(s) per rate"))
    if plan.get("step_time_fit") is not None:
        facts.append(("step-time model", step_time_line(plan["step_time_fit"])))
    body = definition_list(facts)
    if plan.get("warnings"):
        body += paragraph("Warnings (the ranking may mislead where they apply):") + bullet_list(plan["warnings"],
                                                                                                 "warnings")
    return body


def ranking_section(plan: dict) -> str:
    """Every deployment, best first; those without a capacity last, with the reason."""
    per_dollar = bool(plan.get("price_per_gpu_hour"))
    rows, classes = [], []
    for i, r in enumerate(plan["deployments"]):
        key = f"deployments.{i}"
        lo, hi = r.get("bracket_rps") or (None, None)
        measure = (number(r.get("requests_per_dollar"), 1, 1, f"{key}.requests_per_dollar", SRC) if per_dollar
                   else number(r.get("goodput_per_gpu_rps"), 1, 3, f"{key}.goodput_per_gpu_rps", SRC))
        rows.append([Cell(str(r["rank"]), f"{key}.rank", r["rank"], source=SRC, num=True), Cell(r["deployment"]),
                     number(r["gpus"], 1, 0, f"{key}.gpus", SRC),
                     number(r.get("capacity_rps"), 1, 3, f"{key}.capacity_rps", SRC),
                     number(lo, 1, 3, f"{key}.bracket_rps.0", SRC), number(hi, 1, 3, f"{key}.bracket_rps.1", SRC),
                     measure,
                     number(r.get("attainment_at_capacity"), 0.01, 1, f"{key}.attainment_at_capacity", SRC),
                     number(r.get("e2e_p99_at_capacity_s"), 1, 2, f"{key}.e2e_p99_at_capacity_s", SRC),
                     Cell(r.get("problem") or r.get("note") or "")])
        classes.append("" if r.get("capacity_rps") else "bad")
    heads = ["rank", "deployment", "GPUs", "capacity (req/s)", "bracket low", "bracket high",
             "requests per $" if per_dollar else "req/s per GPU", "attained at capacity (%)",
             "E2E p99 at capacity (s)", "note"]
    return table(heads, rows, "Deployments of the budget, best first (P:D = prefill : decode replicas x layout)",
                 row_classes=classes, numeric_columns={0, 2, 3, 4, 5, 6, 7, 8})


def layouts_page(out_dir: Path, shown: str | Path | None = None) -> Page:
    """The whole report of a `capsim plan --gpus` folder (`shown`: the folder's name on the page, when the files are
    read from a staging folder before they reach it)."""
    plan = read_json(Path(out_dir) / SRC)
    rows = plan["deployments"]
    per_dollar = bool(plan.get("price_per_gpu_hour"))
    best = next((r for r in rows if r.get("capacity_rps")), None)
    if best is None:
        lead = (f"None of the {len(rows)} deployment(s) of {plan['gpu_budget']} x {plan['card']} has a goodput "
                "capacity: each row's note says why.")
    else:
        lead = (f"Best of {len(rows)} deployment(s) of {plan['gpu_budget']} x {plan['card']}: {best['deployment']}, "
                f"{best['capacity_rps']:.4g} req/s on {best['gpus']} GPU(s) "
                + (f"({best['requests_per_dollar']:.4g} requests per dollar)." if per_dollar else
                   f"({best['goodput_per_gpu_rps']:.4g} req/s per GPU)."))
    page = Page(f"capsim layout plan report: {Path(plan['scenario']).stem}", lead)
    page.add("budget", "Budget and targets", budget_section(plan))
    page.add("ranking", "Deployments ranked", ranking_section(plan))
    if best is not None:
        page.add("figure", "The ranking", figure(
            figures.layouts_figure(rows, per_dollar), "Goodput per GPU (or per dollar) of each deployment with a capacity",
            "Each deployment that meets the targets at some rate, best at the top; aggregated replicas and "
            "disaggregated pools in two colours. Rows without a capacity are in the table above.", "fig-layouts"))
    page.footer = (f"Written by capsim from {shown_path(shown or out_dir)}: {SRC} (its layouts.csv holds the same rows). Capacities are "
                   "bisection results: the true capacity lies in each row's bracket. Times are seconds unless marked.")
    return page
