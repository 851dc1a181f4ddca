"""The step-time model's part of a report: where its numbers come from, how well they fit, and whether
the run went beyond what was measured.

Nothing here is recorded in summary.json (adding keys would change the shipped scenarios' outputs), so
it is read from the scenario and its profile files, and the extrapolation check compares the run's
tables with the calibrated ranges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sim.report.html import definition_list, esc, shown_path, table

SCENARIO_NOTE = ("allow_extrapolation is false: the simulator stops with an error at the first iteration outside "
                 "the profile's valid_range or the efficiency tables' measured range, so this completed run "
                 "extrapolated nothing")


@dataclass
class StepTimeInfo:
    """What the report says about the step-time model."""

    kind: str
    facts: list[tuple[str, str]] = field(default_factory=list)
    fit: list[tuple[str, str]] = field(default_factory=list)
    notes: str | None = None
    fit_unknown: str = ""                                     # why no fit error is known ("" when one is)
    checks: list[list[str]] = field(default_factory=list)   # (what, calibrated, this run, verdict)
    extrapolated: str = "no"                                  # "no", "yes", "possibly", "unchecked"
    verdict: str = ""


def _profile(scenario, base_dir: Path):
    from sim.core.step_time_builder import resolve_profile_path
    from sim.io.profiles import load_fitted
    cfg = scenario.step_time.model
    path = resolve_profile_path(cfg.path, base_dir)
    return path, load_fitted(path), cfg.use


def _fit_rows(prof) -> list[tuple[str, str]]:
    f = prof.fit
    if f is None:
        return [("fit error", "none recorded in the profile: its numbers are not a fit by capsim "
                              "(see the profile notes below)")]
    rows = [("held-out MAPE", f"{f.mape:.2%} (mean |predicted / measured - 1| on {f.n_heldout} held-out points)"),
            ("largest |relative error|", f"{f.max_abs_rel_err:.2%}"),
            ("points", f"{f.n_points} timed, {f.n_heldout} held out")]
    if f.r2 is not None:
        rows.append(("R²", f"{f.r2:.4f}"))
    return rows


def _provenance_rows(path: Path, prof, use: str) -> list[tuple[str, str]]:
    p = prof.provenance
    rows = [("kind", f"fitted profile, its {use} model"), ("file", shown_path(path)), ("source", p.source)]
    for label, value in (("device", p.device_name), ("date", p.date), ("torch", p.torch_version),
                         ("driver", p.driver_version), ("git commit", p.git_commit), ("grid", p.grid),
                         ("raw points", p.points_csv)):
        if value:
            rows.append((label, str(value)))
    rows.append(("profile dtype", f"{prof.dtype}; CUDA graphs {'on' if prof.cuda_graphs else 'off'}"
                 + (f"; {prof.layers_timed} layers timed, times scaled" if prof.layers_timed else "")))
    return rows


def _published_rows(cfg, scenario, base_dir: Path) -> tuple[list[tuple[str, str]], dict | None]:
    """The ops model's end-to-end error on published serving runs of the card whose tables it reads."""
    from sim.io.published_check import ops_check
    tables, published = ops_check(cfg, scenario.hardware, base_dir, scenario.disaggregation is not None)
    return _rows_of(tables, published), published


def _published_rows_of(tables: str, disaggregated: bool = False) -> tuple[list[tuple[str, str]], dict | None]:
    """The same rows for a named table set (a composed profile's)."""
    from sim.io.published_check import card_check, for_serving
    published = for_serving(card_check(tables), disaggregated)
    return _rows_of(tables, published), published


def _rows_of(tables: str, published: dict | None) -> list[tuple[str, str]]:
    from sim.io.published_check import ENGINE_NAMES
    if published is None:
        return [("published serving runs", f"none checked on the {tables} tables")]
    rows = [(f"published runs, {ENGINE_NAMES.get(g['engine'], g['engine'])} {g['mode']}",
             f"median |error| TTFT {g['ttft_median_abs_error']:.1%} (p90 {g['ttft_p90_abs_error']:.1%}), "
             f"TPOT {g['tpot_median_abs_error']:.1%} (p90 {g['tpot_p90_abs_error']:.1%})"
             + ("" if g.get("e2e_median_abs_error") is None else
                f", E2E {g['e2e_median_abs_error']:.1%} (p90 {g['e2e_p90_abs_error']:.1%})")
             + f" on {g['runs']:,} runs")
            for g in published["groups"]]
    if published.get("disagg_checked_on") is not None:
        from sim.io.published_check import disagg_note
        rows.append(("disaggregated runs", disagg_note(published).removeprefix("; ")))
    return rows + [("published check", f"{published['source']}; capsim {published['commit']}, {published['date']} "
                                       "(docs/fidelity.md)")]


