"""Workloads: synthetic generators, trace readers on the real public traces, malformed rows."""

import numpy as np
import pytest

from sim.io.config import Synthetic, Trace
from sim.io.errors import ConfigError
from sim.workloads.traces import read_trace
from sim.workloads.workload import build_workload
from tests.sim.helpers import run, scenario


def synth(arrival, n=20000, prompt=None, output=None):
    return Synthetic.model_validate({"num_requests": n, "arrival": arrival,
                                     "prompt_tokens": prompt or {"kind": "fixed", "value": 10},
                                     "output_tokens": output or {"kind": "fixed", "value": 5}})


def test_poisson_and_gamma_rates():
    for arrival in ({"kind": "poisson", "rate_rps": 4.0}, {"kind": "gamma", "rate_rps": 4.0, "burstiness": 0.5}):
        wl = build_workload(synth(arrival), 1, ".")
        gaps = np.diff(wl.arrival_s)
        assert gaps.mean() == pytest.approx(0.25, rel=0.03)
        cv = gaps.std() / gaps.mean()
        # Poisson: CV 1; gamma with shape k: CV 1/sqrt(k) = 1.41 for burstiness 0.5
        assert cv == pytest.approx(1.0 if arrival["kind"] == "poisson" else 2 ** 0.5, rel=0.05)


def test_constant_and_all_at_once():
    wl = build_workload(synth({"kind": "constant", "rate_rps": 2.0}, n=5), 0, ".")
    assert wl.arrival_s.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert build_workload(synth({"kind": "all_at_once"}, n=3), 0, ".").arrival_s.tolist() == [0.0, 0.0, 0.0]


def test_length_distributions_and_seed_independence(tmp_path):
    csv = tmp_path / "lens.csv"
    csv.write_text("n\n7\n9\n11\n")
    cfg = synth({"kind": "poisson", "rate_rps": 1.0}, n=3000,
                prompt={"kind": "lognormal", "median": 500, "sigma": 0.5, "max": 4000},
                output={"kind": "empirical", "path": "lens.csv", "column": "n"})
    wl = build_workload(cfg, 5, tmp_path)
    assert np.median(wl.prompt_tokens) == pytest.approx(500, rel=0.05)
    assert set(wl.output_tokens.tolist()) == {7, 9, 11}
    # one generator per source: changing the output distribution leaves arrivals and prompts alone
    cfg2 = synth({"kind": "poisson", "rate_rps": 1.0}, n=3000,
                 prompt={"kind": "lognormal", "median": 500, "sigma": 0.5, "max": 4000},
                 output={"kind": "uniform", "low": 1, "high": 3})
    wl2 = build_workload(cfg2, 5, tmp_path)
    assert np.array_equal(wl.arrival_s, wl2.arrival_s) and np.array_equal(wl.prompt_tokens, wl2.prompt_tokens)


@pytest.mark.parametrize("text, expected", [
    ("n\n7\nabc\n", r"lens.csv: line 3, column 'n': expected a whole number of tokens, 1 to 100,000,000, got 'abc'"),
    ("n\n7\n\n\n1e20\n", r"lens.csv: line 5, column 'n': .* got '1e20'"),  # blank lines counted
    ("n\n100.5\n", r"line 2, column 'n': .* got '100.5'"),
    ("n\n200000000\n", r"line 2, column 'n': .* got '200000000'"),
    ("n\n0\n", r"line 2, column 'n': .* got '0'"),
    ("n\n", r"lens.csv column 'n' has no values"),
    ("m\n5\n", r"workload.output_tokens.column: 'n' is not a column of .*lens.csv \(it has: 'm'\)"),
])
def test_empirical_lengths_name_the_bad_line(tmp_path, text, expected):
    """Text had raised a TypeError, 1e20 and inf had become -9223372036854775808 tokens, 100.5 had been cut to 100."""
    (tmp_path / "lens.csv").write_text(text)
    cfg = synth({"kind": "poisson", "rate_rps": 1.0}, n=10, output={"kind": "empirical", "path": "lens.csv",
                                                                    "column": "n"})
    with pytest.raises(ConfigError, match=expected):
        build_workload(cfg, 0, tmp_path)
    (tmp_path / "lens.csv").unlink()
    (tmp_path / "lens.csv").mkdir()
    with pytest.raises(ConfigError, match=r"lens.csv: cannot be read as a CSV file \(IsADirectoryError"):
        build_workload(cfg, 0, tmp_path)


