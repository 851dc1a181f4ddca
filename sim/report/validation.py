"""A validation's report (`capsim validate --report`): simulated against measured for every point
(metrics, targets, per-request errors, the profile's error on the iterations that ran, the
prediction's intervals, CDF overlays and per-request scatter), then the run sections of the first
point's simulated run.

Reads validation.json and the measured/ and simulated/ tables `capsim validate` writes; imports nothing
from calibration (sim never does)."""

from __future__ import annotations

from pathlib import Path

from sim.report import figures
from sim.report.html import Cell, Page, definition_list, figure, number, paragraph, shown_path, table
from sim.report.inputs import ScenarioInfo, load_run, read_json
from sim.report.run import add_run_sections

SRC = "validation.json"
LATENCIES = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E"))
STATS = ("mean", "median", "p90", "p99")
SCALARS = (("makespan_s", "makespan", "s", 1.0, 3),
           ("output_throughput_tok_s", "output throughput", "tokens/s", 1.0, 1),
           ("request_throughput_rps", "request throughput", "req/s", 1.0, 3))


def point_label(point: dict) -> str:
    """'rate_rps 200' (or 'rate_scale 2'), '' for a point without a rate."""
    return ", ".join(f"{k} {point[k]:g}" for k in ("rate_rps", "rate_scale") if point.get(k) is not None)


def point_dir(out_dir: Path, report: dict, i: int) -> Path:
    """Where `capsim validate` wrote point i's tables: OUT itself for one point, OUT/rate-R for several."""
    pts = report["points"]
    if len(pts) == 1:
        return out_dir
    p = pts[i]
    r = p.get("rate_rps") if p.get("rate_rps") is not None else p.get("rate_scale")
    return out_dir / f"rate-{r:g}"


def header_items(report: dict) -> list[tuple[str, str]]:
    """What was validated, where and how."""
    fit = report.get("profile_fit")
    return [("scenario", f"{report['scenario']} ({shown_path(report.get('scenario_path', ''))})"
             + (f" with --set {' --set '.join(report['overrides'])}" if report.get("overrides") else "")),
            ("step-time profile", f"{shown_path(report['profile'])} ({report['use']} model)"),
            ("profile fit error", f"held-out MAPE {fit['mape']:.2%}, largest {fit['max_abs_rel_err']:.2%}, "
                                  f"{fit['n_points']} points" if fit else "none recorded"),
            ("device", f"{report['device']}: {report['device_name']}"),
            ("replay", f"{report['dtype']}, clock {report['clock']}, {report['threads']} torch thread(s), "
                       f"torch {report['torch']}"),
            ("date", str(report.get("date"))), ("command", str(report.get("command"))),
            ("relative error", report.get("definitions", {}).get("rel_error", "(simulated - measured) / measured"))]


def metrics_table(point: dict, i: int) -> str:
    """Each latency statistic and total: simulated, measured and the relative error."""
    m = point["metrics"]
    rows = []
    for key, name in LATENCIES:
        for st in STATS:
            base = f"points.{i}.metrics.{key}.{st}"
            rows.append([f"{name} {st}", number(m[key][st]["simulated"], 1e-3, 3, f"{base}.simulated", SRC),
                         number(m[key][st]["measured"], 1e-3, 3, f"{base}.measured", SRC), "ms",
                         number(m[key][st]["rel_error"], 0.01, 1, f"{base}.rel_error", SRC)])
    for key, name, unit, scale, digits in SCALARS:
        base = f"points.{i}.metrics.{key}"
        rows.append([name, number(m[key]["simulated"], scale, digits, f"{base}.simulated", SRC),
                     number(m[key]["measured"], scale, digits, f"{base}.measured", SRC), unit,
                     number(m[key]["rel_error"], 0.01, 1, f"{base}.rel_error", SRC)])
    return table(["metric", "simulated", "measured", "unit", "error (%)"], rows,
                 "Simulated against measured (error = (simulated - measured) / measured)", numeric_columns={1, 2, 4})


