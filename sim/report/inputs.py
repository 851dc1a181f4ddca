"""What a report reads: an output folder's tables and the scenario that produced them.

summary.json records the scenario's name, not its file, so `--report` writes `scenario.json` next to
the outputs (the validated scenario, its source file and the --set overrides); `capsim report OUT_DIR`
reads it back, or takes `--scenario FILE` for folders written without `--report`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sim.io.errors import ConfigError

SCENARIO_FILE = "scenario.json"
REPORT_FILE = "report.html"


@dataclass
class ScenarioInfo:
    """A validated scenario, the directory its relative paths resolve against, its file and overrides."""

    scenario: object
    base_dir: Path
    source: str
    overrides: list[str]


def record_scenario(out_dir: str | Path, source: str | Path, overrides: list[str]) -> ScenarioInfo:
    """Write OUT_DIR/scenario.json: the scenario as validated (after --set), so the folder can be reported later."""
    from sim.io.config import load_scenario
    scenario, base = load_scenario(source, overrides)
    info = ScenarioInfo(scenario, base, str(Path(source).resolve()), list(overrides))
    path = Path(out_dir) / SCENARIO_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"source": info.source, "base_dir": str(base), "overrides": info.overrides,
            "scenario": scenario.model_dump(mode="json")}
    path.write_text(json.dumps(data, indent=1) + "\n")
    return info


def record_overrides(out_dir: str | Path, info: ScenarioInfo, extra: list[str]) -> ScenarioInfo:
    """Record `info`'s scenario with more --set overrides (e.g. the rate a plan found) in OUT_DIR/scenario.json."""
    return record_scenario(out_dir, info.source, [*info.overrides, *extra])


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: not found") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: line {exc.lineno}: not valid JSON ({exc.msg})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a UTF-8 text file") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return data


def load_recorded(out_dir: Path) -> ScenarioInfo | None:
    """The scenario recorded in OUT_DIR/scenario.json, or None when the folder has none."""
    from sim.io.config import Scenario
    from sim.io.schema import validate_mapping
    path = out_dir / SCENARIO_FILE
    if not path.exists():
        return None
    data = _read_json(path)
    for key in ("source", "base_dir", "overrides", "scenario"):
        if key not in data:
            raise ConfigError(f"{path}: {key}: missing (expected the file `--report` writes)")
    scenario = validate_mapping(Scenario, data["scenario"], path)
    return ScenarioInfo(scenario, Path(data["base_dir"]), data["source"], list(data["overrides"]))


def scenario_info(out_dir: Path, scenario_path: str | None, overrides: list[str], what: str) -> ScenarioInfo:
    """--scenario FILE (with --set) when given, else the folder's scenario.json; a clear error otherwise."""
    from sim.io.config import load_scenario
    if scenario_path:
        scenario, base = load_scenario(scenario_path, overrides)
        return ScenarioInfo(scenario, base, str(Path(scenario_path).resolve()), list(overrides))
    info = load_recorded(out_dir)
    if info is None:
        raise ConfigError(f"{out_dir}: no {SCENARIO_FILE} (written by `{what} --report`): give --scenario FILE "
                          "(and the --set overrides of the run) to say which scenario produced this folder")
    return info


def read_table(path: Path, columns: tuple[str, ...], complete: tuple[str, ...] = ()) -> pd.DataFrame:
    """A CSV the simulator wrote, with the columns the report needs and a value in every row of `complete`
    (a clear error otherwise)."""
    try:
        df = pd.read_csv(path)
    except FileNotFoundError:
        raise ConfigError(f"{path}: not found") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not a readable CSV ({str(exc).splitlines()[0]})") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ConfigError(f"{path}: missing column(s) {', '.join(missing)}")
    empty = df[[c for c in complete if c in df.columns]].isna()
    if empty.to_numpy().any():  # a row cut short (a truncated or damaged file): name its line
        row = int(empty.any(axis=1).to_numpy().argmax())
        cols = [c for c in empty.columns if empty[c].iloc[row]]
        raise ConfigError(f"{path}: line {row + 2}: no value in {', '.join(cols)} (a truncated or damaged file?)")
    return df


REQUEST_NEEDS = ("id", "status", "arrival_s", "ttft_s", "tpot_s", "max_itl_s", "e2e_s", "prompt_tokens",
                 "output_tokens", "met_slo")
REQUEST_COMPLETE = ("id", "status", "arrival_s", "prompt_tokens", "output_tokens", "met_slo")
"""Columns every request row has a value in (the others are empty where they do not apply: no TTFT when rejected)."""
ITERATION_NEEDS = ("replica", "start_s", "duration_s", "batch_size", "new_tokens", "prefill_tokens",
                   "decode_sequences", "kv_blocks_in_use")
