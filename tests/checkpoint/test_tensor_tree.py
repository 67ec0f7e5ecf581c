"""tensor_tree: optimizer state -> (safetensors tensors, JSON) -> the identical structure."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load, save
from training_helpers import TinyModel, assert_same

from aiayn.checkpoint.tensor_tree import flatten_tree, unflatten_tree
from aiayn.training.optim import OptimConfig, build_optimizer


def _through_disk_formats(tree: object) -> object:
    tensors, encoded = flatten_tree(tree)
    return unflatten_tree(load(save(tensors)), json.loads(json.dumps(encoded, allow_nan=False)))


def test_optimizer_state_round_trips_exactly() -> None:
    model = TinyModel()
    opt = build_optimizer(model, OptimConfig(name="adamw", lr=1e-3, weight_decay=0.1))
    for _ in range(2):
        opt.zero_grad()
        model(torch.randint(0, 11, (2, 3))).sum().backward()
        opt.step()
    state = opt.state_dict()
    back = _through_disk_formats(state)
    assert_same(back, state)
    assert isinstance(back["param_groups"][0]["betas"], tuple)
    assert list(back["state"]) == [0, 1, 2, 3, 4] and back["state"][0]["step"].shape == ()
    opt.load_state_dict(back)  # torch accepts it


def test_awkward_values_round_trip() -> None:
    tree = {
        "nan": float("nan"),
        "inf": (float("inf"), -float("inf")),
        "nested": ((1, "a"), [None, True]),
        "ints": {3: "x", "y": 4},
        "tag": {"__tensor__": "not a tensor"},
        "t": torch.arange(6, dtype=torch.int16).reshape(2, 3)[:, 1:],  # non-contiguous
        "scalar": torch.tensor(2.5, dtype=torch.float64),
    }
    back = _through_disk_formats(tree)
    tree["t"] = tree["t"].contiguous()
    assert_same(back, tree)


def test_unsupported_leaves_name_their_path() -> None:
    with pytest.raises(TypeError, match=r"^state.0.buf: cannot store a ndarray; expected a tensor"):
        flatten_tree({"state": {0: {"buf": np.zeros(2)}}})
    with pytest.raises(TypeError, match=r"^scheduler.x: tensors are not allowed here, got a torch.float32 tensor"):
        flatten_tree({"scheduler": {"x": torch.zeros(1)}}, allow_tensors=False)


def test_missing_tensor_is_named() -> None:
    _, encoded = flatten_tree({"a": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"tensor 'a' is referenced by the structure but missing"):
        unflatten_tree({}, encoded)
