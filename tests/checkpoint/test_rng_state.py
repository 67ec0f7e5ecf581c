"""rng: after a restore the next torch, numpy and Python draws are identical."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from safetensors.torch import load, save

from aiayn.checkpoint.rng_state import capture_rng_state, restore_rng_state


def _draws(gen_t: torch.Generator | None = None, gen_np: np.random.Generator | None = None) -> list[object]:
    out: list[object] = [
        torch.rand(5),
        torch.randn(3),
        torch.nn.functional.dropout(torch.ones(8), 0.5),
        np.random.rand(4),
        np.random.randn(3),  # odd count: leaves a cached gaussian
        random.random(),
        random.gauss(0.0, 1.0),  # leaves gauss_next set
    ]
    if gen_t is not None:
        out.append(torch.rand(4, generator=gen_t))
    if gen_np is not None:
        out.append(gen_np.standard_normal(3))
    return out


def _assert_same_draws(a: list[object], b: list[object]) -> None:
    for x, y in zip(a, b, strict=True):
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y)
        elif isinstance(x, np.ndarray):
            assert np.array_equal(x, y)
        else:
            assert x == y


def test_restore_replays_the_same_draws_through_file_formats() -> None:
    _draws()  # leave cached gaussians in numpy and Python before capturing
    state = capture_rng_state()
    first = _draws()
    tensors = load(save(state.tensors))
    meta = json.loads(json.dumps(state.meta, allow_nan=False))
    restore_rng_state(tensors, meta)
    _assert_same_draws(first, _draws())


def test_the_draws_differ_without_restore() -> None:
    capture_rng_state()
    a, b = _draws(), _draws()
    assert not torch.equal(a[0], b[0]) and a[5] != b[5] and not np.array_equal(a[3], b[3])


def test_named_generators_are_restored_in_place() -> None:
    gen_t = torch.Generator().manual_seed(3)
    gen_np = np.random.default_rng(4)
    gen_mt = np.random.Generator(np.random.MT19937(5))  # its state holds a numpy array
    gens = {"loader": gen_t, "mask": gen_np, "mt": gen_mt}
    state = capture_rng_state(gens)
    first = _draws(gen_t, gen_np) + [gen_mt.random(3)]
    meta = json.loads(json.dumps(state.meta))
    restore_rng_state(load(save(state.tensors)), meta, gens)
    _assert_same_draws(first, _draws(gen_t, gen_np) + [gen_mt.random(3)])


def test_restore_errors_name_what_is_wrong() -> None:
    state = capture_rng_state({"loader": torch.Generator()})
    with pytest.raises(ValueError, match=r"generator 'other' is not in the rng state; saved generators: \['loader'\]"):
        restore_rng_state(state.tensors, state.meta, {"other": torch.Generator()})
    with pytest.raises(TypeError, match=r"generator 'loader' was saved as a torch generator, got a Generator"):
        restore_rng_state(state.tensors, state.meta, {"loader": np.random.default_rng()})
    with pytest.raises(ValueError, match=r"rng state format must be 1, got 7"):
        restore_rng_state(state.tensors, {**state.meta, "format": 7})
    with pytest.raises(ValueError, match=r"rng state lacks the entries \['numpy'\]"):
        restore_rng_state(state.tensors, {k: v for k, v in state.meta.items() if k != "numpy"})
    with pytest.raises(ValueError, match=r"rng state has no 'torch.cpu' tensor"):
        restore_rng_state({}, state.meta)
    with pytest.raises(TypeError, match=r"generators\['x'\] must be a torch.Generator or numpy.random.Generator, got int"):
        capture_rng_state({"x": 3})  # type: ignore[dict-item]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the path where the saved CUDA states cannot be used")
def test_cuda_states_without_cuda_warn_and_the_rest_is_restored() -> None:
    state = capture_rng_state()
    first = _draws()
    tensors = {**state.tensors, "torch.cuda.0": torch.zeros(16, dtype=torch.uint8)}
    with pytest.warns(UserWarning, match=r"rng state holds 1 CUDA generator states but this process sees 0 CUDA devices"):
        restore_rng_state(tensors, {**state.meta, "cuda_devices": 1})
    _assert_same_draws(first, _draws())
