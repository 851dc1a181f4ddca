"""Builds the step-time model a scenario asks for: inline linear/efficiency, or a fitted profile."""

from __future__ import annotations

from pathlib import Path

from sim.io.config import EfficiencyStepTime, LinearStepTime, OpsStepTime, ProfileStepTime, Scenario
from sim.io.errors import ConfigError
from sim.io.profiles import load_fitted, profiles_dir
from sim.models import step_time as costmod
from sim.models.spec import ModelSpec


def resolve_profile_path(text: str, base_dir: Path) -> Path:
    """A fitted profile named in a scenario: as given, next to the scenario, or under profiles/fitted."""
    p = Path(text)
    if p.is_absolute():
        return p
    for cand in (base_dir / p, profiles_dir() / "fitted" / p, profiles_dir().parent / p):
        if cand.exists():
            return cand
    raise ConfigError(f"step_time.model.path: fitted profile {text!r} not found next to the scenario "
                      f"or under {profiles_dir() / 'fitted'}")


def _check_profile_layout(stated, scenario: Scenario, spec: ModelSpec, path: Path) -> None:
    """A profile that says its layout runs only a replica of that layout."""
    from sim.core.sizing import replica_layout
    lay = replica_layout(scenario, spec)
    have = {"tp": lay.tp, "pp": lay.pp, "ep": lay.ep}
    want = stated.model_dump()
    if have != want:
        fmt = lambda d: ", ".join(f"{k} {v}" for k, v in d.items())  # noqa: E731
        raise ConfigError(f"{path}: parallel: the profile's times are for a replica of {fmt(want)}; the scenario's "
                          f"replica is {fmt(have)} (parallel); compose or fit a profile for that layout, or set "
                          f"parallel to {want}")


_DTYPE_CLASS = {"bf16": "16-bit", "fp16": "16-bit", "fp32": "fp32", "fp8": "fp8", "nvfp4": "nvfp4"}
"""Weight formats whose step times are alike (BF16 and FP16 read and multiply the same bytes)."""


def build_step_time(scenario: Scenario, base_dir: Path, spec: ModelSpec, hw, stream=None):
    """The scenario's step-time model (inline, or from a fitted profile), wrapped for graphs, valid range and scale."""
    st = scenario.step_time
    cfg = st.model
    valid = source = None
    if isinstance(cfg, ProfileStepTime):
        path = resolve_profile_path(cfg.path, base_dir)
        prof = load_fitted(path)
        if prof.model not in (scenario.model, spec.profile.name):  # a name, or a model YAML path naming it
            raise ConfigError(f"{path}: model: profile is for {prof.model!r} but the scenario runs {scenario.model!r}")
        if prof.hardware is not None and prof.hardware not in (scenario.hardware, hw.name):
            raise ConfigError(f"{path}: hardware: the profile was measured on {prof.hardware!r} but the scenario's "
                              f"hardware is {scenario.hardware!r}; fit or compose a profile on that card "
                              f"(`capsim profile compose`, `capsim calibrate`, `capsim fit`), or set hardware: "
                              f"{prof.hardware}")
        if _DTYPE_CLASS.get(prof.dtype) != _DTYPE_CLASS.get(scenario.weight_format):
            raise ConfigError(f"{path}: dtype: the profile was measured with {prof.dtype} weights but the scenario's "
                              f"weight_format is {scenario.weight_format!r}; use a profile measured in that format, "
                              f"or set weight_format: {prof.dtype}")
        if prof.parallel is not None:
            _check_profile_layout(prof.parallel, scenario, spec, path)
        inner = getattr(prof, cfg.use)
        if inner is None:
            raise ConfigError(f"{path}: {cfg.use}: this profile has no {cfg.use} model "
                              f"(step_time.model.use: {cfg.use})")
        cfg, valid, source = inner, prof.valid_range, path
    if isinstance(cfg, LinearStepTime):
        model = costmod.LinearModel(cfg)
    elif isinstance(cfg, EfficiencyStepTime):
        if getattr(scenario, "parallel", None) is not None and scenario.parallel.gpus > 1:
            raise ConfigError("step_time.model: kind efficiency models one GPU's roofline; a replica over "
                              f"{scenario.parallel.gpus} GPUs (parallel) needs kind ops, or a profile / linear model "
                              "measured on that layout (allowed kinds: ops, profile, linear)")
        model = costmod.EfficiencyModel(cfg, spec, spec.weight_read_bytes(scenario.weight_format),
                                        spec.kv_bytes_per_token(scenario.kv.format),
                                        hw.peak_flops_per_s(scenario.weight_format if scenario.weight_format in
                                                            ("fp8", "nvfp4") else "bf16"),
                                        st.allow_extrapolation)
    elif isinstance(cfg, OpsStepTime):
        from sim.core.sizing import replica_layout
        from sim.models.parallel_ops import build_replica_ops_model
        model = build_replica_ops_model(cfg, spec, hw, replica_layout(scenario, spec), scenario.weight_format,
                                        scenario.kv.format, st.allow_extrapolation, stream)
    else:
        raise AssertionError(cfg)
    if st.graph_sizes:
        model = costmod.GraphPadded(model, st.graph_sizes)
    if valid is not None:
        model = costmod.RangeChecked(model, valid, source, st.allow_extrapolation, stream)
    if st.scale != 1.0:
        model = costmod.Scaled(model, st.scale)
    return model
