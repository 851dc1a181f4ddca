"""requests.csv and iterations.csv streamed from the spill files, a block of rows at a time, are
exactly the tables built whole (sim.core.tables), whatever the block and spill sizes."""

import json

import pandas as pd
import pytest

import sim.core.metrics as metrics
import sim.core.tables as tables
from sim.core.csvout import csv_text
from sim.core.simulation import Simulation
from tests.sim.test_fast_forward import CASES, light_scenario


def _run(case: str):
    return Simulation(light_scenario(CASES[case]), ".").run()


def _files(res, out) -> dict[str, bytes]:
    res.write(out)
    return {f: (out / f).read_bytes() for f in ("summary.json", "requests.csv", "iterations.csv")}


@pytest.mark.parametrize("case", ["continuous", "chunked", "two-replicas-fault", "p99-itl-slo-cancel", "closed-loop"])
def test_streamed_tables_equal_whole_tables(case, tmp_path, monkeypatch):
    whole = _run(case)
    # the whole tables, through pandas as a caller sees them
    req, its = whole.requests, whole.iterations
    assert csv_text({c: req[c].to_numpy() for c in req.columns}) == req.to_csv(index=False)
    expected = {"requests.csv": req.to_csv(index=False).encode(), "iterations.csv": its.to_csv(index=False).encode()}
    # streamed, with tiny blocks and spills: stretches and reordered rows cross every boundary
    monkeypatch.setattr(metrics, "SPILL_VALUES", 97)
    monkeypatch.setattr(tables, "CHUNK_ROWS", 7)
    streamed = _run(case)
    files = _files(streamed, tmp_path / "streamed")
    assert files["requests.csv"] == expected["requests.csv"]
    assert files["iterations.csv"] == expected["iterations.csv"]
    assert json.loads(files["summary.json"]) == json.loads(json.dumps(whole.summary))
    assert streamed.digest() == whole.digest()
    assert len(its) > 0 and len(req) > 0


def test_rows_at_reads_rows_from_the_file_and_the_buffer(monkeypatch):
    """Rows asked in any order (repeats too) come back in that order, across the spill boundary
    and across runs of rows far apart."""
    monkeypatch.setattr(metrics, "SPILL_VALUES", 30)
    s = metrics.Spilled()
    for r in range(52):
        s.buf.extend((r, r + 0.5, -r))
        s.spill_if_full()
    assert 0 < s._spilled < len(s)
    want = [51, 0, 3, 3, 50, 10, 11, 12, 49]
    got = s.rows_at(pd.Series(want).to_numpy(), 3, gap=2)
    assert got[:, 0].tolist() == want
    assert got[:, 1].tolist() == [w + 0.5 for w in want]
    assert got[:, 2].tolist() == [-w for w in want]
    pieces = list(s.chunks(33))  # whole rows (33 is a multiple of the width), at most 33 values each
    assert all(len(c) <= 33 and len(c) % 3 == 0 for c in pieces)
    assert [v for c in pieces for v in c.tolist()] == [float(v) for r in range(52) for v in (r, r + 0.5, -r)]


def test_distinct_weights_equal_numpy_unique():
    """The pooled ITL's distinct gaps and their weights, as np.unique + bincount give them."""
    import numpy as np
    rng = np.random.default_rng(7)
    values = np.round(rng.random(5000), 3)  # many repeats
    weights = rng.integers(1, 300, len(values)).astype(np.int32)
    v, w = metrics._distinct_weights(values, weights)
    u, inverse = np.unique(values, return_inverse=True)
    assert np.array_equal(v, u) and np.array_equal(w, np.bincount(inverse, weights=weights).astype(np.int64))
    assert w.dtype == np.int64


def test_expanded_blocks_stay_near_the_block_size():
    """A block of explicit rows with long fast-forwarded stretches among it is expanded in pieces of
    at most `rows` rows (a single stretch longer than that is one piece), covering every row once
    and in order."""
    at = pd.Series([0, 2, 2, 5, 9, 9]).to_numpy()   # stretch j goes before explicit row at[j]
    k = pd.Series([4, 3, 1, 30, 2, 2]).to_numpy()    # its rows
    pieces = list(metrics._pieces(at, k, 10, 8))
    assert pieces[0][0] == 0 and pieces[-1][1] == 10 and pieces[-1][3] == len(at)
    for (a0, b0, s0, e0), (a1, b1, s1, e1) in zip(pieces, pieces[1:]):
        assert b0 == a1 and e0 == s1  # contiguous: no row or stretch lost or repeated
    for a, b, s, e in pieces:
        size = (b - a) + int(k[s:e].sum())
        assert size <= 8 or (e - s == 1 and k[s] > 8)


@pytest.mark.parametrize("case", ["continuous", "chunked", "two-replicas-fault"])
def test_summary_decode_figures_are_the_iteration_table_s(case, monkeypatch):
    """The summary counts iterations and decode-only seconds and tokens from the timelines without
    expanding the stretches; they are what iterations.csv says."""
    monkeypatch.setattr(metrics, "CHUNK_VALUES", 13 * 5)  # read the explicit rows back 5 at a time
    res = _run(case)
    its = res.iterations
    dec = its[its["prefill_tokens"] == 0]
    assert res.summary["iterations"] == len(its) and len(dec) > 0
    assert res.summary["decode_throughput_tok_s"] == pytest.approx(dec["output_tokens"].sum() / dec["duration_s"].sum(),
                                                                   rel=1e-12)
