"""The sections of a run's report: scenario, headline, warnings, step-time model, latency CDFs, timeline,
slowest requests. A plan's and a validation's reports reuse them for the run they show."""

from __future__ import annotations

from sim.io.units import fmt_bytes
from sim.report import figures, steptime
from sim.report.html import Cell, Page, bullet_list, definition_list, figure, number, paragraph, shown_path, table
from sim.report.inputs import STATS, RunData, ScenarioInfo

LATENCIES = (("ttft_s", "TTFT (time to first token)"), ("tpot_s", "TPOT (time per output token after the first)"),
             ("itl_s", "ITL (inter-token latency, all gaps pooled)"), ("e2e_s", "E2E (end-to-end latency)"))
SLOWEST = 10


# ---- scenario ------------------------------------------------------------------------------------

def slo_text(scenario) -> str:
    """The scenario's SLOs in words, e.g. 'TTFT <= 2 s, each request's largest ITL <= 0.2 s, E2E <= 30 s'."""
    s = scenario.slo
    parts = []
    if s.ttft_s is not None:
        parts.append(f"TTFT <= {s.ttft_s:g} s")
    if s.itl_s is not None:
        parts.append(f"each request's {'largest' if s.itl_stat == 'max' else 'p99'} ITL <= {s.itl_s:g} s")
    if s.e2e_s is not None:
        parts.append(f"E2E <= {s.e2e_s:g} s")
    if scenario.accuracy.p_correct < 1:
        parts.append(f"a correct answer (p_correct {scenario.accuracy.p_correct:g})")
    return ", ".join(parts) if parts else "none (every finished request counts as good)"


def _workload_text(wl) -> str:
    if wl.kind == "trace":
        extra = [f"rate x{wl.rate_scale:g}" if wl.rate_scale != 1 else "",
                 f"window {wl.window_s[0]:g}-{wl.window_s[1]:g} s" if wl.window_s else "",
                 f"first {wl.max_requests} requests" if wl.max_requests else ""]
        return f"trace {wl.path} ({wl.format})" + "".join(f", {e}" for e in extra if e)
    if wl.kind == "synthetic":
        a = wl.arrival
        rate = f"{a.rate_rps:g} req/s" if hasattr(a, "rate_rps") else "all at once"
        return (f"synthetic: {wl.num_requests} requests, {a.kind} arrivals at {rate}, prompt {wl.prompt_tokens.kind}, "
                f"output {wl.output_tokens.kind} tokens")
    return f"{len(wl.requests)} requests listed in the scenario"


def _budget_text(scenario, summary: dict) -> str:
    b = scenario.kv.budget
    how = (f"{fmt_bytes(b)} set in the scenario" if isinstance(b, int) else
           f"gpu_memory_utilization {b.gpu_memory_utilization:g} of the card, minus weights, workspace "
           f"{fmt_bytes(b.activation_bytes)} and other {fmt_bytes(b.other_bytes)}")
    return (f"{fmt_bytes(summary['kv_budget_bytes'])} ({how}); pool {summary['kv_capacity_blocks']:,} blocks of "
            f"{scenario.kv.block_tokens} tokens = {fmt_bytes(summary['kv_capacity_bytes'])}")


POOLS = ("prefill", "decode")


def _shape(par: dict) -> str:
    """A replica's layout from its summary's `parallel` mapping, e.g. 'tp 8 ep 8' or 'attention_dp 8 tp 1 ep 8'."""
    dp = par.get("attention_dp", 1)
    return ((f"attention_dp {dp} " if dp > 1 else "") + f"tp {par['tp']}" + (f" pp {par['pp']}" if par["pp"] > 1 else "")
            + (f" ep {par['ep']}" if par["ep"] > 1 else ""))