def _observed(run, scenario) -> dict:
    its, req = run.iterations, run.requests
    admitted = req[req["status"] != "rejected"] if "status" in req else req
    longest = (admitted["prompt_tokens"] + admitted["output_tokens"] - 1).max() if len(admitted) else 0
    block_tokens = scenario.kv.block_tokens
    decode_its = its[its["decode_sequences"] > 0]
    return {"batch": int(its["batch_size"].max()) if len(its) else 0,
            "new_tokens": int(its["new_tokens"].max()) if len(its) else 0,
            "context": int(longest),
            "prefill_tokens": its.loc[its["prefill_tokens"] > 0, "prefill_tokens"],
            "decode_kv_tokens_max": int(decode_its["kv_blocks_in_use"].max() * block_tokens) if len(decode_its) else 0,
            "decode_seqs_min": int(decode_its["decode_sequences"].min()) if len(decode_its) else 0,
            "has_decode": bool(len(decode_its))}


def _range_checks(valid, obs: dict) -> list[list[str]]:
    rows = []
    for what, limit, seen, note in (("batch (sequences per iteration)", valid.max_batch, obs["batch"], ""),
                                    ("new tokens per iteration", valid.max_new_tokens, obs["new_tokens"], ""),
                                    ("context tokens of a sequence", valid.max_context_tokens, obs["context"],
                                     " (bound: longest prompt + output - 1, requests.csv)")):
        rows.append([what, f"<= {limit:,}", f"{seen:,}{note}", "within" if seen <= limit else "BEYOND"])
    return rows


def _table_checks(cfg, scenario, model_spec, obs: dict) -> list[list[str]]:
    """Efficiency model: prefill tokens against the MFU table, decode bytes read against the decode table
    (bounded: KV tokens read by decodes <= blocks in use x block tokens; iterations.csv has no exact count)."""
    rows = []
    if isinstance(cfg.prefill_mfu, list) and len(obs["prefill_tokens"]):
        lo, hi = cfg.prefill_mfu[0].new_tokens, cfg.prefill_mfu[-1].new_tokens
        a, b = int(obs["prefill_tokens"].min()), int(obs["prefill_tokens"].max())
        rows.append(["prefill tokens (MFU table)", f"{lo:,} to {hi:,}", f"{a:,} to {b:,}",
                     "within" if lo <= a and b <= hi else "BEYOND"])
    if obs["has_decode"]:
        w = model_spec.weight_read_bytes(scenario.weight_format)
        kv = model_spec.kv_bytes_per_token(scenario.kv.format)
        lo_b, hi_b = w + kv * obs["decode_seqs_min"], w + kv * obs["decode_kv_tokens_max"]
        t0, t1 = cfg.decode_table[0].bytes, cfg.decode_table[-1].bytes
        verdict = ("within" if t0 <= lo_b and hi_b <= t1 else
                   "BEYOND" if lo_b > t1 or hi_b < t0 else "possibly beyond")
        rows.append(["decode bytes read (decode table)", f"{t0 / 1e9:,.2f} to {t1 / 1e9:,.2f} GB",
                     f"{lo_b / 1e9:,.2f} to at most {hi_b / 1e9:,.2f} GB", verdict])
    return rows


