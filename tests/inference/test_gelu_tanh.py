"""GPT-2's GELU (tanh's approximation) by our kernel (aiayn.inference.gemv.gelu_tanh) and the layer's choice of it
(aiayn.inference.kernel_choice.choose_gelu_tanh): torch's values and gradients in float64 within each dtype's
rounding (tails off the vector width, large arguments, zeros), bf16 rounded as torch rounds; chosen by timing, cached,
overridden; torch's kernel in a graph being compiled."""

import pytest
import torch
import torch.nn.functional as F
from choice_helpers import assert_choice_cached

from aiayn.inference import kernel_choice
from aiayn.nn import feedforward

TOLERANCE = {torch.float32: 2e-6, torch.bfloat16: 1e-2}




@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(37,), (3, 5, 64), (2, 1000)])
def test_values_and_gradients_are_torchs(native_gemv, dtype, shape):
    torch.manual_seed(sum(shape))
    x = (torch.randn(shape) * 4).to(dtype)
    x.view(-1)[:6] = torch.tensor([0.0, -30.0, 30.0, 1e-4, -1e-4, 88.0]).to(dtype)
    grad = torch.randn(shape).to(dtype)
    wide = x.double().requires_grad_()
    F.gelu(wide, approximate="tanh").backward(grad.double())
    y, dx = native_gemv.gelu_tanh(x), native_gemv.gelu_tanh_backward(grad, x)
    assert y.dtype == dx.dtype == dtype and y.shape == dx.shape == x.shape
    scale = TOLERANCE[dtype]
    torch.testing.assert_close(y.double(), F.gelu(x.double(), approximate="tanh"), rtol=scale, atol=scale)
    torch.testing.assert_close(dx.double(), wide.grad, rtol=scale, atol=4 * scale)
    if dtype == torch.bfloat16:  # the fp32 result rounded as torch rounds it
        assert torch.equal(y, native_gemv.gelu_tanh(x.float()).bfloat16())


def test_the_layer_takes_the_faster_kernel_cached_and_the_override(native_gemv, cache, monkeypatch):
    times = {"torch": 2.0, "native": 1.0}
    monkeypatch.setattr(kernel_choice, "_time_gelu_tanh", lambda dtype: times)
    calls = []
    native = native_gemv.gelu_tanh
    monkeypatch.setattr(native_gemv, "gelu_tanh", lambda x: calls.append(x.shape) or native(x))
    x = torch.randn(4, 8, requires_grad=True)
    y = feedforward.gelu_tanh(x)
    y.sum().backward()
    assert calls == [(4, 8)] and y.grad_fn is not None
    torch.testing.assert_close(x.grad, torch.autograd.grad(F.gelu(x, approximate="tanh").sum(), x)[0])
    with torch.no_grad():  # no gradient to keep: the kernel alone, not autograd's Function around it
        y = feedforward.gelu_tanh(x)
    assert calls == [(4, 8), (4, 8)] and y.grad_fn is None and torch.equal(y, native(x.detach()))
    assert_choice_cached(monkeypatch, cache, "gelu_tanh", kernel_choice.choose_gelu_tanh)
    monkeypatch.setenv(kernel_choice.ACTIVATION_ENV_VAR, "torch")
    calls.clear()
    feedforward.gelu_tanh(x)
    assert calls == []


def test_without_our_library_torchs_kernel_runs_and_native_is_refused(cache, monkeypatch):
    monkeypatch.setattr(kernel_choice, "gemv_available", lambda: False)
    monkeypatch.setattr(kernel_choice, "unavailable_reason", lambda: "no C++ compiler")
    assert kernel_choice.choose_gelu_tanh(torch.float32) == "torch"
    kernel_choice._NATIVE_CHOSEN.clear()
    monkeypatch.setenv(kernel_choice.ACTIVATION_ENV_VAR, "native")
    with pytest.raises(ValueError, match=r"\$AIAYN_ACTIVATION_KERNEL=native: our GELU kernel cannot run here \(no C\+\+ compiler\)"):
        kernel_choice.choose_gelu_tanh(torch.float32)


def test_a_graph_being_compiled_takes_torchs(native_gemv, cache, monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    monkeypatch.setattr(kernel_choice, "choose_gelu_tanh", lambda dtype: pytest.fail("asked while compiling"))
    x = torch.randn(5)
    assert torch.equal(feedforward.gelu_tanh(x), F.gelu(x, approximate="tanh"))


def test_a_training_run_decides_once_before_its_first_step_and_trains_through_it(native_gemv, cache, tmp_path, monkeypatch):
    """``aiayn train`` of a model with GPT-2's GELU times our GELU and our loss once each, before the first step (the
    answers rank 0's under torchrun), and its steps run them; the loss stays torch's kernels' within fp32 rounding."""
    from loop_fixtures import lm_config

    from aiayn.inference import gemv
    from aiayn.training.config import ModelSection
    from aiayn.training.loop import train

    timed, calls = [], []
    monkeypatch.setattr(kernel_choice, "_time_gelu_tanh", lambda dtype: timed.append(("gelu", dtype)) or {"torch": 2.0, "native": 1.0})
    monkeypatch.setattr(kernel_choice, "_time_cross_entropy", lambda dtype: timed.append(("loss", dtype)) or {"torch": 2.0, "native": 1.0})
    native, rows = gemv.gelu_tanh, torch.ops.aiayn_native.cross_entropy_rows
    monkeypatch.setattr(gemv, "gelu_tanh", lambda x: calls.append("gelu") or native(x))
    monkeypatch.setattr(torch.ops.aiayn_native, "cross_entropy_rows", lambda *a: calls.append("loss") or rows(*a), raising=False)
    losses = {}
    for kernel in ("measure", "torch"):
        monkeypatch.setenv(kernel_choice.ACTIVATION_ENV_VAR, kernel)
        monkeypatch.setenv(kernel_choice.LOSS_ENV_VAR, kernel)
        kernel_choice._NATIVE_CHOSEN.clear()
        config = lm_config(tmp_path / kernel, steps=2)
        config.model = ModelSection(preset="tiny-decoder-only", dropout=0.0, max_len=16, activation="gelu_tanh")
        metrics = train(config).metrics
        losses[kernel] = metrics.get("val_loss", metrics.get("train_loss"))
        if kernel == "measure":
            assert sorted(timed) == [("gelu", torch.float32), ("loss", torch.float32)]  # timed once each
            assert {"gelu", "loss"} <= set(calls)  # the steps ran our kernels
            calls.clear()
    assert calls == []  # and only under measure
    assert abs(losses["measure"] - losses["torch"]) < 1e-4
