"""int8 weights and activations (``quantize="int8-dynamic"``): the product of the two 8-bit grids, the same stored grid
as weight-only int8, a compiled call equal to the eager one, and the errors (logits near fp32, save and load:
test_quantization.py; fusion: test_fusion.py)."""

import pytest
import torch
from torch import nn

from aiayn import build_model
from aiayn.inference import int8_dynamic
from aiayn.inference.int8_dynamic import Int8DynamicLinear
from aiayn.inference.quantization import Int8Linear, quantize, quantize_int8

torch.set_num_threads(1)


def fake_quantized_input(x: torch.Tensor) -> torch.Tensor:
    """``x`` on the uint8 grid of its own min..max (zero exactly representable), as FBGEMM quantises an input."""
    low, high = min(x.min().item(), 0.0), max(x.max().item(), 0.0)
    scale = (high - low) / 255
    zero = round(-low / scale)
    return (torch.clamp(torch.round(x / scale) + zero, 0, 255) - zero) * scale


def test_a_call_is_the_product_of_the_two_grids():
    torch.manual_seed(0)
    linear = nn.Linear(48, 24)
    q = Int8DynamicLinear.from_linear(linear)
    weight_only = Int8Linear.from_linear(linear)
    assert torch.equal(q.weight, weight_only.weight) and torch.equal(q.scale, weight_only.scale)  # the same stored grid
    x = torch.randn(1, 48)
    reference = fake_quantized_input(x) @ q.dequantized().T + linear.bias
    torch.testing.assert_close(q(x), reference, rtol=1e-4, atol=1e-4)
    assert q(x.bfloat16()).dtype == torch.bfloat16
    with torch.no_grad():  # a changed weight is packed again at the next call
        q.weight.mul_(-1)
    torch.testing.assert_close(q(x), fake_quantized_input(x) @ q.dequantized().T + linear.bias, rtol=1e-4, atol=1e-4)


def test_a_compiled_call_gives_the_eager_result():
    torch.manual_seed(0)
    layer = Int8DynamicLinear.from_linear(nn.Linear(32, 16))
    x = torch.randn(1, 32)
    compiled = torch.compile(lambda t: layer(t) * 2, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x), layer(x) * 2)


def test_a_build_without_the_engine_is_refused(monkeypatch):
    monkeypatch.setattr(int8_dynamic, "_ENGINE", "no-such-engine")
    with pytest.raises(RuntimeError, match=r"quantize='int8-dynamic' needs FBGEMM.*accepted instead: quantize='int8'"):
        quantize_int8(nn.Sequential(nn.Linear(16, 4)), dynamic=True)


def test_speculative_decoding_refuses_it():
    """A call's rows share one activation range, so checking K + 1 tokens at once is not plain decoding."""
    from aiayn.decoding.speculative import SpeculativeDecoder

    model = quantize(build_model("tiny-decoder-only", dropout=0.0).eval(), "int8-dynamic")
    with pytest.raises(ValueError, match=r"quantize='int8-dynamic' cannot promise .* it works with quantize='int8'"):
        SpeculativeDecoder(model, mode="prompt-lookup")