def test_azure_trace_window_and_scaling(shared_data):
    path = shared_data / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    t, p, o = read_trace(path, "azure")
    assert len(t) == 19366 and t[0] == 0.0
    assert round(t[-1]) == 3502  # 18:15:46.68 -> 19:14:08.40
    cfg = Trace.model_validate({"path": str(path), "format": "azure", "window_s": [600, 900], "rate_scale": 2.0})
    wl = build_workload(cfg, 0, ".")
    keep = (t >= 600) & (t < 900)
    assert len(wl) == keep.sum()
    assert wl.arrival_s.max() < 150.0  # 300 s window at twice the rate
    assert np.array_equal(wl.prompt_tokens, p[keep])


def test_mooncake_trace(shared_data):
    path = shared_data / "traces" / "mooncake_fast25" / "conversation_trace.jsonl"
    t, p, o = read_trace(path, "mooncake")
    assert len(t) == 12031
    assert round(t[-1]) == 3537 or round(t[-1]) == 3536
    assert p.mean() == pytest.approx(12035, rel=0.01)


def test_malformed_rows_name_file_and_line(tmp_path):
    bad = tmp_path / "t.csv"
    bad.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,10,5\n0.5,ten,5\n")
    with pytest.raises(ConfigError, match=rf"^{bad}: line 3: prompt_tokens: expected a whole number of tokens in 1..100,000,000, got 'ten'$"):
        read_trace(bad, "csv")
    jl = tmp_path / "t.jsonl"
    jl.write_text('{"timestamp": 0, "input_length": 5, "output_length": 2}\n{"timestamp": 1, "input_length": 5}\n')
    with pytest.raises(ConfigError, match=rf"^{jl}: line 2: missing key 'output_length'$"):
        read_trace(jl, "mooncake")
    back = tmp_path / "b.csv"
    back.write_text("arrival_s,prompt_tokens,output_tokens\n1.0,10,5\n0.5,10,5\n")
    with pytest.raises(ConfigError, match="line 3: arrival time goes backwards"):
        read_trace(back, "csv")
    back.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n\n\n\n5,10,5\n1,10,5\n")  # blank lines count
    with pytest.raises(ConfigError, match="line 7: arrival time goes backwards"):
        read_trace(back, "csv")
    jl.write_text('{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 5}\n\n\n'
                  '{"arrival_s": 3, "prompt_tokens": 5, "output_tokens": 5}\n{"arrival_s": 1, "prompt_tokens": 5, '
                  '"output_tokens": 5}\n')
    with pytest.raises(ConfigError, match="line 5: arrival time goes backwards"):
        read_trace(jl, "jsonl")


def test_trace_scenario_runs_end_to_end(shared_data):
    path = shared_data / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
    sc = scenario(workload={"kind": "trace", "path": str(path), "format": "azure", "window_s": [0, 300]},
                  scheduler={"kind": "chunked", "max_num_seqs": 64, "max_num_batched_tokens": 2048, "chunk_tokens": 2048})
    res = run(sc)
    assert res.summary["completed"] == res.summary["requests"] > 100


def test_a_trace_with_a_byte_order_mark_reads_as_without(tmp_path):
    """Excel's 'CSV UTF-8' starts the file with a byte-order mark: the header is still `arrival_s`."""
    text = "arrival_s,prompt_tokens,output_tokens\n0.0,10,5\n0.5,20,3\n"
    plain, bom = tmp_path / "plain.csv", tmp_path / "bom.csv"
    plain.write_text(text)
    bom.write_text("\ufeff" + text, encoding="utf-8")
    assert [a.tolist() for a in read_trace(bom, "csv")] == [a.tolist() for a in read_trace(plain, "csv")]