def step_time_info(scenario, base_dir: Path, run) -> StepTimeInfo:
    """Provenance, fit error and the extrapolation check of the scenario's step-time model on this run."""
    from sim.io.profiles import load_model
    from sim.models.spec import scenario_spec
    st = scenario.step_time
    cfg = st.model
    valid = None
    if cfg.kind == "profile":
        path, prof, use = _profile(scenario, base_dir)
        info = StepTimeInfo(f"profile ({use})", _provenance_rows(path, prof, use), _fit_rows(prof),
                            prof.provenance.notes)
        cfg, valid = getattr(prof, use), prof.valid_range
        if prof.fit is None:
            info.fit_unknown = "the profile records none (its numbers are not a fit by capsim)"
        from sim.io.published_check import composed_tables
        tables = composed_tables(prof)
        if tables is not None:  # fitted to a composition of kernel tables: its error is against those, not a device
            info.fit.append(("fitted against", f"its composition from the {tables} kernel tables (capsim profile "
                                               "compose), not a measurement"))
            info.fit += _published_rows_of(tables, scenario.disaggregation is not None)[0]
    elif cfg.kind in ("linear", "efficiency"):
        info = StepTimeInfo(cfg.kind, [("kind", f"{cfg.kind} model written in the scenario")],
                            [("fit error", "none: the coefficients are typed into the scenario, not fitted")])
        info.fit_unknown = "its coefficients are typed into the scenario"
    else:
        # a replica's layout (parallel, or each pool's) sets the tensor parallelism, not step_time.model.tp
        laid_out = scenario.parallel is not None or scenario.disaggregation is not None
        fields = ", ".join(f"{k} {v}" for k, v in cfg.model_dump(mode="json").items()
                           if k != "kind" and v is not None and not (k == "tp" and laid_out))
        info = StepTimeInfo(cfg.kind, [("kind", f"{cfg.kind} model" + (f": {fields}" if fields else ""))],
                            [("fit error", f"none: an {cfg.kind} model is composed from kernel tables, not fitted")])
        info.fit_unknown = f"an {cfg.kind} model is composed from kernel tables, not fitted"
        rows, published = _published_rows(cfg, scenario, base_dir)
        info.fit += rows
        if published is not None:
            from sim.io.published_check import check_text
            info.fit_unknown += "; " + check_text(published)
    if st.graph_sizes:
        info.facts.append(("CUDA graphs", "decode batches pad up to " + ", ".join(map(str, st.graph_sizes))))
    info.facts.append(("allow_extrapolation", str(st.allow_extrapolation).lower()))
    if st.scale != 1.0:
        info.facts.append(("step_time.scale", f"the step-time model's time of every iteration x {st.scale:g} "
                                              "(a sensitivity run, not the model's own numbers)"))
    obs = _observed(run, scenario)
    if valid is not None:
        info.checks += _range_checks(valid, obs)
    if cfg.kind == "efficiency":
        model = scenario.model
        spec = scenario_spec(scenario, load_model(base_dir / model if model.endswith(".yaml") else model))
        info.checks += _table_checks(cfg, scenario, spec, obs)
    verdicts = {row[3] for row in info.checks}
    if not st.allow_extrapolation and (valid is not None or cfg.kind == "efficiency"):
        for row in info.checks:   # a bound that looks beyond is not: the simulator enforced the range
            if row[3] != "within":
                row[3] = "within (enforced by the simulator; the tables only bound this)"
        info.extrapolated, info.verdict = "no", SCENARIO_NOTE
    elif "BEYOND" in verdicts:
        info.extrapolated, info.verdict = "yes", "the run went beyond the measured range (rows marked BEYOND)"
    elif "possibly beyond" in verdicts:
        info.extrapolated = "possibly"
        info.verdict = ("the decode bytes read may leave the table (only a bound is recorded); the simulator "
                        "printed a warning on stderr at the first extrapolation")
    elif info.checks:
        info.extrapolated, info.verdict = "no", "every checked quantity stayed within the measured range"
    else:
        info.extrapolated = "unchecked"
        info.verdict = f"the {cfg.kind} model declares no calibrated range that capsim records, so nothing was checked"
    return info


def render(info: StepTimeInfo) -> str:
    """The step-time section's HTML."""
    out = [definition_list(info.facts), "<h3>Fit error</h3>", definition_list(info.fit),
           f"<h3>Extrapolated?</h3><p><strong>{esc(info.extrapolated)}</strong>: {esc(info.verdict)}.</p>"]
    if info.checks:
        out.append(table(["quantity", "calibrated range", "this run", "verdict"], info.checks,
                         "The run's largest shapes against the measured range",
                         row_classes=["bad" if not r[3].startswith("within") else "" for r in info.checks]))
    if info.notes:
        out.append(f"<details><summary>Profile notes</summary><p>{esc(info.notes)}</p></details>")
    return "".join(out)
