"""Columnar CSV writing: numpy columns straight to text, byte for byte what pandas' `to_csv(index=False)`
writes for the same DataFrame, without building one.

pandas (2.x and 3.x, no float_format, '.' decimal, minimal quoting) writes a float64 column as
numpy's `astype(str)` (the shortest repr that round-trips, the same text as Python's repr) with NaN
as an empty cell, an int64 column as str(int), a bool column as True / False and an object column of
plain strings as the strings (quoted only when they hold a comma, a quote or a line break), rows
ending in '\\n'. tests/sim/test_csvout.py compares the two on every kind of value.

A column with few distinct values (counts, flags, replica ids) is formatted once per distinct value.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

_CHUNK = 10_000  # rows formatted at once: bounds the strings held in memory (~60 B each)


def _quote(s: str) -> str:
    if any(c in s for c in ',"\n\r'):
        return '"' + s.replace('"', '""') + '"'
    return s


def _repeats(v: np.ndarray) -> bool:
    """Worth formatting distinct values once: a sample of the column holds few distinct values
    (the answer only picks the faster of two ways to the same text)."""
    if len(v) <= 64:
        return False
    sample = v[:: max(1, len(v) // 512)]
    return len(np.unique(sample)) * 4 < len(sample)


def _float_cells(v: np.ndarray) -> list[str]:
    """repr of each float, '' for NaN; distinct values formatted once when they repeat a lot."""
    if _repeats(v) and not np.signbit(v[v == 0]).any():  # unique() would merge -0.0 into 0.0
        u, inv = np.unique(v, return_inverse=True)  # NaNs collapse to one entry (numpy >= 1.21)
        if len(u) * 4 < len(v):
            cells = np.array(["" if x != x else repr(x) for x in u.tolist()], dtype=object)
            return cells[inv.ravel()].tolist()
    if _orjson is not None and len(v) > 64:
        return _float_cells_orjson(v)
    return ["" if x != x else repr(x) for x in v.tolist()]


try:  # optional: formats floats several times faster than repr, with the same text in the range below
    import orjson as _orjson
    _NUMPY = _orjson.OPT_SERIALIZE_NUMPY
except ImportError:  # pragma: no cover - exercised where orjson is absent
    _orjson = _NUMPY = None


def _float_cells_orjson(v: np.ndarray) -> list[str]:
    """The same cells as repr through orjson: its shortest round-trip digits are repr's, and so is its text for
    0 and for 1e-4 <= |x| < 1e16; anything else (NaN, inf, smaller or larger magnitudes) goes through repr."""
    values = v.tolist()
    text = _orjson.dumps(values)[1:-1].decode().split(",")
    a = np.abs(v)
    zero = (v.view(np.uint64) << np.uint64(1)) == 0   # +-0.0 by their bits: a subnormal is no zero here, even
    odd = np.flatnonzero(~(((a >= 1e-4) & (a < 1e16)) | zero))  # where the FPU treats it as one (torch's flush)
    for i in odd.tolist():
        x = values[i]
        text[i] = "" if x != x else repr(x)
    return text


_SPAN = 4096  # an integer column whose values span fewer than this many is formatted from a lookup table


def _int_cells(v: np.ndarray) -> list[str]:
    if len(v) > 64:
        lo, hi = int(v.min()), int(v.max())
        if hi - lo < _SPAN:  # counts, flags, ids of a block: each value's text once, picked by index
            return np.array([str(x) for x in range(lo, hi + 1)], dtype=object)[np.subtract(v, lo, dtype=np.int64)].tolist()
    if _repeats(v):
        u, inv = np.unique(v, return_inverse=True)
        if len(u) * 4 < len(v):
            return np.array([str(x) for x in u.tolist()], dtype=object)[inv.ravel()].tolist()
    return list(map(str, v.tolist()))


_BOOL_CELLS = np.array(["False", "True"], dtype=object)


def cells(v: np.ndarray) -> list[str]:
    """One column's cells as pandas writes them."""
    v = np.asarray(v)
    kind = v.dtype.kind
    if kind == "f":
        return _float_cells(v.astype(np.float64, copy=False))
    if kind in "iu":
        return _int_cells(v)
    if kind == "b":
        return _BOOL_CELLS[v.view(np.uint8)].tolist()
    if kind in "OU":
        text = [str(x) for x in v.tolist()]
        names = {t: _quote(t) for t in set(text)} if len(v) > 64 else None
        if names is not None and len(names) * 4 < len(v):  # a few labels (status): quoted once each
            return [names[t] for t in text]
        return [_quote(t) for t in text]
    raise TypeError(f"cannot write a column of dtype {v.dtype} as CSV")


_SEP = 0x1F  # the unit separator: between a text column's cells while its rows are assembled (never in a cell)


def _column_blob(v: np.ndarray) -> tuple[bytes, int] | None:
    """One column's cells as one bytes string and the byte between them: numbers through orjson's numpy
    serializer (no Python object per cell) where its text is repr's, anything else through `cells`; None
    where no separator byte is free (a text cell holding the unit separator)."""
    v = np.asarray(v)
    if v.dtype.kind in "iu" and not (v.dtype.kind == "u" and v.dtype.itemsize == 8 and len(v) and v.max() >= 2 ** 63):
        return _orjson.dumps(np.ascontiguousarray(v, dtype=np.int64), option=_NUMPY)[1:-1], 44
    if v.dtype.kind == "f":
        f = np.ascontiguousarray(v, dtype=np.float64)
        a = np.abs(f)
        zero = (f.view(np.uint64) << np.uint64(1)) == 0   # as in _float_cells_orjson
        if (((a >= 1e-4) & (a < 1e16)) | zero).all():
            return _orjson.dumps(f, option=_NUMPY)[1:-1], 44
    if v.dtype.kind == "O" and len(v) > 64:  # a few labels (status): each checked and quoted once
        items = v.tolist()
        labels = set(items)
        if len(labels) * 4 < len(items) and all(type(t) is str and "\x1f" not in t for t in labels):
            quoted = {t: _quote(t) for t in labels}
            text = items if all(q == t for t, q in quoted.items()) else [quoted[t] for t in items]
            return "\x1f".join(text).encode(), _SEP
    text = cells(v)
    if v.dtype.kind in "fiub":
        return ",".join(text).encode(), 44
    if any("\x1f" in t for t in text):
        return None
    return "\x1f".join(text).encode(), _SEP


