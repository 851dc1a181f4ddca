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


def format_validation_error(source: str | Path, exc) -> list[str]:
    """Turn a pydantic ValidationError into `file: dotted.loc: message (got value)` lines."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ())) or "<root>"
        msg = err.get("msg", "invalid")
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        got = ""
        if ("input" in err and err.get("type") not in ("missing",) and not isinstance(err["input"], dict)
                and "got " not in msg):
            text = repr(err["input"])
            got = f" (got {text if len(text) <= 60 else text[:57] + '...'})"
        lines.append(f"{source}: {loc}: {msg}{got}")
    return lines
