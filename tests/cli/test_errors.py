"""Bad input gets one clear line naming the file, the dotted field and what was expected."""

import textwrap

import pytest

from capsim.cli import main
from sim.io.config import load_scenario
from sim.io.errors import ConfigError
from tests.sim.helpers import REPO_SCENARIOS

GOOD = (REPO_SCENARIOS / "chapter8" / "four-requests-chunked.yaml").read_text()


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_unknown_key_and_wrong_type_name_file_and_field(tmp_path, capsys):
    bad = GOOD.replace("chunk_tokens: 2048", "chunk_size: 2048").replace("max_num_seqs: 2", "max_num_seqs: two")
    p = write(tmp_path, "bad.yaml", bad)
    assert main(["validate-scenario", str(p)]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert f"{p}: scheduler.max_num_seqs: Input should be a valid integer (got 'two')" in lines
    assert f"{p}: scheduler.chunk_size: Extra inputs are not permitted (got 2048)" in lines


def test_validate_prints_every_error_of_every_file(tmp_path, capsys):
    a = write(tmp_path, "a.yaml", GOOD.replace("budget: 12GiB", "budget: 12 parsecs"))
    b = write(tmp_path, "b.yaml", GOOD.replace("kind: chunked", "kind: chunkd"))
    c = write(tmp_path, "c.yaml", "- just\n- a list\n")
    d = write(tmp_path, "d.yaml", "# nothing but a comment\n")
    assert main(["validate-scenario", str(a), str(b), str(c), str(d)]) == 2
    out = capsys.readouterr().out
    assert (f"{a}: kv.budget: expected a size such as 12GiB, 12GB or 12884901888 (units: B, kB, MB, GB, TB, KiB, "
            "MiB, GiB, TiB), got '12 parsecs'") in out
    assert f"{b}: scheduler: Input tag 'chunkd' found using 'kind' does not match any of the expected tags" in out
    assert f"{c}: top level must be a mapping, got list" in out
    assert f"{d}: empty (no YAML content); expected a mapping of fields" in out


def test_validate_checks_what_run_resolves_before_simulating(tmp_path, capsys):
    """A file validate-scenario calls valid does not fail at the start of run: the trace, the layout, the KV budget,
    a fitted profile's card and a disaggregated pool's fields are checked too, each error naming its file."""
    trace = write(tmp_path, "trace.yaml", GOOD.split("workload:")[0]
                  + "workload: {kind: trace, path: nowhere.csv, format: csv}\n")
    tiny = write(tmp_path, "tiny.yaml", GOOD.replace("budget: 12GiB", "budget: 1KiB"))
    assert main(["validate-scenario", str(trace), str(tiny)]) == 2
    out = capsys.readouterr().out
    assert f"{trace}: {tmp_path / 'nowhere.csv'}: trace file not found" in out
    assert f"{tiny}: kv.budget: " in out
    quick = str(REPO_SCENARIOS / "quickstart.yaml")
    assert main(["validate-scenario", quick, "--set", "hardware=l4"]) == 2
    assert "hardware: the profile was measured on 'rtx-pro-6000-bw-ws'" in capsys.readouterr().out
    disagg = str(REPO_SCENARIOS / "disagg-llama-3.1-70b-h100.yaml")
    assert main(["validate-scenario", disagg, "--set", "disaggregation.decode.parallel.tp=3"]) == 2
    assert (f"{disagg}: disaggregation.decode: parallel.tp: 3 does not divide llama-3.1-70b's 64 attention heads"
            in capsys.readouterr().out)
    assert main(["validate-scenario", quick, disagg]) == 0
    assert "2 scenario file(s) valid" in capsys.readouterr().out


def test_cross_field_rule(tmp_path):
    p = write(tmp_path, "x.yaml", GOOD.replace("chunk_tokens: 2048", "chunk_tokens: 8192"))
    with pytest.raises(ConfigError) as exc:
        load_scenario(p)
    assert exc.value.lines == [f"{p}: scheduler: scheduler.chunk_tokens (8192) exceeds "
                               "scheduler.max_num_batched_tokens (4096)"]


def test_invalid_yaml_names_line(tmp_path):
    p = write(tmp_path, "y.yaml", "name: x\nkv: [1,\n")
    with pytest.raises(ConfigError) as exc:
        load_scenario(p)
    assert str(exc.value).startswith(f"{p}: line ")


def test_unknown_model_lists_known(tmp_path, capsys):
    p = write(tmp_path, "m.yaml", GOOD.replace("model: qwen3-8b", "model: qwen9-1b"))
    assert main(["run", str(p)]) == 2
    err = capsys.readouterr().err
    assert f"error: {p}: model: unknown model 'qwen9-1b'; known: " in err and "qwen3-8b" in err


def test_set_override_is_validated_with_the_file(tmp_path, capsys):
    p = write(tmp_path, "ok.yaml", GOOD)
    assert main(["run", str(p), "--set", "scheduler.max_num_seqs=0"]) == 2
    assert f"{p}: scheduler.max_num_seqs: Input should be greater than 0 (got 0)" in capsys.readouterr().err


def test_memory_json_contract(capsys):
    import json
    assert main(["memory", "--model", "qwen3-8b", "--prompt", "8192", "--output", "256", "--requests", "16",
                 "--shared-prefix", "6144", "--kv-format", "bf16", "--block-size", "16", "--kv-budget", "12GiB",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_bytes_per_token"] == 147456
    assert out["tokens_stored_per_request"] == 8447
    assert out["blocks_per_request"] == 144
    assert out["kv_bytes_per_request"] == 324 * 2**20
    assert out["shared_prefix_bytes"] == 864 * 2**20
    assert out["total_kv_bytes"] == 6048 * 2**20
    assert out["kv_budget_bytes"] == 12 * 2**30
    assert out["fits"] is True and out["max_requests"] == 35


@pytest.mark.parametrize("size,expected", [("12GiB", 12884901888), ("12GB", 12_000_000_000), ("12884901888", 12884901888)])
def test_memory_sizes(size, expected, capsys):
    import json
    assert main(["memory", "--model", "qwen3-8b", "--kv-budget", size, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kv_budget_bytes"] == expected


def test_memory_reads_view(capsys):
    assert main(["memory", "--model", "qwen3-8b", "--batch", "1,4,16,64", "--hardware", "rtx-pro-6000-bw-ws"]) == 0
    out = capsys.readouterr().out
    assert "8.62 ms" in out and "19.23 ms" in out and "b_KV" in out


def test_memory_bad_size_and_unknown_hardware(capsys):
    with pytest.raises(SystemExit):
        main(["memory", "--model", "qwen3-8b", "--kv-budget", "12 parsecs"])
    assert "expected a size such as 12GiB" in capsys.readouterr().err
    assert main(["memory", "--model", "qwen3-8b", "--hardware", "h900", "--batch", "1"]) == 2
    assert "unknown hardware 'h900'; known: " in capsys.readouterr().err


@pytest.mark.parametrize("argv, expected", [
    (["memory", "--model", "qwen3-8b", "--activation", "5GiB"],
     "error: --activation: only with --gpu-memory-utilization or --hardware (it has no effect without it)"),
    (["memory", "--model", "qwen3-8b", "--context", "99999"], "error: --context: only with --batch (it has no effect "
                                                              "without it)"),
    (["profile", "step", "--model", "qwen3-8b", "--hardware", "h100-sxm", "--batch", "8", "--cached", "100000"],
     "error: --cached: only with --prefill (it describes the prefill chunk)"),
    (["profile", "step", "--model", "qwen3-8b", "--hardware", "h100-sxm", "--batch", "8", "--prefill-seqs", "50"],
     "error: --prefill-seqs: only with --prefill (it describes the prefill chunk)"),
])
def test_a_flag_that_would_be_ignored_is_an_error(capsys, argv, expected):
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == expected


def test_activation_counts_with_hardware_alone(capsys):
    """With --hardware, --activation enters the weights-fit check even without --gpu-memory-utilization."""
    assert main(["memory", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--kv-budget", "4GiB",
                 "--activation", "70GiB"]) == 2
    assert "+ 70.00 GiB of activations > 74.51 GiB usable" in capsys.readouterr().err
