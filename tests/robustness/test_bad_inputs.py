"""Issue 16's bad inputs, one test each: a clear `file: yaml.path: message (got value)` error, never a
traceback, never a silent default."""

from __future__ import annotations

import re

import pytest

from capsim.cli import main
from sim.io.config import load_scenario
from sim.io.errors import ConfigError
from sim.io.profiles import LinearStepTime
from sim.io.schema import read_yaml_mapping
from tests.sim.helpers import REPO_SCENARIOS

EXAMPLE = REPO_SCENARIOS / "capacity-example.yaml"
SMALL = ["--set", "workload.num_requests=5"]


def errors_of(capsys, argv) -> list[str]:
    assert main(argv) == 2
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]


@pytest.mark.parametrize("override, expected", [
    ("workload.arrival.rate_rps=.inf", "workload.arrival.rate_rps: Input should be a finite number (got inf)"),
    ("workload.prompt_tokens.median=.inf", "workload.prompt_tokens.median: Input should be a finite number (got inf)"),
    ("step_time.model.constant_s=.nan", "step_time.model.constant_s: Input should be a finite number (got nan)"),
    ("scheduler.max_num_seqs=true", "scheduler.max_num_seqs: Input should be a valid integer (got True)"),
    ("scheduler.max_num_seqs=2.0", "scheduler.max_num_seqs: Input should be a valid integer (got 2.0)"),
    ("workload.prompt_tokens={kind: fixed, value: 1.0e+30}", "workload.prompt_tokens.value: 1e+30 is beyond any real "
     "setting (numbers in input files must be within +-1e+15)"),
    ("workload.prompt_tokens={kind: fixed, value: 1000000000000000000000000000000}", "workload.prompt_tokens.value: "
     "1000000000000000000000000000000 is beyond any real setting (numbers in input files must be within +-1e+15)"),
    ("workload.prompt_tokens={kind: fixed, value: 200000000}",
     "workload.prompt_tokens.value: Input should be less than or equal to 100000000 (got 200000000)"),
    ("workload.num_requests=1e30", "workload.num_requests: 1e+30 is beyond any real setting (numbers in input files "
     "must be within +-1e+15)"),
    ("workload.num_requests=5.0", "workload.num_requests: Input should be a valid integer (got 5.0)"),
    ("kv.block_tokens=100000000", "kv.block_tokens: Input should be less than or equal to 65536 (got 100000000)"),
    ("name=''", "name: String should have at least 1 character (got '')"),
    ("step_time.model={kind: linear}", "step_time.model: a linear step-time model needs constant_s, per_new_token_s, "
     "per_pair_s; missing constant_s, per_new_token_s, per_pair_s (write 0.0 for a term that is really zero)"),
    ("step_time.model={kind: linear, constant_s: 0, per_new_token_s: 0, per_pair_s: 0}",
     "step_time.model: a one-token step would take 0 s: at least one coefficient must make a step take time "
     "(constant_s, per_new_token_s, ...)"),
])
def test_silent_accepts_are_refused_with_yaml_path_and_value(capsys, override, expected):
    assert f"error: {EXAMPLE}: {expected}" in errors_of(capsys, ["run", str(EXAMPLE), *SMALL, "--set", override])


def test_min_above_max_is_refused(capsys):
    lines = errors_of(capsys, ["run", str(EXAMPLE), "--set", "workload.prompt_tokens.min=9000", *SMALL])
    assert lines == [f"error: {EXAMPLE}: workload.prompt_tokens: max (8000) must be >= min (9000)"]


def test_union_paths_are_yaml_paths_without_variant_tags(capsys):
    lines = errors_of(capsys, ["run", str(EXAMPLE), "--set", "kv.budget={gpu_memory_utilization: 1.5}", *SMALL])
    # one error, at the path --set takes, and no spurious `kv.budget.int` from the other branch
    assert lines == [f"error: {EXAMPLE}: kv.budget.gpu_memory_utilization: Input should be less than or equal to 1 "
                     "(got 1.5)"]
    lines = errors_of(capsys, ["run", str(EXAMPLE), "--set", "workload.arrival.rate_rps=-1", *SMALL])
    assert lines == [f"error: {EXAMPLE}: workload.arrival.rate_rps: Input should be greater than or equal to 0.000001 "
                     "(got -1)"]
    # so slow a run's clock (1e300 s) would print 300-digit makespans and zero latencies
    lines = errors_of(capsys, ["run", str(EXAMPLE), "--set", "workload.arrival.rate_rps=1e-300", *SMALL])
    assert lines == [f"error: {EXAMPLE}: workload.arrival.rate_rps: Input should be greater than or equal to 0.000001 "
                     "(got 1e-300)"]


