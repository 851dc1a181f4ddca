"""How far the `ops` step-time model's answers were from real serving runs on a card: per engine and serving
mode, the median and p90 |error| of TTFT, TPOT and E2E (the served rate's) over the published measurements
`capsim validate-published` replays (docs/fidelity.md). An ops model is composed from kernel tables, not fitted, so it has no fit error of
its own; this is the evidence a run on that card's tables can point to instead.

The figures live in profiles/ops/published_check.yaml, written by benchmarks/published_check.py from
validate-published reports (the command and commit are in the file); nothing here computes them.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from pydantic import Field, model_validator

from sim.io.schema import StrictModel, load_yaml_model

CHECK_FILE = "published_check.yaml"
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}


class CheckGroup(StrictModel):
    """One (engine, mode) group of published runs on one card and capsim's error on them."""

    engine: str = Field(description="vllm, sglang or trtllm")
    mode: str = Field(description="agg (one replica) or disagg (prefill and decode pools)")
    runs: int = Field(ge=1, description="published runs predicted (rows skipped with a reason are not counted)")
    ttft_median_abs_error: float = Field(ge=0)
    ttft_p90_abs_error: float = Field(ge=0)
    tpot_median_abs_error: float = Field(ge=0)
    tpot_p90_abs_error: float = Field(ge=0)
    e2e_median_abs_error: float | None = Field(None, ge=0, description=(
        "E2E = TTFT + (OSL - 1) x TPOT, measured and predicted alike: the error of the request rate the benchmark's "
        "closed loop served (absent from a check written before it was reported)"))
    e2e_p90_abs_error: float | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _e2e_paired(self):
        if (self.e2e_median_abs_error is None) != (self.e2e_p90_abs_error is None):
            raise ValueError("e2e_median_abs_error and e2e_p90_abs_error: give both or neither")
        return self


class PublishedCheck(StrictModel):
    """profiles/ops/published_check.yaml."""

    source: str = Field(description="the measurements and the command that replayed them")
    commit: str = Field(description="capsim commit of the replay")
    date: str
    cards: dict[str, list[CheckGroup]] = Field(description="table-set folder under profiles/ops -> its groups")


def check_path() -> Path:
    """profiles/ops/published_check.yaml of this checkout (or of $CAPSIM_PROFILES)."""
    from sim.io.profiles import profiles_dir
    return profiles_dir() / "ops" / CHECK_FILE


@lru_cache(maxsize=4)
def _load(path: str) -> PublishedCheck:
    return load_yaml_model(PublishedCheck, path)


def card_check(tables: str) -> dict | None:
    """The published check of a table set (a folder name under profiles/ops), as summary.json's
    `setup.step_time_fit.published` holds it; None where the file has no entry for it (or is absent)."""
    path = check_path()
    if not path.is_file():
        return None
    check = _load(str(path))
    groups = check.cards.get(tables)
    if not groups:
        return None
    return {"tables": tables, "source": check.source, "commit": check.commit, "date": check.date,
            "groups": [g.model_dump() for g in groups]}


def for_serving(published: dict | None, disaggregated: bool) -> dict | None:
    """The check as a run quotes it: a disaggregated run on a card whose check holds no disaggregated group gets
    `disagg_checked_on`, the cards whose check does (their errors differ from the agg rows', docs/disaggregation.md)."""
    if published is None or not disaggregated or any(g["mode"] == "disagg" for g in published["groups"]):
        return published
    cards = _load(str(check_path())).cards
    checked = sorted(card for card, groups in cards.items() if any(g.mode == "disagg" for g in groups))
    return {**published, "disagg_checked_on": checked}


def ops_check(cfg, hardware: str, base_dir: Path | None = None,
              disaggregated: bool = False) -> tuple[str, dict | None]:
    """An ops step-time config's table set (its `tables`, else the scenario's card) and that set's published
    check (as a run of that serving mode quotes it, for_serving); None for a table folder given as a path, or a set
    the file does not cover. A card given as a YAML path (relative to `base_dir`) reads its profile's name, as the
    ops model does."""
    if cfg.tables is None and hardware.endswith((".yaml", ".yml")):
        from sim.io.errors import ConfigError
        from sim.io.profiles import load_hardware
        path = Path(hardware) if base_dir is None or Path(hardware).is_absolute() else Path(base_dir) / hardware
        try:
            hardware = load_hardware(path).name
        except ConfigError:  # the run itself reports an unreadable card; here it only has no check
            return hardware, None
    tables = cfg.tables or hardware
    if "/" in tables or "\\" in tables:
        return tables, None
    return tables, for_serving(card_check(tables), disaggregated)


_COMPOSED = re.compile(r"^capsim profile compose; kernel tables profiles/ops/([^/:\s]+):")


def composed_tables(profile) -> str | None:
    """The table set a fitted profile was composed from (its `composed_from`, or for a profile written before that
    field its provenance source), None for a profile measured on a device or fitted from an engine's log."""
    if profile.composed_from:
        return profile.composed_from
    found = _COMPOSED.match(profile.provenance.source)
    return found.group(1) if found else None


def check_text(published: dict) -> str:
    """'against published serving runs on h100-sxm, median |error| TTFT / TPOT / E2E: vLLM 20.6% / 6.9% / 5.1% over
    153 runs; ...; docs/fidelity.md' (without E2E for a check written before it was reported)."""
    metrics = ["ttft", "tpot"] + (["e2e"] if all(g.get("e2e_median_abs_error") is not None
                                                 for g in published["groups"]) else [])
    parts = [f"{ENGINE_NAMES.get(g['engine'], g['engine'])}{'' if g['mode'] == 'agg' else ' ' + g['mode']} "
             + " / ".join(f"{g[m + '_median_abs_error']:.1%}" for m in metrics) + f" over {g['runs']:,} runs"
             for g in published["groups"]]
    return (f"against published serving runs on {published['tables']}, median |error| "
            + " / ".join(m.upper() for m in metrics) + ": " + "; ".join(parts) + "; docs/fidelity.md"
            + disagg_note(published))


def disagg_note(published: dict) -> str:
    """'; none of them disaggregated, as this run is (...)' for a check for_serving marked, else ''."""
    cards = published.get("disagg_checked_on")
    if cards is None:
        return ""
    where = f"on {', '.join(cards)} only" if cards else "on no card"
    return (f"; none of them disaggregated, as this run is (disaggregated runs are checked {where}: "
            "docs/disaggregation.md)")
