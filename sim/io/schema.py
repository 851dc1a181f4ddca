"""Shared pydantic base and the one YAML loader every profile and scenario goes through."""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from sim.io.errors import ConfigError, format_validation_error

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """Unknown keys are errors; objects are immutable once validated; NaN and infinities are refused.

    Files are validated strictly (`validate_mapping`): `true` is no integer, `2.0` and `'2'` are no
    integers either, so a typo never turns into a silent 1 or a string parsed behind the user's back.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error (PyYAML keeps
    the last one silently). Merge keys (`<<: *anchor`) may still be overridden, as YAML intends."""


def _construct_unique_mapping(loader: _UniqueKeyLoader, node, deep: bool = False):
    seen: dict = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
            continue
        key = loader.construct_object(key_node, deep=deep)
        try:
            first = seen.setdefault(key, key_node)
        except TypeError:  # an unhashable key: PyYAML reports it itself
            continue
        if first is not key_node:  # by node, not by line: `{a: 1, a: 2}` on one line is a duplicate too
            mark = first.start_mark
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark,
                f"duplicate key {key!r} (first given on line {mark.line + 1}, column {mark.column + 1})",
                key_node.start_mark)
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)
# YAML 1.2 floats: PyYAML (YAML 1.1) reads 1e9 and 1.0e9 as strings, since its exponent needs a sign
_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
_UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789"))


class _SafeDumper(yaml.SafeDumper):
    """SafeDumper that quotes the strings parse_yaml would read as floats (a short commit hash such as 7e30589)."""


_SafeDumper.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789"))


def dump_yaml(doc: Any, **kwargs) -> str:
    """yaml.safe_dump's text, which parse_yaml reads back as the same values."""
    return yaml.dump(doc, Dumper=_SafeDumper, **kwargs)


def parse_yaml(text: str, source: str | Path) -> Any:
    """Parse YAML text with unique keys; errors name `source`, the line and column."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}: {where}invalid YAML: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{source}: invalid YAML: nested too deeply") from None


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """Parse a YAML file whose top level must be a mapping."""
    path = Path(path)
    text = read_text_file(path, "a YAML file")
    data = parse_yaml(text, path)
    if not isinstance(data, dict):
        if data is None:
            raise ConfigError(f"{path}: empty (no YAML content); expected a mapping of fields")
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


def read_text_file(path: str | Path, what: str = "a text file") -> str:
    """The UTF-8 text of `path`; a missing, unreadable or binary file is a ConfigError naming it."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, expected {what}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a UTF-8 text file (byte {exc.start}: {raw[exc.start:exc.start + 1]!r}); "
                          f"expected {what}") from None


MAX_MAGNITUDE = 1e15
"""No number in an input file may exceed this in size (1 PB in bytes, 31 million years in seconds):
beyond it a value is a typo (1e30, 2**63) that would overflow or run for ever, never a real setting."""


MAX_REPLICAS = 10_000
"""Most replicas of one deployment or pool: each is simulated with state of its own, so a typo (1e6) would take
gigabytes before the first request; real deployments of one model stop at a few thousand GPUs."""


def _huge_numbers(node, path: tuple = ()) -> list[tuple[str, Any]]:
    if isinstance(node, dict):
        return [hit for k, v in node.items() for hit in _huge_numbers(v, path + (k,))]
    if isinstance(node, list):
        return [hit for i, v in enumerate(node) for hit in _huge_numbers(v, path + (i,))]
    if isinstance(node, (int, float)) and not isinstance(node, bool) and math.isfinite(node) and abs(node) > MAX_MAGNITUDE:
        return [(".".join(str(p) for p in path) or "<root>", node)]
    return []


def validate_mapping(cls: type[M], data: dict[str, Any], source: str | Path) -> M:
    """Validate `data` against `cls`, turning every problem into a `source: field: msg` line."""
    huge = _huge_numbers(data)
    if huge:
        raise ConfigError([f"{source}: {where}: {value!r:.40} is beyond any real setting (numbers in input files "
                           f"must be within +-{MAX_MAGNITUDE:g})" for where, value in huge])
    try:
        return cls.model_validate(data, strict=True, context={"from_file": True})
    except ValidationError as exc:
        lines = format_validation_error(source, exc, data)
        raise ConfigError(_name_the_kinds(cls, data, exc.errors(), lines)) from None


def _name_the_kinds(cls, data: dict, errors: list, lines: list[str]) -> list[str]:
    """pydantic's 'Unable to extract tag using discriminator' (a mapping with no `kind:`) does not say which kinds
    there are: ask again with a kind that cannot exist, whose error lists them."""
    for err in errors:
        if err.get("type") != "union_tag_not_found":
            continue
        loc, key = tuple(err.get("loc", ())), err.get("ctx", {}).get("discriminator", "").strip("'")
        probe = copy.deepcopy(data)
        node = probe
        try:
            for part in loc:
                node = node[part]
            node[key] = "?"
            cls.model_validate(probe, strict=True, context={"from_file": True})
        except ValidationError as again:
            tags = [e["ctx"]["expected_tags"] for e in again.errors()
                    if e.get("type") == "union_tag_invalid" and tuple(e.get("loc", ())) == loc]
            if tags:
                lines = [ln.replace(f"Unable to extract tag using discriminator '{key}'",
                                    f"no {key}: given; expected {key}: one of {tags[0]}") for ln in lines]
        except (KeyError, IndexError, TypeError):
            pass
    return lines


def load_yaml_model(cls: type[M], path: str | Path) -> M:
    """Read a YAML file and validate it strictly against `cls` (errors name file and field)."""
    return validate_mapping(cls, read_yaml_mapping(path), path)
