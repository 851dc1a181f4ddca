"""The columnar CSV writer writes what pandas' to_csv(index=False) writes, byte for byte."""

import numpy as np
import pandas as pd

from sim.core.csvout import csv_text, write_csv
from tests.sim.helpers import run, scenario


def _frame(n: int, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    f = rng.random(n) * 10.0 ** rng.integers(-12, 20, n)
    f[::7] = np.nan
    f[::11] = 0.0
    f[5] = -0.0
    f[6] = np.inf
    f[8] = 1e16
    f[9] = 1e-5
    return {"a": rng.integers(-5, 10 ** 12, n).astype(np.int64), "f": f,
            "repeated": np.repeat([0.0, 1.5, np.nan, 2.0 ** 60], n // 4), "zeros": np.zeros(n),
            "neg_zeros": np.full(n, -0.0), "flag": rng.random(n) < 0.5,
            "text": np.array(["finished", "rejected", "a,b", 'q"x'], dtype=object)[rng.integers(0, 4, n)],
            "small_ints": rng.integers(0, 3, n), "span_ints": rng.integers(-40, 4000, n),
            "int8": rng.integers(-100, 101, n).astype(np.int8)}  # (v - min overflowed int8: found in review)


def test_every_kind_of_cell_matches_pandas():
    cols = _frame(4000)
    assert csv_text(cols) == pd.DataFrame(cols).to_csv(index=False)
    empty = {c: v[:0] for c, v in cols.items()}
    assert csv_text(empty) == pd.DataFrame(empty).to_csv(index=False)


def test_chunked_file_matches_pandas(tmp_path, monkeypatch):
    import sim.core.csvout as csvout
    monkeypatch.setattr(csvout, "_CHUNK", 700)
    cols = _frame(4000, seed=3)
    write_csv(tmp_path / "x.csv", cols)
    assert (tmp_path / "x.csv").read_text() == pd.DataFrame(cols).to_csv(index=False)


def test_a_run_writes_what_pandas_would(tmp_path):
    res = run(scenario())
    res.write(tmp_path / "out")
    assert (tmp_path / "out" / "requests.csv").read_text() == res.requests.to_csv(index=False)
    assert (tmp_path / "out" / "iterations.csv").read_text() == res.iterations.to_csv(index=False)


def test_orjson_float_cells_are_reprs_text():
    """The orjson path (sim.core.csvout._float_cells_orjson) writes what repr writes, for the magnitudes it formats
    itself and for those it hands back to repr: zeros of both signs, NaN, inf, subnormals, both sides of 1e-4 and
    1e16, and random values over 30 decades."""
    import pytest
    from sim.core import csvout
    if csvout._orjson is None:
        pytest.skip("orjson is not installed: the repr path is the only one")
    rng = np.random.default_rng(7)
    v = np.concatenate([10 ** rng.uniform(-10, 20, 200_000) * rng.choice([1, -1], 200_000),
                        np.round(rng.random(50_000) * 1e4, 3),
                        [0.0, -0.0, np.nan, np.inf, -np.inf, 5e-324, 1e-4, np.nextafter(1e-4, 0), 1e16,
                         np.nextafter(1e16, 0), -1e16, 1.0, 123456789.0, 0.1, 1 / 3]])
    want = ["" if x != x else repr(x) for x in v.tolist()]
    assert csvout._float_cells_orjson(v) == want
    assert csvout.cells(v) == want


def test_without_orjson_the_cells_are_the_same(monkeypatch):
    """Where orjson is not importable, floats go through repr: the same text."""
    from sim.core import csvout
    v = np.random.default_rng(3).random(5_000) * 100
    with_it = csvout.cells(v)
    monkeypatch.setattr(csvout, "_orjson", None)
    assert csvout.cells(v) == with_it == [repr(x) for x in v.tolist()]


def test_rows_assembled_by_numpy_are_pandas_text(monkeypatch):
    """csv_bytes (each column's cells in one string, scattered into rows by numpy) writes pandas' text: every kind of
    cell, one row, an empty chunk, floats only orjson formats (a column of safe magnitudes, one with NaN and
    subnormals), uint64, a text cell holding the separator byte (handed to the row-by-row path), and
    without orjson."""
    import pytest
    from sim.core import csvout
    if csvout._orjson is None:
        pytest.skip("orjson is not installed: csv_bytes encodes csv_text")
    rng = np.random.default_rng(11)
    cols = dict(_frame(3000, seed=5), safe=rng.random(3000) * 1e6, unsigned=rng.integers(0, 2 ** 62, 3000, dtype=np.uint64))
    want = pd.DataFrame(cols).to_csv(index=False)
    assert csvout.csv_bytes(cols).decode() == want
    assert csvout.csv_bytes(cols, 5, 6).decode() == pd.DataFrame(cols).iloc[5:6].to_csv(index=False)
    assert csvout.csv_bytes(cols, 10, 10, header=False) == b""
    assert csvout._column_blob(cols["safe"])[1] == 44 and csvout._column_blob(cols["text"])[1] == csvout._SEP
    odd = dict(cols, text=np.array(["a\x1fb"] * 3000, dtype=object))
    assert csvout._rows_bytes(list(odd.values()), 3000) is None
    assert csvout.csv_bytes(odd).decode() == pd.DataFrame(odd).to_csv(index=False)
    monkeypatch.setattr(csvout, "_orjson", None)
    assert csvout.csv_bytes(cols).decode() == want