def _gpus_text(summary: dict) -> str:
    """How many GPUs the run's GPU-seconds count, and how they are made up."""
    pools = summary.get("disaggregation")
    if pools:
        parts = ", ".join(f"{n} {pools[n]['replicas']} x {pools[n]['gpus_per_replica']}" for n in POOLS if n in pools)
        return f"{summary.get('gpus', '?')} GPUs ({parts})"
    per = (summary.get("parallel") or {}).get("gpus_per_replica", 1)
    replicas = summary.get("replicas", 1)
    return f"{replicas * per} GPU(s) ({replicas} replica(s) x {per})"


def scenario_items(info: ScenarioInfo, summary: dict, hw, model) -> list[tuple[str, str]]:
    """(term, text) rows describing the scenario: model, card, layout, scheduler, KV budget, SLOs."""
    sc = info.scenario
    sched = sc.scheduler.model_dump(mode="json")
    kind = sched.pop("kind")
    cl = sc.cluster
    par = summary.get("parallel")  # multi-GPU replicas (issue 15)
    tp = par["tp"] if par else getattr(sc.step_time.model, "tp", 1)
    gpus = par["gpus_per_replica"] if par else tp
    shape = _shape(par) if par else f"tp {tp}"
    pools = summary.get("disaggregation")
    if pools:  # the pools' replicas, not the cluster's
        layout = (" + ".join(f"{name} pool {p['replicas']} replica(s) x {p['gpus_per_replica']} {hw.name}"
                             + (f" ({_shape(p['parallel'])})" if p.get("parallel") else "")
                             for name, p in pools.items() if name in POOLS)
                  + f" = {summary.get('gpus', '?')} GPUs; weights {sc.weight_format}, KV {sc.kv.format}")
    else:
        layout = (f"{cl.replicas} replica(s) x {gpus} {hw.name}" + (f" ({shape})" if gpus > 1 else "")
                  + f", router {cl.router.kind}; weights {sc.weight_format}, KV {sc.kv.format}")
    if sc.offload:
        layout += f"; {sc.offload.layers} layers' FFNs offloaded to host memory"
    if sc.lora:
        layout += f"; {sc.lora.adapters} LoRA adapter(s), rank {sc.lora.rank}"
    return [
        ("scenario", f"{sc.name}: {sc.description}" if sc.description else sc.name),
        ("file", shown_path(info.source) + (f" with --set {' --set '.join(info.overrides)}" if info.overrides else "")),
        ("model", f"{model.name} ({model.hf_id}): {model.num_layers} layers, hidden {model.hidden_size}; weights "
                  f"{fmt_bytes(summary.get('weights_bytes', 0))} ({sc.weight_format})"),
        ("card", f"{hw.name}: {hw.description}; {hw.memory_gb.value:g} GB, {hw.memory_bandwidth_gbs.value:g} GB/s, "
                 f"{hw.bf16_dense_tflops.value:g} TFLOP/s BF16 dense, power cap "
                 + (f"{hw.tdp_w.value:g} W" if hw.tdp_w.value is not None else "unpublished")),
        ("layout", layout),
        ("scheduler", f"{kind}: " + ", ".join(f"{k} {v}" for k, v in sched.items() if v is not None)),
        ("KV budget", _budget_text(sc, summary)),
        ("KV admission", f"{sc.kv.admission}; prefix caching {'on' if sc.kv.prefix_caching else 'off'}; "
                         f"eviction {sc.kv.eviction}; preemption {sc.kv.preemption}"),
        ("SLOs", slo_text(sc)),
        ("workload", _workload_text(sc.workload)),
        ("seed", str(sc.seed)),
        ("energy model", "the card's power cap over the whole window (an upper bound)" if sc.power.model == "cap"
         else f"{sc.power.busy_w:g} W while iterating, {sc.power.idle_w:g} W otherwise"),
    ]


# ---- headline ------------------------------------------------------------------------------------

def latency_table(summary: dict, src: str = "summary.json") -> str:
    """TTFT, TPOT, ITL and E2E: mean, median, p90, p99 and max in milliseconds."""
    rows = []
    for key, name in LATENCIES:
        st = summary[key]
        rows.append([Cell(name)] + [number(st.get(s), 1e-3, 2, f"{key}.{s}", src) for s in STATS])
    return table(["latency", *(f"{s} (ms)" for s in STATS)], rows, "Latencies of finished requests, milliseconds",
                 numeric_columns=set(range(1, 6)))


