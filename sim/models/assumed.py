"""Assumed step-time models shipped under profiles/assumed/: stated inputs, not measurements.

Benchmarks and figures that need *a* plausible step time for speed or relative studies read one of
these files instead of copying constants into code, so every user of the same assumption reads the
same numbers.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from sim.io.errors import ConfigError
from sim.io.profiles import load_hardware, load_model, profiles_dir
from sim.models.spec import ModelSpec

_KEYS = ("model", "hardware", "dtype", "decode_constant_s", "decode_per_kv_token_s", "prefill_mfu", "source")


def assumed_path(name: str) -> Path:
    """profiles/assumed/<name>.yaml."""
    return profiles_dir() / "assumed" / f"{name}.yaml"


def linear_step_time(name: str) -> tuple[dict, str, str]:
    """(the scenario's `step_time.model` mapping, model name, hardware name) of an assumed profile:
    a linear model whose decode terms are given and whose per-token prefill term is
    2 x active parameters / (peak FLOP/s x prefill_mfu)."""
    path = assumed_path(name)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read the assumed step-time profile: {exc}") from None
    missing = [k for k in _KEYS if not isinstance(data, dict) or k not in data]
    if missing:
        raise ConfigError(f"{path}: missing {', '.join(missing)}")
    spec = ModelSpec(load_model(data["model"]))
    peak = load_hardware(data["hardware"]).peak_flops_per_s(data["dtype"])
    model = {"kind": "linear", "constant_s": float(data["decode_constant_s"]),
             "per_kv_token_s": float(data["decode_per_kv_token_s"]),
             "per_new_token_s": 2 * spec.active_params / (peak * float(data["prefill_mfu"]))}
    return model, data["model"], data["hardware"]
