"""Errors that reach the user: each names the file, the field and what was expected."""

from __future__ import annotations

from pathlib import Path


class ConfigError(ValueError):
    """A bad input file, field or command-line value.

    `lines` holds one message per problem so that `validate-*` commands can print every
    error of every file at once; `str()` joins them.
    """

    def __init__(self, lines: list[str] | str):
        self.lines = [lines] if isinstance(lines, str) else list(lines)
        super().__init__("\n".join(self.lines))

    def in_file(self, source: str | Path, field: str | None = None) -> "ConfigError":
        """The same problems, each line prefixed with `source: ` (and `field: `) unless it already
        starts with `source`: errors raised deep inside (`kv.budget: ...`) then name their file."""
        head = f"{source}: " + (f"{field}: " if field else "")
        return ConfigError([line if line.startswith(f"{source}: ") else head + line for line in self.lines])


class FieldValueError(ValueError):
    """A check across a model's fields (a pydantic model validator) whose problem lies in one of them: raised with
    that field's name, it is reported at `model.field` rather than at the model (format_validation_error)."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


_TYPE_ERRORS = {"int_type", "int_parsing", "float_type", "float_parsing", "string_type", "bool_type", "list_type",
                "tuple_type", "dict_type", "model_type", "model_attributes_type", "none_required", "is_instance_of",
                "int_from_float", "literal_error"}


def _yaml_path(loc: tuple, data, missing: bool = False) -> tuple[list[str], int | None, object]:
    """The YAML path of a pydantic error location (as `--set` takes it), without the union variant tags
    pydantic inserts (`scheduler.chunked.x` -> `scheduler.x`, `kv.budget.int` -> `kv.budget`).

    Returns the path, the index in `loc` of the first variant tag (None if none) and the input found
    at the path's end."""
    parts, first_tag, node = [], None, data
    for i, key in enumerate(loc):
        if isinstance(node, dict) and key in node:
            parts.append(str(key))
            node = node[key]
        elif isinstance(node, (list, tuple)) and isinstance(key, int) and -len(node) <= key < len(node):
            parts.append(str(key))
            node = node[key]
        elif missing and i == len(loc) - 1:
            parts.append(str(key))  # a missing key: name it
            node = None
        elif first_tag is None:
            first_tag = i
    return parts, first_tag, node


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def format_validation_error(source: str | Path, exc, data=None) -> list[str]:
    """Turn a pydantic ValidationError into `file: yaml.path: message (got value)` lines.

    With the validated `data`, paths are the file's own (usable by `--set`): union variant tags are
    dropped, and where one branch of a union got past the type check, the other branches' bare type
    mismatches (`kv.budget: Input should be a valid integer` for a mapping) are not reported."""
    errors = list(exc.errors())
    located = []
    for err in errors:
        loc = tuple(err.get("loc", ()))
        if data is None:
            parts, tag, node = [str(p) for p in loc], None, err.get("input")
        else:
            parts, tag, node = _yaml_path(loc, data, err.get("type") == "missing")
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, FieldValueError):  # a model-level check that names its field
            parts = [*parts, cause.field]
        located.append((err, parts, tag, loc))
    # union branches: drop pure type mismatches at a union when another branch got further
    deeper: dict[tuple, set] = {}
    for err, _, tag, loc in located:
        if tag is not None and err.get("type") not in _TYPE_ERRORS:
            deeper.setdefault(tuple(loc[:tag]), set()).add(loc[tag])
    lines = []
    for err, parts, tag, loc in located:
        if tag is not None and err.get("type") in _TYPE_ERRORS and deeper.get(tuple(loc[:tag]), set()) - {loc[tag]}:
            continue
        where = ".".join(parts) or "<root>"
        msg = err.get("msg", "invalid")
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        got = ""
        value = err.get("input")
        if ("input" in err and err.get("type") != "missing" and "got " not in msg
                and (not isinstance(value, dict) or err.get("type") in _TYPE_ERRORS)):
            got = f" (got {_short(value)})"
        line = f"{source}: {where}: {msg}{got}"
        if line not in lines:
            lines.append(line)
    return lines