def memory_reason(summary: dict, scenario, hw) -> tuple[bool, str]:
    """Whether the run fit in memory, and why (the summary's memory keys in words)."""
    b = scenario.kv.budget
    workspace = 0 if isinstance(b, int) else b.activation_bytes
    pools = summary.get("disaggregation")
    if pools:
        card = "; ".join(f"{n} pool: " + _card_text(pools[n], workspace, hw) for n in POOLS if n in pools)
    else:
        card = _card_text(summary, workspace, hw)
    problems = []
    if not summary.get("card_fit", True):
        problems.append(f"{card}: does not fit the card")
    if summary.get("kv_limited_requests"):
        problems.append(f"{summary['kv_limited_requests']:,} request(s) waited for free KV blocks at admission "
                        f"(the workload needed up to {fmt_bytes(summary['kv_need_bytes'])} of KV at once, "
                        f"{summary['kv_need_bytes'] / summary['kv_capacity_bytes']:.2f} x the pool)")
    if summary.get("kv_rejected_requests"):
        problems.append(f"{summary['kv_rejected_requests']:,} request(s) refused: their KV need exceeds the pool")
    if summary.get("preemptions"):
        problems.append(f"{summary['preemptions']:,} preemption(s) to free KV "
                        f"({summary.get('recomputed_tokens', 0):,} tokens recomputed)")
    if summary["memory_fit"]:
        return True, (f"{card}; no request waited for, was refused or was preempted for KV; "
                      + ("the decode pool's peak KV " if pools else "peak KV ") +
                      f"{fmt_bytes(summary['peak_kv_bytes'])} of {fmt_bytes(summary['kv_capacity_bytes'])}")
    if summary.get("card_fit", True):
        problems.append(f"the card itself holds it ({card})")
    return False, "; ".join(problems)


def _card_text(part: dict, workspace: int, hw) -> str:
    """What one GPU holds: a replica's (or pool's) weights, KV budget and workspace, per GPU when it spans several
    (its `parallel` mapping), against the card's memory."""
    par = part.get("parallel")
    if par:
        weights, kv, workspace = (par["weights_bytes_per_gpu"], par["kv_budget_bytes_per_gpu"],
                                  par["activation_bytes_per_gpu"])
    else:
        weights, kv = part["weights_bytes"], part["kv_budget_bytes"]
    total = weights + kv + workspace
    return (f"weights {fmt_bytes(weights)} + KV budget {fmt_bytes(kv)}" + (f" + workspace {fmt_bytes(workspace)}"
                                                                          if workspace else "")
            + f" = {fmt_bytes(total)}" + (" per GPU" if par else "") + f" of the card's {fmt_bytes(hw.memory_bytes)}")


