"""Fitted profiles shipped with a points CSV: the CSV is there and refitting it gives the shipped models."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibration.logs import FitLogConfig, fit_log
from calibration.points import read_points
from sim.io.profiles import load_fitted, load_hardware, load_model

from .same_fit import assert_same_fit

FITTED = Path(__file__).resolve().parents[2] / "profiles" / "fitted"
WITH_POINTS = [p for p in sorted(FITTED.glob("*.yaml")) if load_fitted(p).provenance.points_csv]


def test_cpu_runs_are_shipped():
    names = {p.name for p in WITH_POINTS}
    assert {"cpu__qwen2.5-0.5b__fp32.yaml", "cpu__qwen2.5-0.5b__bf16.yaml"} <= names


@pytest.mark.parametrize("path", WITH_POINTS, ids=lambda p: p.name)
def test_refit_of_the_points_reproduces_the_profile(path, tmp_path):
    prof = load_fitted(path)
    csv = path.parent / prof.provenance.points_csv
    pts = read_points(csv)
    assert pts.meta["model"] == prof.model and pts.meta["dtype"] == prof.dtype
    assert all(r["status"] in ("ok", "oom") for r in pts.rows)
    res = fit_log(FitLogConfig(log=csv, model=load_model(prof.model), out=tmp_path / "p.yaml", dtype=prof.dtype,
                               hardware=load_hardware(prof.hardware) if prof.hardware else None))
    assert_same_fit(res.profile, prof)
