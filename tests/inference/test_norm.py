"""LayerNorm and RMSNorm for inference by our kernel (aiayn.inference.gemv.norm) and the modules that take it at load
(aiayn.nn.norm.use_native_norms): torch's values within each dtype's rounding, each row alike whatever the rows
around it, torch's forward wherever a gradient is wanted, and the choice timed, cached and overridden."""

import pytest
import torch
import torch.nn.functional as F
from choice_helpers import assert_choice_cached
from torch import nn

from aiayn.inference import kernel_choice
from aiayn.nn.norm import NativeLayerNorm, NativeRMSNorm, use_native_norms

TOLERANCE = {torch.float32: 2e-6, torch.bfloat16: 1e-2}




@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(17,), (3, 5, 64), (2, 777)])
def test_values_are_torchs_and_each_row_its_own(native_gemv, dtype, shape):
    torch.manual_seed(sum(shape))
    d = shape[-1]
    x = (torch.randn(shape) * 3 + 1).to(dtype)
    weight, bias = torch.randn(d).to(dtype), torch.randn(d).to(dtype)
    scale = TOLERANCE[dtype]
    for got, want in (
        (native_gemv.norm(x, weight, bias, 1e-5, False), F.layer_norm(x.double(), (d,), weight.double(), bias.double(), 1e-5)),
        (native_gemv.norm(x, None, None, 1e-5, False), F.layer_norm(x.double(), (d,), None, None, 1e-5)),
        (native_gemv.norm(x, weight, None, 1e-6, True), F.rms_norm(x.double(), (d,), weight.double(), 1e-6)),
    ):
        assert got.dtype == dtype and got.shape == x.shape
        torch.testing.assert_close(got.double(), want, rtol=scale, atol=scale)
    rows = x.reshape(-1, d)
    alone = torch.cat([native_gemv.norm(row[None], weight, bias, 1e-5, False) for row in rows])
    assert torch.equal(alone, native_gemv.norm(rows, weight, bias, 1e-5, False))  # a row's bits: the same in any batch


def test_bad_input_names_what_was_expected(native_gemv):
    with pytest.raises(RuntimeError, match="x must be a float32 or bfloat16 CPU tensor, got Half"):
        native_gemv.norm(torch.ones(2, 4, dtype=torch.half), None, None, 1e-5, False)
    with pytest.raises(RuntimeError, match=r"weight and bias must be \(4,\) CPU tensors of x's dtype"):
        native_gemv.norm(torch.ones(2, 4), torch.ones(3), None, 1e-5, False)
    with pytest.raises(RuntimeError, match="RMSNorm has no bias"):
        native_gemv.norm(torch.ones(2, 4), torch.ones(4), torch.ones(4), 1e-5, True)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.LayerNorm(8), nn.RMSNorm(8), nn.LayerNorm(8, bias=False), nn.RMSNorm((2, 4)), nn.LayerNorm((2, 4)))


def test_modules_take_the_kernel_only_without_gradients_and_keep_their_keys(native_gemv, cache, monkeypatch):
    monkeypatch.setenv(kernel_choice.NORM_ENV_VAR, "native")
    model, reference = _model(), _model()
    for m in model.modules():  # trained gains and biases: not the ones and zeros a fresh module has
        for p in m.parameters(recurse=False):
            p.data.normal_()
    reference.load_state_dict(model.state_dict())
    assert use_native_norms(model) == 3  # over one dimension only
    assert [type(m) for m in model] == [NativeLayerNorm, NativeRMSNorm, NativeLayerNorm, nn.RMSNorm, nn.LayerNorm]
    assert list(model.state_dict()) == list(reference.state_dict())
    x = torch.randn(3, 2, 4).reshape(3, 8) * 2
    calls = []
    native = native_gemv.norm
    monkeypatch.setattr(native_gemv, "norm", lambda *a: calls.append(a[-1]) or native(*a))
    for native_norm, torch_norm in zip(list(model)[:3], list(reference)[:3]):
        want = torch_norm(x)
        y = native_norm(x)  # parameters that want a gradient: torch's forward, bit for bit
        assert torch.equal(y, want) and y.grad_fn is not None
        with torch.no_grad():
            y = native_norm(x)
        torch.testing.assert_close(y, want.detach(), rtol=2e-6, atol=2e-6)
    assert calls == [False, True, False]


def test_the_choice_is_timed_cached_and_overridden(native_gemv, cache, monkeypatch):
    monkeypatch.setattr(kernel_choice, "_time_norm", lambda dtype: {"torch": 2.0, "native": 1.0})
    assert use_native_norms(_model()) == 3
    assert_choice_cached(monkeypatch, cache, "norm", kernel_choice.choose_norm)
    monkeypatch.setenv(kernel_choice.NORM_ENV_VAR, "torch")
    assert use_native_norms(_model()) == 0