def totals_table(summary: dict, scenario, hw, src: str = "summary.json") -> str:
    """Throughput, goodput and attainment (SLOs named), memory fit with its reason, GPU-s and J per good result."""
    s = summary
    fit, reason = memory_reason(s, scenario, hw)
    rows = [
        ["requests finished", number(s["completed"], 1, 0, "completed", src),
         f"of {s['requests']:,}; {s.get('rejected', 0):,} rejected, {s.get('cancelled', 0):,} cancelled, "
         f"{s.get('failed', 0):,} failed"],
        ["window", number(s["makespan_s"], 1, 2, "makespan_s", src), "s, first arrival to last completion"],
        ["output throughput", number(s["output_throughput_tok_s"], 1, 1, "output_throughput_tok_s", src), "tokens/s"],
        ["request throughput", number(s["request_throughput_rps"], 1, 3, "request_throughput_rps", src), "requests/s"],
        ["goodput", number(s["goodput_rps"], 1, 3, "goodput_rps", src), "requests/s meeting every SLO"],
        ["SLO attainment", number(s["slo_attainment"], 0.01, 1, "slo_attainment", src),
         f"% of all requests meeting every SLO: {slo_text(scenario)}"],
        ["good requests", number(s["good"], 1, 0, "good", src), "requests"],
        ["memory fit", Cell("yes" if fit else "NO", "memory_fit", s["memory_fit"], source=src), reason],
        ["peak KV in use", number(s["peak_kv_bytes"], 2**30, 2, "peak_kv_bytes", src),
         f"GiB of {s['kv_capacity_bytes'] / 2**30:.2f} GiB"],
        ["GPU-s per good result", number(s.get("gpu_seconds_per_good"), 1, 3, "gpu_seconds_per_good", src),
         f"GPU-seconds: {_gpus_text(s)} x the window / good requests"],
        ["energy per good result", number(s.get("energy_j_per_good"), 1, 1, "energy_j_per_good", src),
         "J, " + ("the power cap over the window" if scenario.power.model == "cap" else "busy/idle power model")],
    ]
    return table(["quantity", "value", "unit / note"], rows, "Throughput, goodput, memory and cost",
                 row_classes=["bad" if r[0] == "memory fit" and not fit else "" for r in rows],
                 numeric_columns={1})


# ---- warnings, slowest requests --------------------------------------------------------------------

def warnings(summary: dict, scenario, step: steptime.StepTimeInfo, hw) -> list[str]:
    """Everything a reader should not miss, in words."""
    s = summary
    out = []
    fit, reason = memory_reason(s, scenario, hw)
    if not fit:
        out.append(f"Memory does not fit: {reason}.")
    for key, what in (("rejected", "were rejected"), ("cancelled", "were cancelled"), ("failed", "failed")):
        if s.get(key):
            out.append(f"{s[key]:,} of {s['requests']:,} requests {what}.")
    if s.get("slo_attainment") is not None and s["slo_attainment"] < 0.9:
        out.append(f"Only {s['slo_attainment']:.1%} of requests met every SLO ({slo_text(scenario)}).")
    if not any(v is not None for v in (scenario.slo.ttft_s, scenario.slo.itl_s, scenario.slo.e2e_s)):
        out.append("The scenario sets no SLO: goodput counts every finished request.")
    if step.extrapolated in ("yes", "possibly"):
        out.append(f"Step-time model extrapolated ({step.extrapolated}): {step.verdict}.")
    if step.fit_unknown:
        out.append(f"The step-time model's fit error is unknown: {step.fit_unknown}.")
    if s.get("energy_j") is None:
        out.append(f"No energy figure: the card {hw.name} has no published power cap.")
    return out


def slowest_table(requests) -> str:
    """The slowest finished requests by E2E, with what they asked for and what they waited on."""
    fin = requests[requests["status"] == "finished"].sort_values(["e2e_s", "id"], ascending=[False, True])
    rows = []
    for _, r in fin.head(SLOWEST).iterrows():
        rows.append([str(int(r["id"])), f"{r['arrival_s']:.2f}", f"{int(r['prompt_tokens']):,}",
                     f"{int(r['output_tokens']):,}", f"{int(r.get('cached_tokens', 0)):,}", f"{r['ttft_s'] * 1e3:.1f}",
                     "-" if r["tpot_s"] != r["tpot_s"] else f"{r['tpot_s'] * 1e3:.2f}",
                     "-" if r["max_itl_s"] != r["max_itl_s"] else f"{r['max_itl_s'] * 1e3:.1f}",
                     f"{r['e2e_s']:.2f}", str(int(r.get("preemptions", 0))),
                     "yes" if bool(r.get("kv_waited", False)) else "no", "yes" if bool(r["met_slo"]) else "no"])
    heads = ["id", "arrival (s)", "prompt (tok)", "output (tok)", "cached (tok)", "TTFT (ms)", "TPOT (ms)",
             "max ITL (ms)", "E2E (s)", "preempted", "KV wait", "met SLOs"]
    other = requests[requests["status"] != "finished"]["status"].value_counts()
    note = ("" if other.empty else paragraph("Not finished: " + ", ".join(f"{n:,} {k}" for k, n in other.items())
                                             + " (listed in requests.csv)."))
    return table(heads, rows, f"The {min(SLOWEST, len(fin))} slowest finished requests by E2E",
                 numeric_columns=set(range(1, 12))) + note