def targets_table(point: dict, i: int) -> str:
    """The accuracy targets on the medians, met or not (a vLLM validation judges by the target or by half the
    replays' spread, whichever is wider, and says which)."""
    rows, classes = [], []
    for key, t in point.get("targets", {}).items():
        base = f"points.{i}.targets.{key}"
        err = (number(t["abs_rel_error"], 0.01, 1, f"{base}.abs_rel_error", SRC) if "abs_rel_error" in t else
               number(t.get("rel_error"), 0.01, 1, f"{base}.rel_error", SRC))
        bound = t.get("bound", t["target"])
        judged = f" ({t['judged_by']})" if t.get("judged_by") else ""
        met = Cell("-" if t["met"] is None else "yes" if t["met"] else "NO")
        rows.append([key, err, f"<= {bound:.1%}{judged}", met])
        classes.append("" if t["met"] else "bad")
    return table(["median", "error (%)", "bound", "met"], rows, "Accuracy targets (|error| within the bound)",
                 row_classes=classes, numeric_columns={1})


def step_error_table(point: dict, i: int) -> str:
    """The profile's error on the iterations that actually ran, overall and by kind."""
    st = point.get("step_time", {})
    rows = []
    kinds = [("all", st.get("all"), "all"), *((k, e, f"by_kind.{k}") for k, e in st.get("by_kind", {}).items())]
    if st.get("all") is None and "mape" in st:      # a vLLM validation: one row over the engine's iterations
        kinds = [("all", st, "")]
    for kind, e, sub in kinds:
        if not e:
            continue
        base = f"points.{i}.step_time" + (f".{sub}" if sub else "")

        def cell(k, scale, digits):
            return number(e[k], scale, digits, f"{base}.{k}", SRC) if k in e else Cell("-", num=True)
        rows.append([kind, str(e["iterations"]), cell("mape", 0.01, 1), cell("time_bias", 0.01, 1),
                     cell("measured_s_median", 1e-3, 3), cell("predicted_s_median", 1e-3, 3)])
    note = []
    if st.get("host_share") is not None:
        note.append(f"host time around the forward passes: {st['host_share']:.1%} of the measured iteration time")
    if st.get("forward_cpu_share") is not None:
        note.append(f"share of a core the forward passes got: {st['forward_cpu_share']:.0%}")
    return (table(["iterations", "count", "MAPE (%)", "time bias (%)", "measured median (ms)",
                   "predicted median (ms)"], rows, "The profile on the iterations that ran",
                  numeric_columns={1, 2, 3, 4, 5})
            + (paragraph("; ".join(note) + ".") if note else ""))


def uncertainty_table(point: dict) -> str:
    """The prediction's intervals (workload seeds, step-time model draws) on the medians."""
    u = point.get("uncertainty", {})
    rows = []
    for key, name in LATENCIES:
        e = u.get("metrics", {}).get(f"{key}.median")
        if not e:
            continue

        def iv(x):
            return "-" if not x else f"{x[0] * 1e3:.3f} to {x[1] * 1e3:.3f}"
        inside = e.get("measured_inside", {})
        rows.append([f"{name} median", iv(e.get("workload_interval")), iv(e.get("model_interval")),
                     str(e.get("dominant") or "-"),
                     ", ".join(k for k, v in inside.items() if v) or "neither"])
    text = (f"Intervals: {u.get('interval', '5th-95th percentile')} over {u.get('workload_seeds')} workload seed(s) "
            "and "
            f"{u.get('model_draws')} step-time model draw(s) ({u.get('model_residuals', '')}); wider overall: "
            f"{u.get('dominant')}.")
    return paragraph(text) + table(["metric", "workload interval (ms)", "model interval (ms)", "wider",
                                    "measured inside"], rows, "Where the prediction could be")


