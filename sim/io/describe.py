"""What a run was: model, card, scheduler, the SLOs behind "SLO attainment", and how good the step-time
model is (its held-out fit error, or why none is known). Written into summary.json as `setup` and
printed by `capsim run`, so that a result is never read without the assumptions it rests on."""

from __future__ import annotations

from pathlib import Path


def step_time_fit(scenario, base_dir: Path) -> dict:
    """summary.json's `setup.step_time_fit`: the step-time model's kind and held-out fit error, or why none is
    known (and, for an ops model, its error on published serving runs of the card)."""
    cfg = scenario.step_time.model
    out = {"kind": cfg.kind, "profile": None, "mape": None, "max_abs_rel_err": None, "n_heldout": None,
           "unknown": None}
    if cfg.kind == "profile":
        from sim.core.step_time_builder import resolve_profile_path
        from sim.io.profiles import load_fitted
        path = resolve_profile_path(cfg.path, base_dir)
        prof = load_fitted(path)
        out["kind"], out["profile"] = f"profile ({cfg.use})", path.name
        if prof.fit is None:
            out["unknown"] = "the profile records no fit: its numbers are not a fit by capsim"
        else:
            out.update(mape=prof.fit.mape, max_abs_rel_err=prof.fit.max_abs_rel_err, n_heldout=prof.fit.n_heldout)
        from sim.io.published_check import card_check, composed_tables, for_serving
        tables = composed_tables(prof)
        if tables is not None:  # fitted to a kernel-table composition: that composition's own check on real runs
            out["composed_from"] = tables
            out["published"] = for_serving(card_check(tables), scenario.disaggregation is not None)
    elif cfg.kind in ("linear", "efficiency"):
        out["unknown"] = "the coefficients are typed into the scenario, not fitted"
    else:
        out["unknown"] = f"an {cfg.kind} model is composed from kernel tables, not fitted"
        if cfg.kind == "ops":  # the end-to-end check on published serving runs of the card whose tables it reads
            from sim.io.published_check import ops_check
            out["published"] = ops_check(cfg, scenario.hardware, base_dir, scenario.disaggregation is not None)[1]
    if scenario.step_time.scale != 1.0:  # step_time.scale: every step time multiplied (absent at 1)
        out["scale"] = scenario.step_time.scale
    return out


def describe_setup(scenario, base_dir: str | Path) -> dict:
    """summary.json's `setup`: model, hardware, scheduler, SLOs and the step-time model's fit error."""
    slo = scenario.slo
    fit = step_time_fit(scenario, Path(base_dir))
    return {"model": scenario.model, "hardware": scenario.hardware, "scheduler": scenario.scheduler.kind,
            "slo": {"ttft_s": slo.ttft_s, "itl_s": slo.itl_s, "itl_stat": slo.itl_stat, "e2e_s": slo.e2e_s},
            "step_time_fit": fit,
            "scenario_sha256": scenario_digest(scenario)}


def scenario_digest(scenario) -> str:
    """sha256 of the validated scenario (after --set, defaults filled in) as JSON: two runs of one digest
    simulated the same scenario text; `capsim report` checks it against the scenario it is given."""
    import hashlib
    # fields added since digests were first recorded count only when set away from their default, so a scenario
    # that does not use them keeps its digest (and an older run's summary still matches it in `capsim report`)
    exclude = {"step_time": {"scale"}} if scenario.step_time.scale == 1.0 else None
    return hashlib.sha256(scenario.model_dump_json(exclude=exclude).encode()).hexdigest()


def slo_text(slo: dict) -> str:
    """'TTFT <= 2 s, E2E <= 20 s', or what attainment means without any SLO."""
    parts = [f"TTFT <= {slo['ttft_s']:g} s" if slo.get("ttft_s") else "",
             f"{'max' if slo.get('itl_stat') == 'max' else 'p99'} ITL <= {slo['itl_s']:g} s" if slo.get("itl_s") else "",
             f"E2E <= {slo['e2e_s']:g} s" if slo.get("e2e_s") else ""]
    parts = [p for p in parts if p]
    return ", ".join(parts) if parts else "no SLO set: every completed, correct request counts"


def kind_text(fit: dict) -> str:
    """'ops', or 'ops, every step x 1.1 (step_time.scale)' when the scenario scales its step times."""
    return fit["kind"] + (f", every step x {fit['scale']:g} (step_time.scale)" if fit.get("scale") is not None else "")


def step_time_line(fit: dict) -> str:
    """'step-time model KIND: fit error ...', the line run and plan print about how far to trust their step times."""
    return f"step-time model {kind_text(fit)}: fit error {fit_text(fit)}"


def fit_text(fit: dict) -> str:
    """'held-out error 4.1% (max 12.3%, 15 points) of profile X' or 'unknown: why'."""
    if fit.get("mape") is None:
        text = f"unknown ({fit.get('unknown')})"
        if fit.get("published"):
            text += "; " + _published_text(fit["published"])
        elif "published" in fit:
            text += "; no published serving runs checked on its tables"
        return text
    where = f" of {fit['profile']}" if fit.get("profile") else ""
    text = (f"held-out error {fit['mape']:.1%} (largest {fit['max_abs_rel_err']:.1%}, {fit['n_heldout']} points)"
            f"{where}")
    if fit.get("composed_from"):
        text += f" against its composition from the {fit['composed_from']} kernel tables, not a measurement; " + (
            _published_text(fit["published"]) if fit.get("published") else "no published serving runs checked on them")
    return text


def _published_text(published: dict) -> str:
    from sim.io.published_check import check_text
    return check_text(published)
