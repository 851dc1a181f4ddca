"""A sweep folder's manifest (sweep.json): what was swept, so that a resumed sweep is the same sweep: the scenario's
bytes, its --set overrides, the files it names (a trace, a profile) and the grid."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

from sim.io.errors import ConfigError


def sha256_of(path: str | Path) -> str:
    """The SHA-256 of a file's bytes (hex)."""
    with open(path, "rb") as fh:  # in chunks: a trace may be large
        return hashlib.file_digest(fh, "sha256").hexdigest()


def input_files(base, axes: list = ()) -> dict[str, str]:
    """SHA-256 of every file the scenario (with --set) or a --grid value names that exists as given (absolute, or
    relative to the scenario: a trace, a profile, a hardware or model file beside it), by the text that names it: a
    resumed sweep must read the same inputs, not only the same YAML. Not hashed: the repository's own profiles found
    by name (they come with the installed capsim)."""
    from sim.io.config import set_dotted
    data = copy.deepcopy(base.data)
    for key, value in base.overrides:
        set_dotted(data, key, copy.deepcopy(value), base.source)
    found: dict[str, str] = {}

    def walk(node):
        if isinstance(node, dict):
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
        elif isinstance(node, str) and 0 < len(node) < 4096 and ("/" in node or "." in node):
            path = Path(node) if Path(node).is_absolute() else Path(base.base_dir) / node
            try:
                if path.is_file():
                    found[node] = sha256_of(path)
            except OSError:
                pass
    walk(data)
    walk([list(a.values) for a in axes])
    return dict(sorted(found.items()))


def manifest(scenario: str | Path, base, axes: list, n: int) -> dict:
    """sweep.json's content for a sweep of `scenario` (a sweep.Base with its --set) over `axes` (n points)."""
    return {"scenario": str(scenario), "scenario_sha256": sha256_of(scenario), "inputs_sha256": input_files(base, axes),
            "set": [[k, v] for k, v in base.overrides],
            "grid": [{"key": a.key, "values": list(a.values)} for a in axes], "points": n}


def check_manifest(path: Path, new: dict) -> None:
    """Refuse to resume into a folder whose sweep.json (`path`) is not a manifest or another sweep's than `new`."""
    if not path.exists():
        return
    try:
        old = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        old = f"not valid JSON ({getattr(exc, 'msg', exc)}, line {getattr(exc, 'lineno', '?')})"
    if not isinstance(old, dict) or not isinstance(old.get("scenario_sha256"), str):
        why = old if isinstance(old, str) else "not a sweep manifest"
        raise ConfigError(f"{path}: {why}; this folder's sweep cannot be resumed: --fresh to start over, or "
                          "another --out")
    if old.get("scenario_sha256") != new["scenario_sha256"] or old.get("set") != new["set"]:
        raise ConfigError(f"{path.parent}: holds a sweep of another scenario or other --set overrides "
                          f"({old.get('scenario')}); use another --out, or --fresh to start over")
    before = old.get("inputs_sha256")  # absent in a manifest written before the inputs were hashed
    if isinstance(before, dict) and before != new["inputs_sha256"]:
        changed = sorted(k for k in before.keys() | new["inputs_sha256"].keys()
                         if before.get(k) != new["inputs_sha256"].get(k))
        raise ConfigError(f"{path.parent}: its sweep read other inputs ({', '.join(changed)} changed since); use "
                          "another --out, or --fresh to start over")
