"""checkpoint.weights: tied weights, finite check, corrupt files, pickle refusal, strict loading."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from training_helpers import TinyModel, assert_same

from aiayn.checkpoint.weights import (
    CorruptCheckpointError,
    check_finite,
    load_state_dict_checked,
    read_safetensors,
    read_weights,
    state_dict_to_bytes,
)


@pytest.mark.reliability
def test_tied_weights_are_stored_once_and_come_back_tied(tmp_path: Path) -> None:
    model = TinyModel(tied=True)
    path = tmp_path / "w.safetensors"
    path.write_bytes(state_dict_to_bytes(model.state_dict()))
    with safe_open(str(path), framework="pt") as f:
        stored = set(f.keys())
    assert "out.weight" not in stored and "embed.weight" in stored
    state, metadata = read_safetensors(path)
    assert metadata["aiayn.aliases"] == '{"out.weight": "embed.weight"}'
    assert state["out.weight"] is state["embed.weight"]
    assert_same(dict(sorted(state.items())), dict(sorted(model.state_dict().items())))
    fresh = TinyModel(tied=True)
    load_state_dict_checked(fresh, state, source=str(path))
    assert fresh.out.weight is fresh.embed.weight
    assert torch.equal(fresh.embed.weight, model.embed.weight)


def test_overlapping_views_are_copied(tmp_path: Path) -> None:
    base = torch.arange(10.0)
    state = {"a": base[:6], "b": base[4:], "empty1": torch.zeros(0), "empty2": torch.zeros(0)}
    path = tmp_path / "v.safetensors"
    path.write_bytes(state_dict_to_bytes(state))
    back, metadata = read_safetensors(path)
    assert "aiayn.aliases" not in metadata
    assert torch.equal(back["a"], base[:6]) and torch.equal(back["b"], base[4:]) and back["empty2"].shape == (0,)


def test_check_finite_names_the_first_bad_tensor() -> None:
    state = {"ok": torch.ones(3), "steps": torch.tensor([1, 2]), "bad": torch.tensor([1.0, float("nan"), float("inf")])}
    with pytest.raises(ValueError, match=r"weight 'bad' has 2 non-finite values \(of 3, shape \(3,\)\)"):
        check_finite(state)
    check_finite({"ok": torch.ones(2), "ints": torch.tensor([3])})


@pytest.mark.reliability
def test_unreadable_safetensors_are_named(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    data = state_dict_to_bytes({"a": torch.ones(4)})
    path.write_bytes(data[:-3])
    with pytest.raises(CorruptCheckpointError, match=rf"corrupt checkpoint file {path}: tensor 'a': data_offsets \[0, 16\] are outside the data section \(0 to 13 bytes\)") as info:
        read_safetensors(path)
    assert info.value.path == path
    with pytest.raises(FileNotFoundError, match=rf"no such weights file: {tmp_path / 'nope.safetensors'}"):
        read_safetensors(tmp_path / "nope.safetensors")


@pytest.mark.reliability
def test_pickle_is_refused_unless_trusted(tmp_path: Path) -> None:
    state = TinyModel().state_dict()
    path = tmp_path / "model.pt"
    torch.save(state, path)
    with pytest.raises(ValueError, match=rf"refusing to load {path}: .pt files are pickles.*trust_pickle=True"):
        read_weights(path)
    loaded = read_weights(path, trust_pickle=True)
    assert all(torch.equal(loaded[k], v) for k, v in state.items()) and list(loaded) == list(state)


class _NotWeights:
    pass


@pytest.mark.reliability
def test_trusted_pickle_still_uses_weights_only(tmp_path: Path) -> None:
    path = tmp_path / "evil.bin"
    with open(path, "wb") as f:
        pickle.dump({"w": _NotWeights()}, f, protocol=2)
    with pytest.raises(ValueError, match=rf"cannot load {path} with torch.load\(weights_only=True\)"):
        read_weights(path, trust_pickle=True)
    torch.save([torch.ones(2)], tmp_path / "list.pt")
    with pytest.raises(TypeError, match=r"list.pt: expected a state dict \(a mapping of names to tensors\), got list"):
        read_weights(tmp_path / "list.pt", trust_pickle=True)


def test_unknown_suffix_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"cannot read weights from .*w.npz: expected a .safetensors file.*got suffix '.npz'"):
        read_weights(tmp_path / "w.npz")


@pytest.mark.reliability
def test_mismatched_model_lists_keys_and_shapes_and_loads_nothing() -> None:
    source = TinyModel(vocab=11, d=8, tied=False).state_dict()
    source["extra.weight"] = torch.zeros(2)
    del source["norm.bias"]
    target = TinyModel(vocab=13, d=8, tied=False)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(ValueError) as info:
        load_state_dict_checked(target, source, source="ckpt/model.safetensors")
    msg = str(info.value)
    assert "weights in ckpt/model.safetensors do not match the model" in msg
    assert "missing from the file (1): norm.bias" in msg
    assert "unexpected in the file (1): extra.weight" in msg
    assert "shape mismatches (2): embed.weight: file (11, 8), model (13, 8), out.weight: file (11, 8), model (13, 8)" in msg
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())