SUMMARY_NEEDS = ("scenario", "requests", "completed", "good", "makespan_s", "ttft_s", "tpot_s", "itl_s", "e2e_s",
                 "kv_capacity_bytes", "kv_capacity_blocks", "memory_fit")
SHOWN_NEEDS = ("kv_budget_bytes", "weights_bytes", "peak_kv_bytes", "output_throughput_tok_s",
               "request_throughput_rps", "goodput_rps", "slo_attainment")
"""Keys a run's report sections read besides SUMMARY_NEEDS (an engine's measured summary need not have them)."""
STATS = ("mean", "median", "p90", "p99", "max")

NUMBER, POSITIVE, FLAG = "a number", "a number above 0", "true or false"
LATENCY = f"a mapping of {', '.join(STATS)} to numbers or null"
SUMMARY_FIELDS = {
    **dict.fromkeys(("requests", "completed", "good", "makespan_s", "kv_budget_bytes", "weights_bytes",
                     "peak_kv_bytes", "kv_need_bytes", "rejected", "cancelled", "failed", "replicas", "iterations",
                     "kv_limited_requests", "kv_rejected_requests", "preemptions", "recomputed_tokens"),
                    (NUMBER, False)),
    **dict.fromkeys(("kv_capacity_bytes", "kv_capacity_blocks"), (POSITIVE, False)),
    **dict.fromkeys(("output_throughput_tok_s", "request_throughput_rps", "goodput_rps", "slo_attainment",
                     "gpu_seconds_per_good", "energy_j", "energy_j_per_good"), (NUMBER, True)),
    **dict.fromkeys(("memory_fit", "card_fit"), (FLAG, False)),
    **dict.fromkeys(("ttft_s", "itl_s", "tpot_s", "e2e_s"), (LATENCY, False)),
}
"""summary.json's fields the report reads: (what each must be, whether null is allowed: a run writes null
where there is nothing to divide by, e.g. no throughput over an empty window)."""


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


CHECKS = {NUMBER: _is_number, POSITIVE: lambda v: _is_number(v) and v > 0, FLAG: lambda v: isinstance(v, bool),
          LATENCY: lambda v: isinstance(v, dict)}


def _got(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_summary(path: Path, summary: dict, measured: bool = False) -> None:
    """Refuse a summary.json field the report reads that is not what `capsim run` writes (a hand-edited or
    damaged file), naming the field; `measured`: an engine's summary, where any field may be null."""
    for field, (kind, nullable) in SUMMARY_FIELDS.items():
        value = summary.get(field)
        if field not in summary or (value is None and (nullable or measured)):
            continue
        if not CHECKS[kind](value):
            raise ConfigError(f"{path}: field {field!r}: expected {kind}{' or null' if nullable else ''}, "
                              f"got {_got(value)}")
        for stat in STATS if kind == LATENCY else ():
            if value.get(stat) is not None and not _is_number(value[stat]):
                raise ConfigError(f"{path}: field '{field}.{stat}': expected a number or null, "
                                  f"got {_got(value[stat])}")


@dataclass
class RunData:
    """One simulated run: summary.json, requests.csv and iterations.csv of a folder."""

    folder: Path
    summary: dict
    requests: pd.DataFrame
    iterations: pd.DataFrame


def load_run(folder: str | Path, measured: bool = False) -> RunData:
    """Read a run's three output files, checking that they are what `capsim run --out` writes (`measured`:
    the measured side of a validation, whose summary only needs SUMMARY_NEEDS and may hold nulls)."""
    folder = Path(folder)
    summary = _read_json(folder / "summary.json")
    missing = [k for k in SUMMARY_NEEDS + (() if measured else SHOWN_NEEDS) if k not in summary]
    if missing:
        raise ConfigError(f"{folder / 'summary.json'}: missing key(s) {', '.join(missing)} "
                          "(expected the summary `capsim run --out` writes)")
    check_summary(folder / "summary.json", summary, measured)
    run = RunData(folder, summary, read_table(folder / "requests.csv", REQUEST_NEEDS, REQUEST_COMPLETE),
                  read_table(folder / "iterations.csv", ITERATION_NEEDS, ITERATION_NEEDS))
    for name, table, key in (("requests.csv", run.requests, "requests"), ("iterations.csv", run.iterations,
                                                                          "iterations")):
        said = summary.get(key)
        if isinstance(said, int) and not isinstance(said, bool) and len(table) != said:
            raise ConfigError(f"{folder / name}: {len(table):,} rows, but summary.json says {said:,} {key} (a file cut "
                              "short, or files of two runs)")
    return run


def read_json(path: Path) -> dict:
    """A JSON object from a file, with errors naming the file and line."""
    return _read_json(path)
