"""int4 weight-only quantisation (aiayn.inference.int4): torch's kernel and ours equal the fp32 math on the
dequantised grid (ours to the 8-bit rounding of its inputs, each row of a batch bit for bit as alone), logits stay near
fp32, a checkpoint survives save and load bit for bit, and the errors."""

import pytest
import torch
from torch import nn

from aiayn import build_model
from aiayn.inference import gemv
from aiayn.inference.int4 import Int4Linear, quantize_int4
from aiayn.inference.quantization import parse_quantize
from aiayn.pretrained import QUANTIZATION_FILE, load_pretrained, save_pretrained

pytestmark = pytest.mark.skipif(not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"), reason="no int4 CPU kernel in this torch")


@pytest.mark.parametrize("prompt", ["torch", "dequant"])  # 15 rows by torch's kernel or the widened codes
@pytest.mark.parametrize("group", [32, 64])
def test_int4_linear_is_its_dequantised_weight(group, prompt):
    torch.manual_seed(0)
    linear = nn.Linear(128, 40)  # 40 outputs: not a multiple of the kernel's 16 (padded)
    q = Int4Linear.from_linear(linear, group)
    q.prompt = prompt
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


def _our_weight(q: Int4Linear) -> torch.Tensor:
    """The float64 weight our kernel computes with: codes times the bf16 scales, plus the bf16 least values."""
    scale, least = q.scale_least.double().unbind(1)  # (N, G) each
    codes = q.codes().double().reshape(q.out_features, -1, q.group_size)
    return (codes * scale[..., None] + least[..., None]).reshape(q.out_features, q.in_features)


@pytest.mark.parametrize("group", [32, 64, 128])
def test_our_kernel_is_the_dequantised_product_to_its_8_bit_inputs_and_each_row_of_a_batch_as_alone(native_gemv, group):
    torch.manual_seed(0)
    shapes = [(128, 40), (384, 17), (1152, 9)]  # 1-36 groups: odd and even counts, the vector loops' tails
    if group == 32:
        shapes += [(96, 6), (288, 3)]  # an odd number of 32-input chunks: the last one alone
    for in_features, out_features in shapes:
        q = Int4Linear.from_linear(nn.Linear(in_features, out_features), group)
        weight = _our_weight(q)
        # the scales and least values in bf16: within bf16's rounding of the fp32 grid the checkpoint holds
        assert ((weight.float() - q.dequantized()).abs() <= q.scales.max() / 10).all()  # a tenth of a step
        for rows in (1, 2, 3, 5, 8):
            x = torch.randn(rows, in_features) * torch.rand(in_features) * 4  # inputs of several sizes within a group
            for prefetch in (0, gemv.PREFETCH):
                y = torch.ops.aiayn_native.gemv(x, q.weight, q.scale_least, q.bias, prefetch)
                reference = x.double() @ weight.T + q.bias.double()
                # x_i ~ dx k_i with |x_i - dx k_i| <= dx / 2, dx = max |x| / 127 in its group: the error of a row
                bound = (x.abs().amax(-1, keepdim=True).double() / 127 / 2) * weight.abs().sum(-1) + 1e-5 * reference.abs()
                assert ((y.double() - reference).abs() <= bound + 1e-6).all(), (in_features, rows, prefetch)
                alone = torch.stack([torch.ops.aiayn_native.gemv(row, q.weight, q.scale_least, q.bias, prefetch) for row in x])
                assert torch.equal(y, alone), (in_features, group, rows, prefetch)
                bf16 = torch.ops.aiayn_native.gemv(x.bfloat16(), q.weight, q.scale_least, q.bias.bfloat16(), prefetch)
                assert bf16.dtype == torch.bfloat16 and bf16.shape == (rows, out_features)


def test_a_layer_takes_ours_for_one_row_and_a_few_where_timed_faster_and_torchs_for_more(native_gemv):
    torch.manual_seed(0)
    q = Int4Linear.from_linear(nn.Linear(64, 24), 32)
    exact = lambda x: (x.double() @ _our_weight(q).T + q.bias.double()).float()  # noqa: E731
    ours = lambda x, prefetch=0: torch.ops.aiayn_native.gemv(x, q.weight, q.scale_least, q.bias, prefetch)  # noqa: E731
    one, few, more = torch.randn(1, 1, 64), torch.randn(2, 3, 64), torch.randn(gemv.FEW_ROWS + 1, 64)
    with torch.no_grad():
        torch_one = q(one)  # "torch" for every count of rows: bf16 activations
        assert not torch.equal(torch_one, ours(one))
        q.one = "native"
        assert torch.equal(q(one), ours(one))
        torch.testing.assert_close(q(one), exact(one), rtol=2e-2, atol=2e-2)
        assert q.native_call(True, torch.float32).kind == "gemv" and q.native_call(False, torch.float32).kind == "int4"
        q.many = "native-prefetch"
        assert torch.equal(q(few), ours(few, gemv.PREFETCH))
        call = q.native_call(False, torch.float32)
        assert (call.kind, call.param, call.beyond.kind) == ("few", gemv.PREFETCH, "int4")
        assert not torch.equal(q(more), ours(more))  # more rows: torch's kernel
        torch.testing.assert_close(q(more), exact(more), rtol=2e-2, atol=2e-2)


def test_our_kernel_refuses_scales_it_cannot_take(native_gemv):
    codes, x = torch.zeros(4, 48, dtype=torch.uint8), torch.randn(96)
    with pytest.raises(RuntimeError, match=r"a scale goes with int8 weights and 4-bit codes"):
        torch.ops.aiayn_native.gemv(x, codes, None, None, 0)
    for scale in (torch.zeros(4, 2, 3), torch.zeros(4, 2, 1, dtype=torch.bfloat16), torch.zeros(4, 3, dtype=torch.bfloat16)):
        # fp32 scales; one group of 96 inputs (not 32, 64 or 128); no (out, 2, groups) shape
        with pytest.raises(RuntimeError, match=r"4-bit codes \(4, 48\) take bfloat16 scales and least values \(4, 2, groups\), groups of 32, 64 or 128 inputs"):
            torch.ops.aiayn_native.gemv(x, codes, scale, None, 0)
    with pytest.raises(RuntimeError, match=r"the weight takes 96 features"):
        torch.ops.aiayn_native.gemv(torch.randn(48), codes, torch.zeros(4, 2, 3, dtype=torch.bfloat16), None, 0)