def test_duplicate_yaml_key_is_an_error(tmp_path):
    p = tmp_path / "dup.yaml"
    p.write_text(EXAMPLE.read_text().replace("seed: 0\n", "seed: 0\nseed: 1\n"))
    with pytest.raises(ConfigError) as exc:
        load_scenario(p)
    assert str(exc.value) == (f"{p}: line 8, column 1: invalid YAML: duplicate key 'seed' (first given on line 7, "
                              "column 1)")
    # on one line (a flow mapping, JSON, a --set value): the last one had silently won
    p.write_text("name: dup\nkv: {block_tokens: 16, budget: 12GiB, block_tokens: 65536}\n")
    with pytest.raises(ConfigError, match=r"line 2, column 39: invalid YAML: duplicate key 'block_tokens' \(first "
                                          r"given on line 2, column 6\)"):
        load_scenario(p)


def test_merge_keys_may_still_override(tmp_path):
    p = tmp_path / "merge.yaml"
    p.write_text("base: &b {x: 1, y: 2}\nderived:\n  <<: *b\n  y: 3\n")
    assert read_yaml_mapping(p)["derived"] == {"x": 1, "y": 3}


def test_yaml_12_floats_are_numbers(tmp_path):
    p = tmp_path / "f.yaml"
    p.write_text("a: 1e9\nb: 2.5e-3\nc: v1e3\n")
    assert read_yaml_mapping(p) == {"a": 1e9, "b": 2.5e-3, "c": "v1e3"}


def test_binary_file_and_directory_are_named(capsys, tmp_path):
    binary = tmp_path / "ls"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(128, 256)))
    assert errors_of(capsys, ["run", str(binary)]) == [
        f"error: {binary}: not a UTF-8 text file (byte 8: b'\\x80'); expected a YAML file"]
    assert errors_of(capsys, ["run", str(tmp_path)]) == [f"error: {tmp_path}: is a directory, expected a YAML file"]


def test_linear_coefficients_may_default_in_code_but_not_in_files():
    assert LinearStepTime(constant_s=1.0).per_pair_s == 0.0  # programmatic use: explicit object
    with pytest.raises(ValueError, match="one-token step would take 0 s"):
        LinearStepTime()


def test_set_needs_a_key(capsys):
    assert errors_of(capsys, ["run", str(EXAMPLE), "--set", "=3"]) == [
        "error: --set '=3': expected dotted.key=value, e.g. scheduler.max_num_seqs=32"]


@pytest.mark.parametrize("argv, expected", [
    (["--block-size", "0"], "argument --block-size: expected an integer in 1..65,536, got '0'"),
    (["--gpu-memory-utilization", "2", "--hardware", "h100-sxm"],
     "argument --gpu-memory-utilization: expected a fraction in (0, 1], got '2'"),
    (["--context", "-5", "--batch", "1"], "argument --context: expected an integer in 1..100,000,000, got '-5'"),
    (["--kv-format", "fp7"], "argument --kv-format: invalid choice: 'fp7'"),
    (["--batch", "1,,4"], "argument --batch: expected comma-separated integers such as 1,4,16,64, got '1,,4'"),
])
def test_memory_flags_are_checked_by_argparse(capsys, argv, expected):
    with pytest.raises(SystemExit) as exc:
        main(["memory", "--model", "qwen3-8b", *argv])
    assert exc.value.code == 2 and expected in capsys.readouterr().err


def test_memory_errors_name_the_flag(capsys):
    assert errors_of(capsys, ["memory", "--model", "nosuch"])[0].startswith("error: --model: unknown model 'nosuch'")
    lines = errors_of(capsys, ["memory", "--model", "deepseek-v3", "--hardware", "l4", "--gpu-memory-utilization", "0.9"])
    assert lines[0].startswith("error: --gpu-memory-utilization 0.9: no KV budget left on l4")