# ---- the page ------------------------------------------------------------------------------------

def _profiles(info: ScenarioInfo):
    from sim.io.profiles import load_hardware, load_model
    sc = info.scenario
    hw = load_hardware(info.base_dir / sc.hardware if sc.hardware.endswith(".yaml") else sc.hardware)
    model = load_model(info.base_dir / sc.model if sc.model.endswith(".yaml") else sc.model)
    return hw, model


def add_run_sections(page: Page, info: ScenarioInfo, run: RunData, prefix: str = "", what: str = "",
                     src: str = "summary.json") -> None:
    """Append the run's sections (ids prefixed, headings suffixed with `what`) to a page; `src` is the
    run's summary.json relative to the report."""
    hw, model = _profiles(info)
    s = run.summary
    sc = info.scenario
    step = steptime.step_time_info(sc, info.base_dir, run)
    tail = f" {what}" if what else ""
    page.add(f"{prefix}scenario", f"Scenario{tail}", definition_list(scenario_items(info, s, hw, model)))
    page.add(f"{prefix}headline", f"Headline{tail}", latency_table(s, src) + totals_table(s, sc, hw, src))
    warn = warnings(s, sc, step, hw)
    page.add(f"{prefix}warnings", f"Warnings{tail}",
             bullet_list(warn, "warnings") if warn else paragraph("None: everything fit and finished."))
    page.add(f"{prefix}step-time", f"Step-time model{tail}", steptime.render(step))
    slo = {"ttft_s": sc.slo.ttft_s, "itl_s": sc.slo.itl_s if sc.slo.itl_stat == "max" else None,
           "e2e_s": sc.slo.e2e_s}
    cdf = figures.latency_cdfs({"simulated" if not what else what.strip("()"): run.requests}, slo)
    page.add(f"{prefix}cdfs", f"Latency CDFs{tail}", figure(
        cdf, "Cumulative distributions of TTFT, TPOT, each request's largest inter-token gap and E2E",
        "Empirical CDFs over finished requests (ms; log axis when values span more than 100x); dashed red "
        "lines: the SLO bounds. The ITL panel shows each request's largest gap, the quantity the ITL SLO bounds.",
        f"{prefix}fig-cdf"))
    block_bytes = s["kv_capacity_bytes"] / s["kv_capacity_blocks"]
    svg, how = figures.timeline(run.iterations, block_bytes, s["kv_capacity_bytes"])
    page.add(f"{prefix}timeline", f"Timeline{tail}", figure(
        svg, "Batch size, tokens per iteration and KV cache in use over simulated time",
        f"Per iteration, against simulated time: {how}. KV in use counts the blocks held while the iteration "
        "runs (blocks x block bytes).", f"{prefix}fig-timeline"))
    page.add(f"{prefix}slowest", f"Slowest requests{tail}", slowest_table(run.requests))


def run_page(info: ScenarioInfo, run: RunData) -> Page:
    """The whole report of one run."""
    s = run.summary
    page = Page(f"capsim report: {s['scenario']}",
                f"{s['completed']:,} of {s['requests']:,} requests finished in {s['makespan_s']:.1f} s of simulated "
                f"time; goodput {s['goodput_rps']:.3f} req/s, SLO attainment {s['slo_attainment']:.1%}."
                if s.get("goodput_rps") is not None and s.get("slo_attainment") is not None else "")
    add_run_sections(page, info, run)
    page.footer = (f"Written by capsim from {run.folder}: summary.json, requests.csv, iterations.csv. "
                   "All times are simulated seconds unless marked ms.")
    return page