_RAMPS: dict = {}


def _ramp(n: int, dtype) -> np.ndarray:
    """0, 1, ..., at least n - 1 in `dtype` (kept between chunks: read-only)."""
    r = _RAMPS.get(dtype)
    if r is None or len(r) < n:
        r = _RAMPS[dtype] = np.arange(max(n, 1 << 20), dtype=dtype)
        r.flags.writeable = False
    return r


def _rows_bytes(columns: list[np.ndarray], n: int) -> bytes | None:
    """n >= 1 rows of `columns` as CSV bytes: each column's cells in one string (`_column_blob`), their bytes
    scattered into the rows by numpy; None where a column has no free separator."""
    blobs = [_column_blob(c) for c in columns]
    if any(b is None for b in blobs):
        return None
    parts = []
    for blob, sep in blobs:
        arr = np.frombuffer(blob, dtype=np.uint8)
        cuts = np.flatnonzero(arr == sep)  # n - 1 of them: cell r ends where separator r is
        lengths = np.empty(n, dtype=np.int64)
        lengths[:-1], lengths[-1] = cuts, len(arr)
        lengths[1:] -= cuts + 1
        parts.append((arr, cuts, lengths))
    row_len = sum(p[2] for p in parts) + len(parts)
    offset = np.zeros(n, dtype=np.int64)
    np.cumsum(row_len[:-1], out=offset[1:])
    out = np.empty(int(offset[-1] + row_len[-1]), dtype=np.uint8)
    index = np.int32 if len(out) < 2 ** 31 else np.int64  # (half the bytes to move: the index is the cost)
    ramp = _ramp(max(len(p[0]) for p in parts) + 1, index)
    for j, (arr, cuts, lengths) in enumerate(parts):
        # every byte of the column's text to its place: its own position plus its cell's shift (where the cell
        # goes less where it starts in the text), repeated over the cell and the separator after it, which lands
        # on the delimiter after the cell and is written below
        shift = offset.astype(index)
        shift[1:] -= (cuts + 1).astype(index)
        dest = np.repeat(shift, lengths + 1)[:len(arr)]
        dest += ramp[:len(arr)]
        out[dest] = arr
        offset += lengths
        out[offset] = 10 if j == len(parts) - 1 else 44
        offset += 1
    return out.tobytes()


def csv_bytes(columns: dict[str, np.ndarray], start: int = 0, stop: int | None = None, header: bool = True) -> bytes:
    """Rows start..stop of `columns` (all the same length) as UTF-8 CSV, header first when asked: `csv_text`'s
    text, assembled by numpy where orjson is there."""
    names = list(columns)
    stop = len(columns[names[0]]) if (stop is None and names) else (stop or 0)
    head = (",".join(_quote(n) for n in names) + "\n" if header else "").encode()
    if stop <= start:
        return head
    if _orjson is not None and names:
        body = _rows_bytes([columns[n][start:stop] for n in names], stop - start)
        if body is not None:
            return head + body
    return head + _rows_text(columns, names, start, stop).encode()


def _rows_text(columns, names, start: int, stop: int) -> str:
    cols = [cells(columns[n][start:stop]) for n in names]
    return "\n".join(map(",".join, zip(*cols))) + "\n"


def csv_text(columns: dict[str, np.ndarray], start: int = 0, stop: int | None = None, header: bool = True) -> str:
    """Rows start..stop of `columns` (all the same length) as CSV text, header first when asked."""
    names = list(columns)
    stop = len(columns[names[0]]) if (stop is None and names) else (stop or 0)
    head = ",".join(_quote(n) for n in names) + "\n" if header else ""
    if stop <= start:
        return head
    return head + _rows_text(columns, names, start, stop)


def write_csv(path: str | Path, columns: dict[str, np.ndarray]) -> None:
    """Write `columns` (name -> equal-length numpy array) as `path`, in chunks of rows."""
    names = list(columns)
    n = len(columns[names[0]]) if names else 0
    with open(path, "wb") as fh:
        fh.write(csv_bytes(columns, 0, min(n, _CHUNK)))
        for a in range(_CHUNK, n, _CHUNK):
            fh.write(csv_bytes(columns, a, min(n, a + _CHUNK), header=False))


def write_csv_chunks(path: str | Path, names, blocks) -> None:
    """Write the column dicts `blocks` (each name -> equal-length arrays, `names` in order) one after
    another as one CSV file `path`: the same text as write_csv of their concatenation."""
    with open(path, "wb") as fh:
        fh.write(csv_bytes({n: np.empty(0) for n in names}))  # the header
        for block in blocks:
            n = len(block[names[0]]) if names else 0
            for a in range(0, n, _CHUNK):
                fh.write(csv_bytes(block, a, min(n, a + _CHUNK), header=False))
