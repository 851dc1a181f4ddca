"""Shared fixtures: one small end-to-end calibration run on CPU (2-layer tiny model), reused by tests."""

from __future__ import annotations

import io

import pytest

from calibration.shapes import Shape, tiny_model_profile

# a handful of shapes of each kind: enough for a fit with a held-out quarter, quick on 2 cores
TINY_SHAPES = [Shape.parse(k) for k in (
    "1x4@0", "2x4@0", "1x16@0", "2x16@0", "1x16@8", "2x16@8", "1x32@0", "1x32@16",
    "1x1@4", "2x1@4", "4x1@4", "1x1@32", "2x1@32", "4x1@32", "2x1@4+2x1@32", "8x1@64",
    "1x1@16+1x8@0", "2x1@16+1x8@8", "1x1@16+1x16@0", "2x1@16+1x16@8",
)]


def tiny_config(out, **over):
    from calibration.harness import RunConfig
    kw = dict(model=tiny_model_profile(), device="cpu", dtype="fp32", grid="tiny", out=out, shapes=list(TINY_SHAPES),
              matmul_n=128, copy_bytes=1 << 20, repeats=3, warmup=1, threads=1, stream=io.StringIO())
    kw.update(over)
    return RunConfig(**kw)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """(RunConfig, RunResult) of a complete tiny calibration run."""
    pytest.importorskip("torch", reason="the calibration harness needs torch (pip install torch)")
    from calibration.harness import calibrate
    cfg = tiny_config(tmp_path_factory.mktemp("tiny") / "cpu__tiny__fp32.yaml")
    return cfg, calibrate(cfg)
