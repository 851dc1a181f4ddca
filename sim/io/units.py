"""Parsing and printing of byte sizes. GiB/MiB/KiB are powers of two, GB/MB/kB powers of ten."""

from __future__ import annotations

import math
import re

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*$")

KiB, MiB, GiB = 2**10, 2**20, 2**30


def parse_bytes(text: str | int | float) -> int:
    """'12GiB' -> 12884901888, '12GB' -> 12000000000, '12884901888' -> 12884901888.

    Raises:
        ValueError: naming the text and the accepted forms.
    """
    if isinstance(text, bool):
        raise ValueError(f"expected a size such as 12GiB, 12GB or 12884901888, got {text!r}")
    if isinstance(text, (int, float)):
        if isinstance(text, float) and not math.isfinite(text):
            raise ValueError(f"a size must be a finite number of bytes, got {text}")
        if text < 0:
            raise ValueError(f"a size must be >= 0, got {text}")
        if text != int(text):
            raise ValueError(f"a size in bytes must be a whole number, got {text}")
        return int(text)
    m = _SIZE.match(str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(
            f"expected a size such as 12GiB, 12GB or 12884901888 "
            f"(units: B, kB, MB, GB, TB, KiB, MiB, GiB, TiB), got {text!r}")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    return int(round(value))


def fmt_bytes(n: float) -> str:
    """Human form in binary units: 6341787648 -> '5.91 GiB'."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"