def test_errors_raised_inside_the_run_name_the_scenario(capsys):
    assert errors_of(capsys, ["run", str(EXAMPLE), "--set", "kv.budget=0"]) == [
        f"error: {EXAMPLE}: kv.budget: 0 B holds no 16-token block (2359296 B each)"]
    assert errors_of(capsys, ["run", str(EXAMPLE), "--set", "hardware=nosuch"])[0].startswith(
        f"error: {EXAMPLE}: hardware: unknown hardware 'nosuch'; known: ")


def test_broken_hardware_profile_is_reported_against_the_scenario(capsys, tmp_path):
    import shutil
    from sim.io.profiles import profiles_dir
    hw = tmp_path / "l4.yaml"
    shutil.copy(profiles_dir() / "hardware" / "l4.yaml", hw)
    hw.write_text(hw.read_text().replace("memory_gb:\n  value: 24", "memory_gb:\n  value: -24"))
    assert "value: -24" in hw.read_text()
    lines = errors_of(capsys, ["run", str(EXAMPLE), "--set", f"hardware={hw}"])
    assert lines == [f"error: {EXAMPLE}: hardware: {hw}: <root>: memory_gb.value must be > 0, got -24.0"]


@pytest.mark.parametrize("body, expected", [
    ("0,10,5\n1,nan,5\n", "line 3: prompt_tokens: expected a whole number of tokens in 1..100,000,000, got 'nan'"),
    ("0,10,5\n1,inf,5\n", "line 3: prompt_tokens: expected a whole number of tokens in 1..100,000,000, got 'inf'"),
    ("0,10,5,7\n", "line 2: 4 cells, but the header has 3 columns"),
    ("0,10\n", "line 2: 2 cells, but the header has 3 columns"),
    ("nan,10,5\n", "line 2: arrival_s: expected a finite number of seconds in 0..1e12, got 'nan'"),
])
def test_trace_cells(tmp_path, body, expected):
    from sim.workloads.traces import read_trace
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,prompt_tokens,output_tokens\n" + body)
    with pytest.raises(ConfigError) as exc:
        read_trace(p, "csv")
    assert str(exc.value) == f"{p}: {expected}"


def test_mooncake_timestamp_error_says_milliseconds(tmp_path):
    from sim.workloads.traces import read_trace
    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp": -5, "input_length": 10, "output_length": 3, "hash_ids": [1]}\n')
    with pytest.raises(ConfigError) as exc:
        read_trace(p, "mooncake")
    assert str(exc.value) == f"{p}: line 1: timestamp: expected a finite number of ms in 0..1e12, got -5"


def test_trace_json_errors_are_whole(tmp_path):
    from sim.workloads.traces import read_trace
    p = tmp_path / "t.jsonl"
    p.write_text('{"arrival_s": 0, "prompt_tokens": true, "output_tokens": 3}\n')
    with pytest.raises(ConfigError, match="line 1: prompt_tokens: expected a whole number of tokens .* got True"):
        read_trace(p, "jsonl")
    p.write_text('{"arrival_s": 0, "prompt_tokens": 4, "output_tokens": 3\n')
    with pytest.raises(ConfigError) as exc:
        read_trace(p, "jsonl")
    assert str(exc.value) == (f"{p}: line 1, column 57: invalid JSON (Expecting ',' delimiter): "
                              "'{\"arrival_s\": 0, \"prompt_tokens\": 4, \"output_tokens\": 3'")
    p.write_text('{"arrival_s": 0, "prompt_tokens": 4, "output_tokens": 3, "arrival_s": 9}\n')
    with pytest.raises(ConfigError) as exc:
        read_trace(p, "jsonl")
    assert str(exc.value) == f"{p}: line 1: key 'arrival_s' given twice"
    p.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(128, 256)))
    with pytest.raises(ConfigError, match="not a UTF-8 text file"):
        read_trace(p, "jsonl")


@pytest.mark.parametrize("value, expected", [
    (".inf", "kv.budget: a size must be a finite number of bytes, got inf"),
    ("0.5", "kv.budget: a size in bytes must be a whole number, got 0.5"),
])
def test_sizes_are_finite_whole_bytes(capsys, value, expected):
    assert errors_of(capsys, ["run", str(EXAMPLE), *SMALL, "--set", f"kv.budget={value}"]) == [
        f"error: {EXAMPLE}: {expected}"]


