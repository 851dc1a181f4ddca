"""capsim.cli loads only the module of the command it is given (COMMANDS); the full parser still lists every one."""

import json
import subprocess
import sys

import pytest

from capsim.cli import COMMAND_MODULES, COMMANDS, build_parser, main


def _registered(parser) -> set[str]:
    return set(next(a for a in parser._actions if a.dest == "command").choices)


def test_every_registered_command_is_mapped_to_the_module_that_registers_it():
    assert _registered(build_parser()) == set(COMMANDS)
    for command, module in COMMANDS.items():
        assert module in COMMAND_MODULES
        assert command in _registered(build_parser(command))


def test_a_command_loads_only_its_own_module():
    code = ("import sys; from capsim.cli import build_parser; build_parser('memory'); "
            "print(sorted(m for m in sys.modules if m.startswith(('capsim.commands.', 'sim.figures'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['capsim.commands.memory', 'capsim.commands.memory_parallel']"   # no other command's


def test_help_version_and_unknown_commands_still_see_every_command(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["no-such-command"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'no-such-command'" in err and "validate-published" in err and "memory" in err
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("capsim ")


def test_a_command_parses_as_before(capsys):
    assert main(["memory", "--model", "qwen3-8b", "--prompt", "128", "--output", "16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["model"], out["tokens_stored_per_request"], out["blocks_per_request"]) == ("qwen3-8b", 143, 9)
    with pytest.raises(SystemExit) as exc:   # the command's own argument errors, from its own parser
        main(["memory", "--model", "qwen3-8b", "--prompt", "many"])
    assert exc.value.code == 2 and "--prompt" in capsys.readouterr().err


def test_memory_says_when_the_budget_cannot_exist_on_the_card(capsys):
    """`fits yes` had been printed for a 10 TB budget on an 80 GB card, where `capsim run` says memory fit NO; a
    prompt beyond the model's context had passed without the warning `run` gives."""
    assert main(["memory", "--model", "qwen3-8b", "--kv-budget", "10TB", "--hardware", "h100-sxm"]) == 0
    out = capsys.readouterr().out
    assert "card                       NO: weights 15.26 GiB + KV budget 9313.23 GiB exceed h100-sxm's 74.51 GiB" in out
    assert main(["memory", "--model", "qwen3-8b", "--kv-budget", "10GiB", "--hardware", "h100-sxm", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["card_fit"] is True
    # without --hardware there is no card to check: the table, no card row (it had raised AttributeError)
    assert main(["memory", "--model", "qwen3-8b", "--kv-budget", "10GiB"]) == 0
    out = capsys.readouterr().out
    assert "KV budget" in out and "max requests" in out and "card " not in out
    assert main(["memory", "--model", "qwen3-8b", "--prompt", "200000", "--output", "10"]) == 0
    assert ("warning: --prompt + --output = 200,010 positions, more than qwen3-8b's 40,960"
            in capsys.readouterr().err)


def test_the_latency_table_keeps_its_columns_apart_for_huge_values(tmp_path, capsys):
    from pathlib import Path
    profile = Path(__file__).resolve().parents[2] / "profiles" / "fitted" / "cpu__qwen2.5-0.5b__bf16.yaml"
    scenario = tmp_path / "far.yaml"
    scenario.write_text(f"""name: far
seed: 0
model: qwen2.5-0.5b
hardware: cpu-epyc-2c
weight_format: bf16
kv: {{block_tokens: 16, format: bf16, budget: 1GiB}}
scheduler: {{kind: continuous, max_num_seqs: 8}}
step_time:
  model: {{kind: profile, path: {profile}, use: linear}}
workload:
  kind: requests
  requests:
    - {{arrival_s: 0, prompt_tokens: 16, output_tokens: 8, outside_wait_s: 1.0e+9}}
    - {{arrival_s: 1.0e+9, prompt_tokens: 16, output_tokens: 8}}
""")
    assert main(["run", str(scenario), "--out", str(tmp_path / "out")]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("ms "))
    assert lines[head].split() == ["ms", "mean", "median", "p90", "p99", "max"]
    for line in lines[head + 1:head + 5]:
        cells = line.split()
        assert len(cells) == 6 and cells[0] in ("TTFT", "ITL", "TPOT", "E2E"), line
        assert all(float(c) > 0 for c in cells[1:])
    assert float(lines[head + 4].split()[5]) > 1e12     # E2E max: the 1e9 s wait, in ms
