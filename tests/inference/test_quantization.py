"""int8 weight-only quantisation: the grid and its scales, logits near fp32, a checkpoint (int8, and int4 the
same way) that survives save and load bit for bit, and the errors (no Linear layer, no kernel, unknown method)."""

import pytest
import torch
from torch import nn

from aiayn import build_model
from aiayn.inference import Int8Linear, quantization, quantize_int8
from aiayn.inference.quantization import quantize
from aiayn.pretrained import QUANTIZATION_FILE, load_pretrained, save_pretrained

torch.set_num_threads(1)


def tiny(kind="tiny-decoder-only", **overrides):
    torch.manual_seed(0)
    return build_model(kind, dropout=0.0, **overrides).eval()


@pytest.mark.parametrize("prompt", ["torch", "dequant"])  # a prompt's rows (15 here) by torch's kernel or the widened weight
@pytest.mark.parametrize("in_features", [32, 20])  # 20: not a multiple of 16, the dequantising fallback
def test_int8_linear_matches_its_dequantised_weight(in_features, prompt):
    torch.manual_seed(0)
    linear = nn.Linear(in_features, 24)
    q = Int8Linear.from_linear(linear)
    q.prompt = prompt
    assert q.weight.dtype == torch.int8 and q.scale.dtype == torch.float32
    # every row's largest weight lands on +-127 and the grid error is at most half a step
    assert torch.equal(q.weight.abs().amax(dim=1), torch.full((24,), 127, dtype=torch.int8))
    assert ((q.dequantized() - linear.weight).abs() <= q.scale[:, None] / 2 + 1e-7).all()
    x = torch.randn(3, 5, in_features)
    reference = x @ q.dequantized().T + linear.bias  # fp32 math on the int8 grid
    torch.testing.assert_close(q(x), reference, rtol=2e-2, atol=2e-2)  # bf16 activations
    assert q(x).dtype == torch.float32 and q(x.half()).dtype == torch.float16


# stated tolerances, of the logits' range: int8, its grid and bf16 activations; int8-dynamic, its grid and an 8-bit
# grid of each call's input
@pytest.mark.parametrize(("method", "tolerance"), [("int8", 0.02), ("int8-dynamic", 0.03)])
@pytest.mark.parametrize("kind", ["tiny-decoder-only", "tiny-encoder-decoder", "tiny-encoder-only"])
def test_quantised_logits_stay_near_fp32(kind, method, tolerance):
    model = tiny(kind)
    ids = torch.randint(3, 64, (2, 9))
    args = (ids, ids[:, :6]) if kind == "tiny-encoder-decoder" else (ids,)
    reference = model(*args)
    quantised = quantize(model, method)
    assert not any(isinstance(m, nn.Linear) for m in quantised.modules())
    out = quantised(*args)
    assert (out - reference).abs().max() <= tolerance * reference.abs().max()


@pytest.mark.parametrize("method", ["int8", "int8-dynamic", "int4"])
def test_quantised_checkpoint_survives_save_and_load_bit_for_bit(tmp_path, method):
    if method == "int4" and not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
        pytest.skip("no int4 CPU kernel in this torch")
    model = quantize(tiny(), method)
    save_pretrained(tmp_path / "q", model)
    assert f'"method": "{method}"' in (tmp_path / "q" / QUANTIZATION_FILE).read_text()
    loaded = load_pretrained(tmp_path / "q").model  # quantised without being asked: the directory says so
    before, after = model.state_dict(), loaded.state_dict()
    assert before.keys() == after.keys()
    for key in before:
        assert before[key].dtype == after[key].dtype and torch.equal(before[key], after[key]), key
    ids = torch.randint(3, 64, (2, 7))
    assert torch.equal(model(ids), loaded(ids))


def test_quantize_at_load_equals_quantize_in_memory(tmp_path):
    model = tiny()
    save_pretrained(tmp_path / "m", model)
    loaded = load_pretrained(tmp_path / "m", quantize="int8").model
    ids = torch.randint(3, 64, (2, 7))
    assert torch.equal(loaded(ids), quantize_int8(model)(ids))


def test_quantising_a_model_without_linear_layers_is_an_error():
    with pytest.raises(ValueError, match=r"quantize='int8': Sequential has no nn.Linear layer .*accepted"):
        quantize_int8(nn.Sequential(nn.ReLU()))


def test_a_build_without_the_kernel_is_refused_before_loading(tmp_path, monkeypatch):
    save_pretrained(tmp_path / "q", quantize_int8(tiny()))
    monkeypatch.setattr(quantization, "_kernel", lambda: None)
    with pytest.raises(RuntimeError, match=r"quantize='int8' needs torch.ops.aten._weight_int8pack_mm .* accepted: quantize one of none, int8"):
        load_pretrained(tmp_path / "q")
    with pytest.raises(RuntimeError, match="_weight_int8pack_mm"):
        quantize_int8(tiny())


@pytest.mark.parametrize(("argument", "value", "message"), [
    ("quantize", "int3", "quantize must be one of none, int8, int8-dynamic, int4, int4-g64, int4-g128, got 'int3'"),
    ("dtype", "float64", "dtype must be one of float32, bfloat16, float16, got 'float64'"),
])
def test_unknown_choices_are_named(tmp_path, argument, value, message):
    save_pretrained(tmp_path / "m", tiny())
    with pytest.raises(ValueError, match=message):
        load_pretrained(tmp_path / "m", **{argument: value})


def test_an_eager_decode_step_casts_only_where_the_activations_change_dtype():
    """A bf16 model, int8 or not, decodes a step without a single cast; an fp32 model with int8 layers (which
    compute in bf16) casts each layer's input to bf16 and widens its output back, and nothing else: no
    scale, bias, position or cache casts."""
    import copy

    from torch.profiler import profile

    from aiayn.decoding import CausalLMDecoder
    from aiayn.inference import cast_model

    def casts(model):
        decoder = CausalLMDecoder(model, static_cache=True)
        state, logits = decoder.start(torch.tensor([[5, 6, 7]]), max_new_tokens=4)
        tokens = decoder.step(logits.argmax(-1), state).argmax(-1)  # the first step
        with profile() as prof:
            decoder.step(tokens, state)
        return sum(event.count for event in prof.key_averages() if event.key == "aten::_to_copy")

    model = tiny()
    assert casts(cast_model(copy.deepcopy(model), torch.bfloat16)) == 0
    assert casts(cast_model(quantize_int8(copy.deepcopy(model)), torch.bfloat16)) == 0
    int8 = quantize_int8(copy.deepcopy(model))
    assert casts(int8) == 2 * sum(isinstance(m, Int8Linear) for m in int8.modules())


def test_a_prompt_widens_the_int8_weight_above_its_rows_and_in_bf16_only(monkeypatch):
    """``prompt='dequant'``: more rows than gemv.FEW_ROWS in bf16 (fp32 inputs compute in bf16) take the widened weight;
    fewer rows, and fp16 activations (not what was timed), keep torch's kernel."""
    torch.manual_seed(0)
    q = Int8Linear.from_linear(nn.Linear(32, 24))
    q.prompt = "dequant"
    widened = []
    monkeypatch.setattr(quantization, "dequantized_mm", lambda *args: widened.append(args[0].shape) or torch.mm(args[0], args[1].to(args[0].dtype).t()).mul_(args[2]))
    q(torch.randn(9, 32))
    q(torch.randn(8, 32))
    q(torch.randn(9, 32).half())
    assert widened == [(9, 32)]
