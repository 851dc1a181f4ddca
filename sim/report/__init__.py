"""Self-contained HTML reports of a run, a capacity plan or a validation (`capsim report`, `--report`).

One `report.html` per output folder: inline CSS, figures as SVG data URIs, no script and no network
reference, tables as real <table> with units; readable offline and when sent on. Every headline
number carries the summary key it shows (see sim.report.html).
"""

from __future__ import annotations

from pathlib import Path

from sim.report.inputs import REPORT_FILE, SCENARIO_FILE, ScenarioInfo, load_run, record_scenario, scenario_info

__all__ = ["REPORT_FILE", "SCENARIO_FILE", "ScenarioInfo", "record_scenario", "scenario_info", "folder_kind",
           "write_run_report", "write_plan_report", "write_layouts_report", "write_validation_report", "report_info",
           "write_report"]


def folder_kind(out_dir: str | Path) -> str:
    """'run', 'plan' or 'validation': which command wrote the folder (by the file it leaves)."""
    from sim.io.errors import ConfigError
    d = Path(out_dir)
    if not d.is_dir():
        raise ConfigError(f"{d}: not a folder (expected the --out folder of capsim run, plan or validate)")
    for name, kind in (("validation.json", "validation"), ("plan.json", "plan"), ("layouts.json", "layouts"),
                       ("summary.json", "run")):
        if (d / name).exists():
            return kind
    raise ConfigError(f"{d}: no summary.json, plan.json, layouts.json or validation.json: not an output folder of "
                      "capsim run, plan (with or without --gpus) or validate")


def _write(page, out_dir: Path) -> Path:
    path = Path(out_dir) / REPORT_FILE
    path.write_text(page.render(), encoding="utf-8")
    return path


def write_run_report(out_dir: str | Path, info: ScenarioInfo) -> Path:
    """OUT_DIR/report.html for the run whose outputs are in OUT_DIR."""
    from sim.report.run import run_page
    return _write(run_page(info, load_run(out_dir)), Path(out_dir))


def write_plan_report(out_dir: str | Path, info: ScenarioInfo) -> Path:
    """OUT_DIR/report.html for the capacity plan in OUT_DIR (simulates the scenario once at the capacity)."""
    from sim.report.plan import plan_page
    return _write(plan_page(Path(out_dir), info), Path(out_dir))


def write_layouts_report(out_dir: str | Path, shown: str | Path | None = None) -> Path:
    """OUT_DIR/report.html for the layout plan (`capsim plan --gpus`) in OUT_DIR, drawn from its layouts.json
    (`shown`: the folder's name on the page, when OUT_DIR is a staging folder)."""
    from sim.report.layouts import layouts_page
    return _write(layouts_page(Path(out_dir), shown), Path(out_dir))


def write_validation_report(out_dir: str | Path, info: ScenarioInfo) -> Path:
    """OUT_DIR/report.html for the validation in OUT_DIR."""
    from sim.report.validation import validation_page
    return _write(validation_page(Path(out_dir), info), Path(out_dir))


COMMANDS = {"run": "capsim run", "plan": "capsim plan", "validation": "capsim validate"}


def report_info(out_dir: str | Path, kind: str, scenario_path: str | None = None,
                overrides: list[str] | None = None) -> ScenarioInfo:
    """The scenario of an output folder: --scenario FILE (with --set) when given, else the folder's
    scenario.json, else (validations) the scenario file and overrides validation.json records."""
    from sim.io.errors import ConfigError
    from sim.report.inputs import read_json
    out = Path(out_dir)
    if scenario_path is None and kind == "validation" and not (out / SCENARIO_FILE).exists():
        v = read_json(out / "validation.json")
        if not Path(v.get("scenario_path", "")).exists():
            raise ConfigError(f"{out / 'validation.json'}: scenario_path: {v.get('scenario_path')!r} not found; "
                              "give --scenario FILE")
        scenario_path, overrides = v["scenario_path"], list(v.get("overrides", []))
    info = scenario_info(out, scenario_path, list(overrides or []), COMMANDS[kind])
    if kind == "run":
        summary = read_json(out / "summary.json")
        have = (summary.get("scenario"), summary.get("seed"))
        if have != (info.scenario.name, info.scenario.seed):
            raise ConfigError(f"{out / 'summary.json'}: scenario {have[0]!r} seed {have[1]} was run, but the scenario "
                              f"given is {info.scenario.name!r} seed {info.scenario.seed}")
        _same_setup(out / "summary.json", summary.get("setup"), info)
    return info


STEP_TIME_IDENTITY = ("kind", "profile", "scale")
"""The keys of setup.step_time_fit that say which step-time model ran (the others describe how good it is)."""


def _same_setup(path: Path, have: dict | None, info: ScenarioInfo) -> None:
    """Refuse a scenario of the same name and seed whose model, hardware, scheduler, SLOs or step-time
    model differ from what summary.json's `setup` says was run (folders written before `setup` pass)."""
    import json

    from sim.io.describe import describe_setup
    from sim.io.errors import ConfigError
    if not isinstance(have, dict):
        return
    given = json.loads(json.dumps(describe_setup(info.scenario, info.base_dir)))
    if "scenario_sha256" not in have:   # written before the digest was recorded
        given.pop("scenario_sha256")
    # which step-time model ran, not what capsim says of it: the wording, a profile's fit and the published check
    # (a shipped file that is re-measured) may differ between the capsim that ran and this one
    have, given = dict(have), dict(given)
    for d in (have, given):
        if isinstance(d.get("step_time_fit"), dict):
            d["step_time_fit"] = {k: d["step_time_fit"].get(k) for k in STEP_TIME_IDENTITY}
    differ = sorted((k for k in set(have) | set(given) if have.get(k) != given.get(k)),
                    key=lambda k: (k == "scenario_sha256", k))   # a named field first, the digest last
    if differ == ["scenario_sha256"]:
        raise ConfigError(f"{path}: the scenario given is not the one run (setup.scenario_sha256 differs: another "
                          "value of some field, e.g. a step-time coefficient, or another capsim version); give the "
                          "scenario and --set overrides the run used")
    if differ:
        k = differ[0]
        raise ConfigError(f"{path}: setup.{k} is {have.get(k)!r} in the run, but the scenario given has "
                          f"{given.get(k)!r}" + (f" (also differs: {', '.join(differ[1:])})" if differ[1:] else "")
                          + "; give the scenario and --set overrides the run used")


def write_report(out_dir: str | Path, info: ScenarioInfo | None = None, scenario_path: str | None = None,
                 overrides: list[str] | None = None) -> Path:
    """Write OUT_DIR/report.html for whatever OUT_DIR holds (a run, a plan, a layout plan or a validation)."""
    kind = folder_kind(out_dir)
    if kind == "layouts":  # drawn from layouts.json alone: no scenario to load
        from sim.io.errors import ConfigError
        if scenario_path is not None or overrides:
            raise ConfigError(f"{out_dir}: a layout plan's report is drawn from its layouts.json alone; "
                              "--scenario and --set do not apply")
        return write_layouts_report(out_dir)
    info = info or report_info(out_dir, kind, scenario_path, overrides)
    writer = {"run": write_run_report, "plan": write_plan_report, "validation": write_validation_report}[kind]
    return writer(out_dir, info)
