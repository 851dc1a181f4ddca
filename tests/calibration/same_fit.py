"""A refitted profile against a shipped one: the same fit, its floats to the last few bits."""

from __future__ import annotations

import pytest


def _same(got, want, where: str) -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), where
        for key in want:
            _same(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            _same(g, w, f"{where}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-9, abs=0.0), where
    else:
        assert got == want, where


def assert_same_fit(got, want) -> None:
    """`got` (a FittedProfile refitted from the same points or log) matches `want`: its coefficients, fit report and
    valid range, floats to 1e-9 relative, everything else exactly. A least-squares solve's final bits follow the
    NumPy / BLAS build (numpy 2.4 moves some coefficients by up to 3e-14 relative), so bit equality would test the
    library, not the fit."""
    for part in ("linear", "efficiency", "fit", "valid_range"):
        g, w = getattr(got, part), getattr(want, part)
        _same(None if g is None else g.model_dump(), None if w is None else w.model_dump(), part)
