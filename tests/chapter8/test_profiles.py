"""Every profile under profiles/ loads; bad profiles and unknown names give errors that say where."""

from __future__ import annotations

import pytest

from sim.io.errors import ConfigError
from sim.io.profiles import known_names, load_fitted, load_hardware, load_model, profiles_dir

LOADERS = {"hardware": load_hardware, "models": load_model, "fitted": load_fitted}


def _profile_files():
    root = profiles_dir()
    for kind in LOADERS:
        for path in sorted((root / kind).glob("*.yaml")):
            yield pytest.param(kind, path, id=f"{kind}/{path.name}")


@pytest.mark.parametrize(("kind", "path"), list(_profile_files()))
def test_every_profile_loads(kind, path):
    profile = LOADERS[kind](path)
    if kind != "fitted":
        assert profile.name == path.stem
        # By name too, the way scenarios refer to them.
        assert LOADERS[kind](path.stem) == profile


def test_the_profile_directories_are_not_empty():
    assert known_names("hardware") and known_names("models")


BAD_CARD = """\
name: bad-card
vendor: NVIDIA
description: "a card with one wrong type and one unknown key"
memory_gb: {value: lots, source: "test"}
memory_bandwidth_gbs: {value: 1792, source: "test"}
bf16_dense_tflops: {value: 503.8, source: "test"}
tdp_w: {value: 600, source: "test"}
host_link:
  name: PCIe 5.0 x16
  bandwidth_gbs_per_direction: {value: 64, source: "test"}
colour: green
"""

BAD_MODEL = """\
name: bad-model
hf_id: nobody/bad-model
family: qwen3
num_layers: 36
hidden_size: 4096
intermediate_size: 12288
num_attention_heads: 32
num_kv_heads: 8
head_dim: 128
vocab_size: 151936
tie_word_embeddings: false
max_position_embeddings: 40960
moe: {num_experts: many, experts_per_token: 8, expert_intermediate_size: 1536, num_expert: 128}
source: "test"
"""


def test_malformed_hardware_profile_names_file_and_field(tmp_path):
    path = tmp_path / "bad-card.yaml"
    path.write_text(BAD_CARD)
    with pytest.raises(ConfigError) as err:
        load_hardware(path)
    lines = str(err.value).splitlines()
    assert lines[0] == f"{path}: memory_gb.value: Input should be a valid number (got 'lots')"
    assert f"{path}: colour: Extra inputs are not permitted (got 'green')" in lines
    assert err.value.lines == lines


def test_malformed_model_profile_names_nested_field(tmp_path):
    path = tmp_path / "bad-model.yaml"
    path.write_text(BAD_MODEL)
    with pytest.raises(ConfigError) as err:
        load_model(str(path))
    lines = str(err.value).splitlines()
    assert lines[0] == f"{path}: moe.num_experts: Input should be a valid integer (got 'many')"
    assert f"{path}: moe.num_expert: Extra inputs are not permitted (got 128)" in lines


def test_profile_name_must_equal_file_stem(tmp_path):
    path = tmp_path / "other-name.yaml"
    path.write_text(BAD_CARD.replace("value: lots", "value: 96").replace("colour: green\n", ""))
    with pytest.raises(ConfigError) as err:
        load_hardware(path)
    assert str(err.value).splitlines()[0] == f"{path}: name: 'bad-card' must equal the file stem 'other-name'"


def test_unknown_model_name_lists_known_names():
    with pytest.raises(ConfigError) as err:
        load_model("qwen3-9b")
    message = str(err.value)
    assert message.startswith("unknown model 'qwen3-9b'; known: ")
    assert message.split("known: ", 1)[1].split(", ") == known_names("models")
    assert "qwen3-8b" in known_names("models")


def test_unknown_hardware_name_lists_known_names():
    with pytest.raises(ConfigError) as err:
        load_hardware("h300")
    message = str(err.value)
    assert message.startswith("unknown hardware 'h300'; known: ")
    assert message.split("known: ", 1)[1].split(", ") == known_names("hardware")