def point_section(out_dir: Path, report: dict, i: int, slo: dict) -> str:
    """One point: tables, then CDF overlays and per-request scatter from its measured/simulated tables."""
    point = report["points"][i]
    d = point_dir(out_dir, report, i)
    measured, simulated = load_run(d / "measured", measured=True), load_run(d / "simulated")
    same = point.get("replay_consistency", {})
    def n(x):   # one replay's count, or each replay's (a vLLM validation keeps them all)
        return ", ".join(map(str, x)) if isinstance(x, list) else str(x)
    check = ("" if not same else " Simulator fed the measured iteration times reproduces the replay's batches: "
             + ("yes." if same.get("identical") else "NO."))
    body = [paragraph(f"{point['requests']} requests; measured {n(point['completed']['measured'])} finished in "
                      f"{n(point['iterations']['measured'])} iterations, simulated {point['completed']['simulated']} "
                      f"in {point['iterations']['simulated']}.{check}"),
            metrics_table(point, i), targets_table(point, i), step_error_table(point, i), uncertainty_table(point)]
    cdf = figures.latency_cdfs({"simulated": simulated.requests, "measured": measured.requests}, slo)
    body.append(figure(cdf, "CDFs of TTFT, TPOT, largest ITL and E2E, simulated and measured",
                       "Empirical CDFs over finished requests (ms): simulated (blue) and measured (black, dashed).",
                       f"fig-val-cdf-{i}"))
    body.append(figure(figures.per_request_scatter(measured.requests, simulated.requests),
                       "Per-request simulated against measured TTFT, TPOT and E2E",
                       "Each finished request, paired by id; the grey line is simulated = measured.",
                       f"fig-val-scatter-{i}"))
    return "".join(body)


def simulated_info(info: ScenarioInfo, report: dict) -> ScenarioInfo:
    """The scenario the validation simulated: its profile and model choice, and the first point's rate."""
    from sim.io.config import ProfileStepTime
    sc = info.scenario
    st = sc.step_time.model_copy(update={"model": ProfileStepTime(kind="profile", path=str(Path(report["profile"])
                                                                                           .resolve()),
                                                                  use=report["use"])})
    p = report["points"][0]
    wl = sc.workload
    if len(report["points"]) > 1 and p.get("rate_rps") is not None and wl.kind == "synthetic":
        wl = wl.model_copy(update={"arrival": wl.arrival.model_copy(update={"rate_rps": p["rate_rps"]})})
    elif len(report["points"]) > 1 and p.get("rate_scale") is not None and wl.kind == "trace":
        wl = wl.model_copy(update={"rate_scale": p["rate_scale"]})
    return ScenarioInfo(sc.model_copy(update={"step_time": st, "workload": wl}), info.base_dir, info.source,
                        info.overrides)


def validation_page(out_dir: Path, info: ScenarioInfo) -> Page:
    """The whole report of a validation folder."""
    report = read_json(out_dir / "validation.json")
    if not report.get("points"):
        from sim.io.errors import ConfigError
        raise ConfigError(f"{out_dir / 'validation.json'}: points: empty (expected one per validated rate)")
    first = report["points"][0]["metrics"]
    lead = ("Median errors (simulated - measured) / measured: " + ", ".join(
        f"{name} {first[k]['median']['rel_error']:+.1%}" for k, name in LATENCIES
        if first[k]["median"]["rel_error"] is not None) + (" (first point)." if len(report["points"]) > 1 else "."))
    page = Page(f"capsim validation report: {report['scenario']}", lead)
    page.add("validation", "What was validated", definition_list(header_items(report)))
    s = info.scenario.slo
    slo = {"ttft_s": s.ttft_s, "itl_s": s.itl_s if s.itl_stat == "max" else None, "e2e_s": s.e2e_s}
    for i, p in enumerate(report["points"]):
        label = point_label(p)
        page.add(f"point-{i}", "Simulated against measured" + (f" ({label})" if label else ""),
                 point_section(out_dir, report, i, slo))
    sim_dir = point_dir(out_dir, report, 0) / "simulated"
    label = point_label(report["points"][0])
    add_run_sections(page, simulated_info(info, report), load_run(sim_dir), "sim-",
                     "(simulated" + (f", {label})" if label else ")"),
                     str(sim_dir.relative_to(out_dir) / "summary.json"))
    page.footer = (f"Written by capsim from {out_dir}: validation.json and the measured/ and simulated/ tables. "
                   "Times are seconds unless marked ms.")
    return page
