"""Prefix caching on Mooncake trace slices, checked against a count made from the raw hash_ids.

The count (`infinite_cache_hits` in benchmarks/prefix_cache_sweep.py, which imports nothing from sim)
is what an unbounded cache serves when every request finishes before the next arrives: request r
hits the leading blocks that earlier requests computed, at the scenario's block size (a 512-token
trace block is 32 blocks of 16; a shorter last trace block holds its leading tokens), never its last
prompt token. The simulator must match it exactly when the requests really do run one after another
and the pool never evicts, and can only fall short of it (never exceed it) when they overlap: a
request hits only blocks computed, not merely scheduled, by requests admitted before it.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from sim.io.config import Scenario
from sim.models.spec import ModelSpec
from sim.io.profiles import load_model
from sim.core.simulation import Simulation

REPO = Path(__file__).resolve().parents[2]
TRACE_REL = Path("traces") / "mooncake_fast25" / "conversation_trace.jsonl"
N = 200
BLOCK = 16
KV_PER_TOKEN = ModelSpec(load_model("llama-3.1-8b")).kv_bytes_per_token("bf16")
STEP = {"kind": "linear", "constant_s": 6.44e-3, "per_kv_token_s": 4.37e-8, "per_new_token_s": 27e-6}


def _sweep():
    spec = importlib.util.spec_from_file_location("prefix_cache_sweep", REPO / "benchmarks" / "prefix_cache_sweep.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


sweep = _sweep()


def _write(rows: list[dict], path: Path, sequential: bool) -> Path:
    """A Mooncake JSONL of `rows`. sequential: one request every 1000 s (each finishes well before; checked)
    and at most 4 output tokens (outputs are never shared, and TTFT ends at the first one: only speed)."""
    with open(path, "w") as fh:
        for k, r in enumerate(rows):
            row = dict(r)
            if sequential:
                row.update(timestamp=k * 1_000_000, output_length=min(r["output_length"], 4))
            fh.write(json.dumps(row) + "\n")
    return path


def _scenario(path: Path, budget_tokens: int | None, rows: list[dict], prefix_caching: bool = True) -> Scenario:
    if budget_tokens is None:  # every token of every request: the pool never evicts
        budget_tokens = sum(-(-(r["input_length"] + r["output_length"]) // BLOCK) * BLOCK for r in rows)
    return Scenario.model_validate({
        "name": "prefix-trace", "model": "llama-3.1-8b", "hardware": "h100-sxm",
        "kv": {"block_tokens": BLOCK, "budget": budget_tokens * KV_PER_TOKEN, "admission": "on_demand",
               "prefix_caching": prefix_caching},
        "scheduler": {"kind": "chunked", "max_num_seqs": 128, "max_num_batched_tokens": 8192, "chunk_tokens": 2048},
        "step_time": {"model": dict(STEP)},
        "workload": {"kind": "trace", "path": str(path), "format": "mooncake"},
    })


def _run(path, budget_tokens, rows, prefix_caching=True):
    return Simulation(_scenario(path, budget_tokens, rows, prefix_caching), REPO).run()


def _sequential(res) -> bool:
    q = res.requests
    return bool((q["admitted_s"].to_numpy()[1:] >= q["finish_s"].to_numpy()[:-1]).all())


# ---- the count itself, on a hand-made trace (no shared data needed) -------------------------------

def test_count_matches_simulator_on_partial_trace_blocks(tmp_path):
    rows = [
        {"timestamp": 0, "input_length": 700, "output_length": 4, "hash_ids": [1, 2]},       # last block: 188 tokens
        {"timestamp": 0, "input_length": 1100, "output_length": 4, "hash_ids": [1, 2, 3]},   # block 2 full here
        {"timestamp": 0, "input_length": 512, "output_length": 4, "hash_ids": [1]},          # all cached but its last block
        {"timestamp": 0, "input_length": 700, "output_length": 4, "hash_ids": [1, 2]},       # as the first one
        {"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [9, 2]},       # same id 2, other prefix
    ]
    expected = [0, 32 * 16 + 11 * 16, 31 * 16, 43 * 16, 0]
    assert sweep.infinite_cache_hits(rows, BLOCK) == expected
    res = _run(_write(rows, tmp_path / "t.jsonl", sequential=True), None, rows)
    assert _sequential(res)
    assert res.requests["cached_tokens"].tolist() == expected
    assert res.summary["prefix_hit_tokens"] == sum(expected)


# ---- a slice of the real trace ---------------------------------------------------------------------

@pytest.fixture
def conversations(shared_data) -> list[dict]:
    """The first 200 requests (trace order) of conversations with at least 3 requests in the whole trace,
    conversation = the second hash id (every prompt starts with the same first block), prompts up to
    32k tokens (hashing a prompt's blocks costs blocks x trace blocks in sim.core.kv, so the 100k-token
    prompts would make this test slow). 38 % of their prompt tokens are reusable, many deep in a prompt."""
    rows = sweep.read_rows(shared_data / TRACE_REL)
    second: dict = {}
    for r in rows:
        if len(r["hash_ids"]) > 1:
            second[r["hash_ids"][1]] = second.get(r["hash_ids"][1], 0) + 1
    picked = [r for r in rows if len(r["hash_ids"]) > 1 and second[r["hash_ids"][1]] >= 3
              and r["input_length"] <= 32768][:N]
    assert len(picked) == N
    return picked


def test_sequential_slice_hits_equal_the_count(conversations, tmp_path):
    expected = np.array(sweep.infinite_cache_hits(conversations, BLOCK))
    assert expected.sum() > 0.25 * sum(r["input_length"] for r in conversations)  # a slice with real reuse
    path = _write(conversations, tmp_path / "seq.jsonl", sequential=True)
    on = _run(path, None, conversations)
    assert _sequential(on)
    assert on.summary["evictions"] == 0 and on.summary["completed"] == N
    np.testing.assert_array_equal(on.requests["cached_tokens"].to_numpy(), expected)

    # TTFT: alone on the card, each request computes fewer tokens with caching, so it is never slower
    off = _run(path, None, conversations, prefix_caching=False)
    assert off.summary["prefix_hit_tokens"] == 0 and _sequential(off)
    t_on, t_off = on.requests["ttft_s"].to_numpy(), off.requests["ttft_s"].to_numpy()
    assert (t_on <= t_off + 1e-9).all()
    assert on.summary["ttft_s"]["mean"] < 0.9 * off.summary["ttft_s"]["mean"]

    # LRU keeps the most recently used blocks, so a larger pool caches a superset: hits never fall
    largest = max(r["input_length"] + r["output_length"] for r in conversations)
    hits = [_run(path, tokens, conversations).summary["prefix_hit_tokens"] for tokens in (largest + 4096, 4 * largest)]
    hits.append(int(expected.sum()))
    assert hits == sorted(hits) and hits[0] < hits[-1]


def test_overlapping_slice_hits_never_exceed_the_count(conversations, tmp_path):
    expected = np.array(sweep.infinite_cache_hits(conversations, BLOCK))
    res = _run(_write(conversations, tmp_path / "real.jsonl", sequential=False), None, conversations)
    assert not _sequential(res)  # trace timing: requests overlap (timestamps come in 3 s steps)
    cached = res.requests["cached_tokens"].to_numpy()
    assert (cached <= expected).all()
    assert cached.sum() > 0.5 * expected.sum()