def test_a_negative_step_time_is_refused(capsys):
    scenario = REPO_SCENARIOS / "chapter8" / "four-requests-fixed.yaml"
    assert errors_of(capsys, ["run", str(scenario), "--set", "step_time.model.per_new_token_s=-30.4e-6"]) == [
        f"error: {scenario}: step_time: the linear model (step_time.model) gives a negative step time (-0.0857093 s) "
        "for an iteration of 4096 new tokens, 2 sequences, 0 KV tokens read: check its negative coefficients"]


def test_weights_larger_than_the_card_are_refused_before_running(capsys):
    lines = errors_of(capsys, ["run", str(EXAMPLE), *SMALL, "--set", "model=llama-2-70b"])
    assert lines == [f"error: {EXAMPLE}: model: llama-2-70b's bf16 weights need 128.48 GiB per GPU, more than "
                     "rtx-pro-6000-bw-ws's 89.41 GiB; use a smaller weight_format, more GPUs (parallel: {tp: N}) "
                     "or offload: {layers: N}; the smallest layout that fits is parallel: {tp: 2, pp: 1, ep: 1} "
                     "(2 GPUs), leaving 20% or more of each GPU for KV"]
    assert main(["run", str(EXAMPLE), *SMALL, "--set", "model=llama-2-70b", "--set", "weight_format=int4"]) == 0
    # where pipelining fits on fewer GPUs than tensor parallelism alone, both are named (as `capsim memory` does)
    lines = errors_of(capsys, ["run", str(REPO_SCENARIOS / "parallel" / "llama-3.1-70b-tp4-h100.yaml"),
                               "--set", "parallel.tp=1"])
    assert len(lines) == 1 and lines[0].endswith(
        "the smallest layout that fits is parallel: {tp: 1, pp: 3, ep: 1} (3 GPUs), leaving 20% or more of each GPU "
        "for KV; with tensor parallelism alone: parallel: {tp: 4, pp: 1, ep: 1} (4 GPUs)")
    assert main(["run", str(REPO_SCENARIOS / "parallel" / "llama-3.1-70b-tp4-h100.yaml"), "--set", "parallel.tp=1",
                 "--set", "parallel.pp=3", "--set", "workload.num_requests=20"]) == 0


@pytest.mark.parametrize("override, expected", [
    ("hardware=l4", "hardware: the profile was measured on 'rtx-pro-6000-bw-ws' but the scenario's hardware is 'l4'"),
    ("weight_format=fp8", "dtype: the profile was measured with bf16 weights but the scenario's weight_format is 'fp8'"),
])
def test_a_fitted_profile_runs_only_on_its_card_and_weight_format(capsys, override, expected):
    """Copying the quickstart and changing its card (or its weights) must not keep the old card's step times silently."""
    [line] = errors_of(capsys, ["run", str(REPO_SCENARIOS / "quickstart.yaml"), "--set", override, "--set", "workload.max_requests=5"])
    assert "rtx-pro-6000-bw-ws__qwen3-8b__bf16__chapter.yaml: " + expected in line


def test_fp16_weights_run_a_bf16_profile():
    """BF16 and FP16 weights cost the same bytes and FLOPs: a profile of one serves the other."""
    assert main(["run", str(REPO_SCENARIOS / "quickstart.yaml"), "--set", "weight_format=fp16", "--set", "workload.max_requests=5"]) == 0


