"""int4 weight-only quantisation (aiayn.inference.int4): torch's kernel equals the fp32 math on the
dequantised grid, logits stay near fp32, a checkpoint survives save and load bit for bit, and the errors."""

import pytest
import torch
from torch import nn

from aiayn import build_model
from aiayn.inference.int4 import Int4Linear, quantize_int4
from aiayn.inference.quantization import parse_quantize
from aiayn.pretrained import QUANTIZATION_FILE, load_pretrained, save_pretrained

pytestmark = pytest.mark.skipif(not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"), reason="no int4 CPU kernel in this torch")


@pytest.mark.parametrize("group", [32, 64])
def test_int4_linear_is_its_dequantised_weight(group):
    torch.manual_seed(0)
    linear = nn.Linear(128, 40)  # 40 outputs: not a multiple of the kernel's 16 (padded)
    q = Int4Linear.from_linear(linear, group)
    codes = q.codes()
    assert codes.min() >= 0 and codes.max() <= 15 and q.weight.shape == (40, 64)
    # each group's min and max land on codes 0 and 15; the grid error is at most half a step
    step = q.scales.repeat_interleave(group, dim=1)
    assert ((q.dequantized() - linear.weight).abs() <= step / 2 + 1e-6).all()
    x = torch.randn(3, 5, 128)
    reference = x @ q.dequantized().T + linear.bias
    torch.testing.assert_close(q(x), reference, rtol=2e-2, atol=2e-2)  # bf16 activations (as int8's)
    assert q(x).dtype == torch.float32 and q(x.bfloat16()).dtype == torch.bfloat16


@pytest.mark.parametrize("kind", ["tiny-decoder-only", "tiny-encoder-decoder"])
def test_int4_logits_stay_near_fp32(kind):
    torch.manual_seed(0)
    model = build_model(kind, dropout=0.0).eval()
    ids = torch.randint(3, 64, (2, 9))
    args = (ids, ids[:, :6]) if kind == "tiny-encoder-decoder" else (ids,)
    reference = model(*args)
    out = quantize_int4(model, 32)(*args)
    assert any(isinstance(m, Int4Linear) for m in model.modules())
    # stated tolerance: 20% of the logits' range, for random weights through every layer of both stacks
    # (16 levels a group of 32 weights; each layer alone is exact to its grid, the test above)
    assert (out - reference).abs().max() <= 0.20 * reference.abs().max()


def test_int4_at_load_takes_the_group_size_asked_for(tmp_path):
    """(Save and load bit for bit: tests/inference/test_quantization.py, for int8 and int4 alike.)"""
    torch.manual_seed(0)
    model = build_model("tiny-decoder-only", dropout=0.0).eval()
    loaded_direct = load_pretrained(save_pretrained(tmp_path / "fp", model), quantize="int4-g64").model
    assert {m.group_size for m in loaded_direct.modules() if isinstance(m, Int4Linear)} == {64}
    save_pretrained(tmp_path / "q", loaded_direct)
    assert '"method": "int4-g64"' in (tmp_path / "q" / QUANTIZATION_FILE).read_text()
    assert {m.group_size for m in load_pretrained(tmp_path / "q").model.modules() if isinstance(m, Int4Linear)} == {64}


def test_bad_int4_settings_are_named():
    with pytest.raises(ValueError, match=r"quantize must be one of none, int8, int8-dynamic, int4, int4-g64, int4-g128, got 'int4-g16'"):
        parse_quantize("int4-g16")
    with pytest.raises(ValueError, match=r"group size must be one of \(32, 64, 128\), got 48"):
        quantize_int4(nn.Sequential(nn.Linear(96, 8)), 48)
    with pytest.raises(ValueError, match=r"no nn.Linear layer whose in_features divide into groups of 128"):
        quantize_int4(nn.Sequential(nn.Linear(96, 8)), 128)
