"""Hugging Face directories as untrusted input: malformed weights, bad config.json, shard paths, huge configs."""

from __future__ import annotations

import json

import pytest
import torch
from interop_helpers import gpt2
from safetensors.torch import save_file

from aiayn.checkpoint.errors import CorruptCheckpointError
from aiayn.interop import KeyMapError, load_hf
from aiayn.interop.hf_dir import write_hf_dir

pytestmark = pytest.mark.reliability


def _gpt2_dir(path):
    hf = gpt2(seed=0)
    config = {**hf.config.to_dict(), "architectures": ["GPT2LMHeadModel"]}
    write_hf_dir(path, config, {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"})
    return path


def test_a_malformed_safetensors_is_a_clear_error_naming_the_file(tmp_path):
    d = _gpt2_dir(tmp_path / "hf")
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(CorruptCheckpointError, match=rf"{d / 'model.safetensors'}: tensor '.*': data_offsets .* outside the data section"):
        load_hf(d)
    (d / "model.safetensors").write_bytes(b"not safetensors at all")
    with pytest.raises(CorruptCheckpointError, match=rf"{d / 'model.safetensors'}"):
        load_hf(d)


@pytest.mark.parametrize(("text", "message"), [("{not json", "invalid JSON"), ("[1]", "expected a JSON object, got list")])
def test_a_bad_config_json_is_named(tmp_path, text, message):
    d = _gpt2_dir(tmp_path / "hf")
    (d / "config.json").write_text(text)
    with pytest.raises(ValueError, match=rf"{d / 'config.json'}: {message}"):
        load_hf(d)


def _shard(d, weight_map):
    (d / "model.safetensors").unlink()
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd", "sub/../../x.safetensors", "sub/inner.safetensors"])
def test_shard_paths_are_confined_to_the_directory(tmp_path, shard):
    d = _gpt2_dir(tmp_path / "hf")
    save_file({"x": torch.ones(2)}, str(tmp_path / "outside.safetensors"))
    _shard(d, {"transformer.wte.weight": shard})
    with pytest.raises(ValueError, match=rf"{d / 'model.safetensors.index.json'}: shard '{shard}' is outside {d}"):
        load_hf(d)


def test_sharded_directory_still_loads_and_a_missing_shard_is_named(tmp_path):
    d = _gpt2_dir(tmp_path / "hf")
    state = {k: v for k, v in gpt2(seed=0).state_dict().items() if k != "lm_head.weight"}
    keys = sorted(state)
    first, second = keys[: len(keys) // 2], keys[len(keys) // 2 :]
    save_file({k: state[k].contiguous() for k in first}, str(d / "model-00001-of-00002.safetensors"))
    save_file({k: state[k].contiguous() for k in second}, str(d / "model-00002-of-00002.safetensors"))
    _shard(d, {**dict.fromkeys(first, "model-00001-of-00002.safetensors"), **dict.fromkeys(second, "model-00002-of-00002.safetensors")})
    assert load_hf(d).config.vocab_size == 61
    (d / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"shard 'model-00002-of-00002.safetensors' is missing"):
        load_hf(d)


def test_a_huge_config_is_refused_against_the_weights_before_allocating(tmp_path):
    d = _gpt2_dir(tmp_path / "hf")
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "n_embd": 2**30, "n_inner": 2**30, "n_head": 2**10}))
    with pytest.raises((KeyMapError, ValueError), match=r"shape"):
        load_hf(d)  # before: a model of 2**30-wide layers allocated first
