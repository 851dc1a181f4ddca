"""argparse value types that check ranges, so a bad flag is a usage error naming the flag and the value
(`argument --block-size: expected an integer in 1..65,536, got '0'`), never a traceback later."""

from __future__ import annotations

import argparse
import math

from sim.io.units import parse_bytes

MAX_TOKENS = 100_000_000  # sim.io.config.MAX_TOKENS
MAX_BYTES = 10**15  # sim.io.schema.MAX_MAGNITUDE: 1 PB


def count(low: int, high: int = MAX_TOKENS):
    """An integer in [low, high]."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected an integer in {low:,}..{high:,}, got {text!r}")
        return value
    return parse


def number(low: float, high: float, low_open: bool = False, what: str = "a number"):
    """A finite float in [low, high] (or (low, high] with low_open)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        ok = math.isfinite(value) and (value > low if low_open else value >= low) and value <= high
        if not ok:
            raise argparse.ArgumentTypeError(
                f"expected {what} in {'(' if low_open else '['}{low:g}, {high:g}], got {text!r}")
        return value
    return parse


def dask_address(text: str) -> str:
    """A Dask scheduler address: [tcp://]HOST:PORT (or another protocol's URL with a port)."""
    rest = text.split("://", 1)[1] if "://" in text else text
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected tcp://HOST:PORT (e.g. tcp://10.0.0.5:8786), got {text!r}")
    return text


fraction = number(0.0, 1.0, low_open=True, what="a fraction")
positive = number(0.0, 1e15, low_open=True, what="a positive number")


def size(text: str) -> int:
    """A byte size: 12GiB, 12GB or 12884901888, at most 1 PB."""
    try:
        value = parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value > MAX_BYTES:
        raise argparse.ArgumentTypeError(f"expected at most 1 PB, got {text!r}")
    return value


def int_list(text: str) -> list[int]:
    """Comma-separated positive integers such as 1,4,16,64."""
    try:
        values = [int(x) for x in text.split(",")]  # an empty item (`1,,4`) is an error, not dropped
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 1,4,16,64, got {text!r}") from None
    if not values or min(values) < 1 or max(values) > MAX_TOKENS:
        raise argparse.ArgumentTypeError(f"expected integers in 1..{MAX_TOKENS:,}, got {text!r}")
    return values
