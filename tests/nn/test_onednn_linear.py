"""fp32 training's Linear layers through oneDNN (aiayn.nn.onednn_linear): the same values and gradients as
``F.linear`` (against a float64 reference), the same state, and a choice per shape that is timed, cached and
overridable (aiayn.inference.kernel_choice.choose_training_kernels)."""

import json
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from aiayn.inference import kernel_choice
from aiayn.nn.onednn_linear import OneDNNLinear, OneDNNLinearFunction, linear, use_training_kernels

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN")


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("contiguous", [True, False])
def test_values_and_gradients_match_a_float64_reference(bias, contiguous, linear_results):
    g = torch.Generator().manual_seed(0)
    x64 = torch.randn(3, 4, 7, 24, generator=g, dtype=torch.float64)  # (..., rows, in): more than two dimensions
    if not contiguous:
        x64 = x64.transpose(1, 2)  # a strided input, as attention's merged heads can be
    w64 = torch.randn(40, 24, generator=g, dtype=torch.float64) / 5
    b64 = torch.randn(40, generator=g, dtype=torch.float64) if bias else None
    grad64 = torch.randn(*x64.shape[:-1], 40, generator=g, dtype=torch.float64)

    ours = linear_results(OneDNNLinearFunction.apply, torch.float32, x64, w64, b64, grad64)
    reference = linear_results(F.linear, torch.float64, x64, w64, b64, grad64)
    for name, a, b in zip(("output", "dL/dx", "dL/dW", "dL/db"), ours, reference):
        assert a.shape == b.shape, name
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4, msg=name)


def test_other_dtypes_autocast_and_float64_take_f_linear():
    x, w = torch.randn(5, 8, dtype=torch.float64), torch.randn(3, 8, dtype=torch.float64)
    assert torch.equal(linear(x, w), F.linear(x, w))  # float64: oneDNN has no such matmul
    x32, w32 = torch.randn(5, 8), torch.randn(3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert linear(x32, w32).dtype == torch.bfloat16  # autocast's cast is kept
    assert linear(x32.requires_grad_(True), w32).grad_fn.name() == "OneDNNLinearFunctionBackward"


def test_a_model_keeps_its_keys_ties_and_gradients_with_onednn(monkeypatch):
    monkeypatch.setenv(kernel_choice.ENV_VAR, "packed")  # oneDNN wherever it can
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16, bias=False))
    model[2].weight = model[0].weight  # tied, as an output projection to its embedding
    keys = list(model.state_dict())
    x = torch.randn(6, 16)
    expected = model(x).square().mean()
    expected.backward()
    expected_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    assert use_training_kernels(model, rows=6) == 2
    assert [type(m) for m in model if isinstance(m, nn.Linear)] == [OneDNNLinear, OneDNNLinear]
    assert list(model.state_dict()) == keys and model[2].weight is model[0].weight
    loss = model(x).square().mean()
    loss.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-6)
    for a, b in zip(model.parameters(), expected_grads):  # the tied weight's two gradients summed, as before
        torch.testing.assert_close(a.grad, b, rtol=1e-5, atol=1e-6)


def test_plain_override_keeps_mkl(monkeypatch):
    monkeypatch.setenv(kernel_choice.ENV_VAR, "plain")
    model = nn.Sequential(nn.Linear(8, 8))
    assert use_training_kernels(model, rows=4) == 0 and type(model[0]) is nn.Linear


def test_the_choice_is_timed_once_per_shape_cached_and_obeyed(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv(kernel_choice.ENV_VAR, "measure")
    monkeypatch.setattr(kernel_choice, "_others_share", lambda start, end: 0.0)  # a quiet machine (the other test worker is not)
    timed = []

    def fake(weight, rows):  # 8 -> 16 is faster by oneDNN, 16 -> 8 by MKL
        timed.append((weight.shape[1], rows))
        return {"plain": 2.0, "onednn": 1.0} if weight.shape[1] == 8 else {"plain": 1.0, "onednn": 2.0}

    monkeypatch.setattr(kernel_choice, "_time_training", fake)
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8), nn.Linear(8, 16))
    with caplog.at_level(logging.INFO, logger="aiayn.inference.kernel_choice"):
        assert use_training_kernels(model, rows=4096) == 2
    assert [type(m) for m in model] == [OneDNNLinear, nn.Linear, OneDNNLinear]
    assert sorted(timed) == [(8, kernel_choice.TRAINING_ROWS), (16, kernel_choice.TRAINING_ROWS)]  # rows capped; shapes once
    assert "8->16 float32 train 512 rows: plain 2.000, onednn 1.000 ms (forward and backward) -> onednn" in caplog.text
    table = json.loads((tmp_path / "aiayn" / "kernels.json").read_text())[kernel_choice.machine_key()]
    assert table == {"8->16 float32 train 512 rows": "onednn", "16->8 float32 train 512 rows": "plain"}

    monkeypatch.setattr(kernel_choice, "_time_training", lambda w, rows: pytest.fail("timed a shape the cache decides"))
    again = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8))
    assert use_training_kernels(again, rows=4096) == 1 and [type(m) for m in again] == [OneDNNLinear, nn.Linear]


def test_a_choice_made_elsewhere_is_obeyed_without_timing(monkeypatch):
    """Distributed training: rank 0's choice, one per fp32 Linear layer, taken by every rank as it is."""
    monkeypatch.setenv(kernel_choice.ENV_VAR, "measure")
    monkeypatch.setattr(kernel_choice, "_time_training", lambda w, rows: pytest.fail("timed a choice given"))
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8))
    assert use_training_kernels(model, rows=64, kernels=["plain", "onednn"]) == 1
    assert [type(m) for m in model] == [nn.Linear, OneDNNLinear]
    with pytest.raises(ValueError, match="kernels: 1 choices for 2 fp32 Linear layers"):
        use_training_kernels(nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8)), rows=64, kernels=["plain"])


def test_the_real_timing_returns_both_kernels():
    times = kernel_choice._time_training(torch.randn(16, 8), rows=32)
    assert set(times) == {"plain", "onednn"} and all(t > 0 for t in times.values())