def test_a_layout_error_names_the_flag_as_typed(capsys):
    """`capsim memory --attention-dp 2` on a dense model names `--attention-dp`, the flag the user typed."""
    [line] = errors_of(capsys, ["memory", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--attention-dp", "2"])
    assert line.startswith("error: --attention-dp: 2 on llama-3.1-8b, a dense model (allowed: 1")


def test_compare_names_every_bad_file_before_running_any(capsys, tmp_path, monkeypatch):
    import sim.api
    monkeypatch.setattr(sim.api, "run_scenario", lambda *a, **k: pytest.fail("a scenario ran"))
    bad1, bad2 = tmp_path / "a.yaml", tmp_path / "b.yaml"
    bad1.write_text(EXAMPLE.read_text() + "\nnot_a_field: 1\n")
    bad2.write_text(EXAMPLE.read_text().replace("hardware:", "hardware_typo:", 1))
    lines = errors_of(capsys, ["compare", str(bad1), str(EXAMPLE), str(bad2)])
    assert any(str(bad1) in line for line in lines) and any(str(bad2) in line for line in lines)


def test_requests_beyond_the_models_context_are_warned_about(capsys):
    assert main(["run", str(EXAMPLE), "--set", "workload.prompt_tokens={kind: fixed, value: 100000}",
                 "--set", "workload.num_requests=3", "--set", "kv.budget=40GiB"]) == 0
    assert ("warning: workload: 3 of 3 requests need more than qwen3-8b's 40,960 positions (prompt + output, up to "
            "100,") in capsys.readouterr().err
    assert main(["run", str(EXAMPLE), *SMALL]) == 0
    assert "positions" not in capsys.readouterr().err
    # a sweep builds the scenario for every point: the same warning once per process, not once per point
    from sim.core import simulation
    from sim.io import notices
    notices._said_ever.clear()
    sc, base = load_scenario(EXAMPLE, ["workload.prompt_tokens={kind: fixed, value: 100000}", "workload.num_requests=3",
                                       "kv.budget=40GiB"])
    for _ in range(3):
        simulation.Simulation(sc, base)
    assert capsys.readouterr().err.count("positions") == 1


@pytest.mark.parametrize("override, expected", [
    ("scheduler={}", "scheduler: no kind: given; expected kind: one of 'fixed', 'continuous', 'chunked', 'vllm_v1'"),
    ("step_time.model={}", "step_time.model: no kind: given; expected kind: one of 'linear', 'efficiency', 'profile', "
                           "'ops'"),
])
def test_a_mapping_without_its_kind_lists_the_kinds(capsys, override, expected):
    assert errors_of(capsys, ["run", str(EXAMPLE), "--set", override]) == [f"error: {EXAMPLE}: {expected}"]


@pytest.mark.parametrize("acceptance, expected", [
    ("{kind: constant, a: 1.5}", "scheduler.speculative.acceptance: a[0] = 1.5 is not a probability in [0, 1]"),
    ("{kind: per_position, a: [0.9, -0.2, 0.5, 0.5]}",
     "scheduler.speculative.acceptance: a[1] = -0.2 is not a probability in [0, 1]"),
    ("{kind: per_position, a: []}", "scheduler.speculative: acceptance.a has 0 positions, fewer than num_draft_tokens "
     "(4)"),
    ("{kind: vllm_rates, a: [0.2, 0.5, 0.9, 1.0]}", "scheduler.speculative.acceptance: per_position_rates must not "
     "increase"),
    ("{kind: beta, alpha: 1, beta: 1, a: 0.3}", "scheduler.speculative.acceptance: acceptance kind beta does not use a"),
])
def test_speculative_acceptance_is_checked_with_the_scenario(capsys, acceptance, expected):
    """These had passed validate-scenario and then stopped the run with a ValueError traceback (or, the last, been
    ignored)."""
    spec = f"scheduler.speculative={{draft: {{kind: ngram}}, num_draft_tokens: 4, acceptance: {acceptance}}}"
    lines = errors_of(capsys, ["run", str(EXAMPLE), "--set", spec, *SMALL])
    assert len(lines) == 1 and lines[0].startswith(f"error: {EXAMPLE}: {expected}")


@pytest.mark.parametrize("override, expected", [
    ("lora={adapters: 100000, rank: 65536}", r"kv.budget: \d+ B holds no 16-token block \(\d+ B each\); the LoRA "
     r"adapters \(lora\) take [\d,.]+ GiB of it"),
    ("scheduler.speculative={draft: {kind: draft_model, model: llama-3.1-70b}, num_draft_tokens: 4, acceptance: "
     "{kind: constant, a: 0.7}}", r"holds no 16-token block \(\d+ B each\); the drafter's weights "
     r"\(scheduler.speculative\) take [\d,.]+ GiB of it"),
    ("scheduler.speculative={draft: {kind: draft_model, model: nonexistent}, num_draft_tokens: 4, acceptance: "
     "{kind: constant, a: 0.7}}", r"scheduler.speculative.draft.model: unknown model 'nonexistent'; known: "),
    ("kv.host_budget=1", r"kv.host_budget: 1 B holds no 16-token block \(\d+ B each\); give at least one block, or 0"),
])
def test_what_took_the_kv_budget_is_named(capsys, override, expected):
    """The budget error had blamed kv.budget alone when a drafter or LoRA adapters had taken it; a host budget
    below one block had turned every swap into a silent recompute."""
    lines = errors_of(capsys, ["run", str(EXAMPLE), "--set", override, *SMALL])
    assert len(lines) == 1
    assert re.search(expected, lines[0]), lines[0]


def test_workload_start_has_a_ceiling(capsys):
    """At 1e14 s the float clock had rounded inter-token gaps to multiples of 15.6 ms, silently."""
    lines = errors_of(capsys, ["run", str(EXAMPLE), "--set", "workload.start_s=1e14", *SMALL])
    assert lines == [f"error: {EXAMPLE}: workload.start_s: Input should be less than or equal to 1000000000 "
                     "(got 100000000000000.0)"]


def test_expert_settings_on_a_dense_model_are_refused(capsys):
    """They had been accepted and ignored, where ep and attention_dp were refused."""
    lines = errors_of(capsys, ["run", str(EXAMPLE), "--set", "parallel={tp: 2, routing_skew: 8, expert_imbalance: 2}",
                               *SMALL])
    assert lines == [
        f"error: {EXAMPLE}: parallel.expert_imbalance: 2.0 on qwen3-8b, a dense model without experts (allowed: 1.0, "
        "or leave it out)",
        f"error: {EXAMPLE}: parallel.routing_skew: 8.0 on qwen3-8b, a dense model without experts (allowed: 0.0, "
        "or leave it out)"]


@pytest.mark.parametrize("power, expected", [
    ("{model: cap, busy_w: 100, idle_w: 50}", "power: power.model cap draws the card's power cap: busy_w and idle_w are "
     "for model idle_busy"),
    ("{model: idle_busy, busy_w: 100, idle_w: 500}", "power: power.idle_w (500.0 W) exceeds power.busy_w (100.0 W)"),
])
def test_power_figures_that_would_be_ignored_or_inverted(capsys, power, expected):
    lines = errors_of(capsys, ["run", str(EXAMPLE), "--set", f"power={power}", *SMALL])
    assert len(lines) == 1 and lines[0].startswith(f"error: {EXAMPLE}: {expected}"), lines


@pytest.mark.parametrize("override, expected", [
    ("workload={kind: trace, path: data/azure_conv_2023_first600s.csv, format: csv, trace_block_tokens: 64}",
     "workload: trace_block_tokens (64) is for format mooncake"),
    ("workload={kind: closed_loop, users: 2, num_requests: 4, prompt_tokens: {kind: fixed, value: 10}, "
     "output_tokens: {kind: fixed, value: 5}, ramp_phases: random}",
     "workload: ramp_phases random draws each user's start within ramp_up_s, which is 0"),
    ("kv={budget: 12GiB, prefix_caching: false, warm_prefixes: [{name: sys, tokens: 64}]}",
     "kv: kv.warm_prefixes are cached before arrivals, but kv.prefix_caching is false"),
])
def test_settings_that_would_do_nothing_are_refused(capsys, override, expected):
    lines = errors_of(capsys, ["run", str(REPO_SCENARIOS / "quickstart.yaml"), "--set", override])
    assert len(lines) == 1 and expected in lines[0], lines


def test_a_commit_hash_that_reads_as_a_number_is_written_quoted():
    """published_check.yaml and fitted profiles record a short commit hash; 7e30589 is a YAML 1.2 float, which
    parse_yaml reads as inf, so dump_yaml quotes it (the file capsim wrote must load back)."""
    from sim.io.schema import dump_yaml, parse_yaml
    doc = {"commit": "7e30589", "n": 1e9, "name": "abc"}
    text = dump_yaml(doc, sort_keys=False)
    assert "'7e30589'" in text
    assert parse_yaml(text, "x") == doc
