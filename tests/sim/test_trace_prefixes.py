"""Trace prefix columns: csv / jsonl rows that say they share a prefix (prefix_id, prefix_tokens)."""

import json

import numpy as np
import pytest

from sim.io.config import Trace
from sim.io.errors import ConfigError
from sim.workloads.workload import build_workload, prefix_stream
from tests.sim.helpers import run, scenario

CSV = """arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens
0.0,600,8,system-a,512
0.5,560,8,system-a,512
1.0,300,8,,
1.5,700,8,system-b,640
2.0,520,8,system-a,512
"""


def _wl(tmp_path, text: str, fmt: str = "csv", name: str = "t.csv"):
    path = tmp_path / name
    path.write_text(text)
    return build_workload(Trace.model_validate({"path": str(path), "format": fmt}), 0, tmp_path)


def test_csv_prefix_columns_make_shared_segments(tmp_path):
    wl = _wl(tmp_path, CSV)
    a = prefix_stream("system-a")
    assert wl.segments_of(0) == ((a, 0, 512), ((0, 0), 0, 88))
    assert wl.segments_of(2) == (((0, 2), 0, 300),)
    assert wl.segments_of(3)[0] == (prefix_stream("system-b"), 0, 640)
    assert a in wl.shared_streams and prefix_stream("system-b") not in wl.shared_streams   # one request only
    assert wl.shareable_tokens(1) == 512 and wl.shareable_tokens(2) == 0
    assert list(wl.prompt_tokens) == [600, 560, 300, 700, 520]


def test_jsonl_prefix_keys_and_no_columns_reads_as_before(tmp_path):
    rows = [{"arrival_s": 0, "prompt_tokens": 100, "output_tokens": 4, "prefix_id": 7, "prefix_tokens": 64},
            {"arrival_s": 1, "prompt_tokens": 64, "output_tokens": 4, "prefix_id": 7, "prefix_tokens": 64},
            {"arrival_s": 2, "prompt_tokens": 80, "output_tokens": 4}]
    wl = _wl(tmp_path, "\n".join(json.dumps(r) for r in rows) + "\n", "jsonl", "t.jsonl")
    assert wl.segments_of(1) == ((prefix_stream("7"), 0, 64),)
    assert wl.segments_of(2) == (((0, 2), 0, 80),)
    plain = _wl(tmp_path, "arrival_s,prompt_tokens,output_tokens\n0,10,2\n1,12,2\n", name="p.csv")
    assert plain.segments is None


@pytest.mark.parametrize("text, message", [
    (CSV.replace("system-b,640", "system-b,701"), "line 5: prefix_tokens (701) exceeds prompt_tokens (700)"),
    (CSV.replace("system-b,640", "system-b,x"), "line 5: prefix_tokens: expected a positive integer"),
    (CSV.replace("1.0,300,8,,", "1.0,300,8,,12"), "line 4: prefix_tokens given without a prefix_id"),
    ("arrival_s,prompt_tokens,output_tokens,prefix_id\n0,10,2,a\n", "line 1: column 'prefix_id' needs its partner"),
])
def test_bad_prefix_columns_name_the_line(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _wl(tmp_path, text)


def test_shared_trace_prefixes_hit_the_cache(tmp_path):
    (tmp_path / "t.csv").write_text(CSV)
    common = {"kv": {"block_tokens": 16, "format": "bf16", "budget": "8GiB", "prefix_caching": True},
              "scheduler": {"kind": "chunked", "max_num_seqs": 8, "max_num_batched_tokens": 2048,
                            "chunk_tokens": 2048}}
    hit = run(scenario(workload={"kind": "trace", "path": str(tmp_path / "t.csv"), "format": "csv"}, **common))
    assert hit.summary["prefix_hit_tokens"] == 2 * 512        # requests 1 and 4 reuse system-a
    assert np.all(hit.requests["cached_tokens"].to_numpy() == [0, 512, 0, 0, 512])
