"""Real half-precision weights: cast once at load, logits near fp32, cached = uncached decoding in
every dtype path (bf16, fp16, int8) for both generative families, beam scores computed in fp32."""

import pytest
import torch

from aiayn import build_model
from aiayn.decoding import (
    BeamConfig,
    CausalLMDecoder,
    Seq2SeqDecoder,
    beam_search,
    left_pad,
    right_pad,
)
from aiayn.inference import cast_model, quantize_int8
from aiayn.pretrained import load_pretrained, save_pretrained

torch.set_num_threads(1)
STEPS = 6
# max |difference| over max |logit|, per path: the dtype's rounding through a 2-layer model
TOLERANCE = {"float32": 1e-5, "bfloat16": 3e-2, "float16": 5e-3, "int8": 3e-2}


def tiny(kind, positions="learned"):
    torch.manual_seed(0)
    return build_model(kind, dropout=0.0, positions=positions).eval()


def transformed(model, path):
    if path == "int8":
        return quantize_int8(model)
    return cast_model(model, getattr(torch, path))


def forced(decoder, ids, mask, feed):
    """Logits after start and after feeding each column of ``feed``, as fp32 ``(B, 1 + STEPS, V)``."""
    state, logits = decoder.start(ids, mask, max_new_tokens=STEPS + 1)
    out = [logits]
    for i in range(feed.shape[1]):
        out.append(decoder.step(feed[:, i], state))
    return torch.stack(out, dim=1).float()


@pytest.mark.parametrize("path", list(TOLERANCE))
@pytest.mark.parametrize("kind", ["tiny-decoder-only", "tiny-encoder-decoder"])
def test_cached_equals_uncached_in_every_dtype_path(kind, path):
    model = transformed(tiny(kind), path)
    rows = [[5, 6, 7, 8, 9], [9, 10], [11, 12, 13]]
    feed = torch.randint(3, 64, (3, STEPS), generator=torch.Generator().manual_seed(1))
    if kind == "tiny-decoder-only":
        ids, mask = left_pad(rows)
        decoders = [CausalLMDecoder(model), CausalLMDecoder(model, static_cache=True), CausalLMDecoder(model, use_cache=False)]
    else:
        ids, mask = right_pad(rows)
        decoders = [Seq2SeqDecoder(model), Seq2SeqDecoder(model, use_cache=False)]
    logits = [forced(d, ids, mask, feed) for d in decoders]
    scale = logits[-1].abs().max()
    for other in logits[:-1]:
        assert torch.isfinite(other).all()
        assert (other - logits[-1]).abs().max() <= TOLERANCE[path] * scale


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_weights_are_cast_once_at_load_and_stay_near_fp32(tmp_path, dtype):
    model = tiny("tiny-decoder-only")
    save_pretrained(tmp_path / "m", model)
    half = load_pretrained(tmp_path / "m", dtype=dtype).model
    assert {p.dtype for p in half.parameters()} == {getattr(torch, dtype)}  # the weights themselves, not autocast
    ids = torch.randint(3, 64, (2, 9))
    reference, out = model(ids), half(ids)
    assert out.dtype == getattr(torch, dtype)
    assert (out.float() - reference).abs().max() <= TOLERANCE[dtype] * reference.abs().max()


@pytest.mark.parametrize("path", ["bfloat16", "float16", "int8"])
def test_beam_scores_are_fp32_log_probabilities_of_the_model(path):
    model = transformed(tiny("tiny-encoder-decoder", "sinusoidal"), path)
    src, mask = right_pad([[5, 6, 7, 8], [9, 10, 11]])
    config = BeamConfig(beam_size=3, max_new_tokens=5, min_new_tokens=5, length_penalty=0.0)
    for row, (best,) in enumerate(beam_search(model, src, mask, config)):
        tgt = torch.tensor([[1] + best.tokens])  # BOS + hypothesis, teacher-forced without a cache
        with torch.no_grad():
            log_probs = model(src[row : row + 1], tgt[:, :-1], src_mask=mask[row : row + 1]).float().log_softmax(-1)
        expected = log_probs[0, torch.arange(len(best.tokens)), torch.tensor(best.tokens)].sum()
        assert best.log_prob == pytest.approx(float(expected), abs=0.05)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_packed_linear_computes_the_plain_linear_and_repacks_after_a_change(dtype):
    from torch import nn

    from aiayn.inference import PackedLinear, pack_linears

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 48)).to(dtype)
    plain = model[0]
    x = torch.randn(2, 3, 32, dtype=dtype)
    expected = torch.nn.functional.linear(x, plain.weight, plain.bias)
    if pack_linears(model) == 0:
        pytest.skip(f"torch's oneDNN cannot pack {dtype} here")
    assert isinstance(model[0], PackedLinear) and model[0].weight is plain.weight  # the same parameter
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=1e-2, atol=1e-2)
        model[0].weight.mul_(2)  # an in-place change: the packed copy must follow
        assert not torch.allclose(torch.nn.functional.linear(x, plain.weight, plain.bias), expected, rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(model(x), torch.nn.functional.linear(x, plain.weight, plain.bias), rtol=1e-2, atol=1e-2)


def _packed_pair():
    from torch import nn

    from aiayn.inference import PackedLinear, pack_linears

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 48), nn.GELU(), nn.Linear(48, 8, bias=False))
    plain = [model[0].weight.detach().clone(), model[0].bias.detach().clone(), model[2].weight.detach().clone()]
    if pack_linears(model) != 2:
        pytest.skip("torch's oneDNN cannot pack fp32 Linear layers here")
    assert all(isinstance(model[i], PackedLinear) and isinstance(model[i], nn.Linear) for i in (0, 2))
    return model, plain


def test_packed_fp32_linears_train_through_the_plain_path_and_keep_their_checkpoint_keys():
    """A loaded (packed) model can be fine-tuned: with grad enabled the plain F.linear runs and gradients flow;
    the state dict is the nn.Linear one; after the optimizer step inference uses the new weights."""
    import copy

    from torch.nn.functional import gelu, linear

    model, (w0, b0, w2) = _packed_pair()
    assert set(model.state_dict()) == {"0.weight", "0.bias", "2.weight"}
    x = torch.randn(4, 32)
    model(x).square().sum().backward()
    assert model[0].weight.grad is not None and model[2].weight.grad is not None
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert not torch.equal(model[0].weight, w0)
    with torch.no_grad():
        expected = linear(gelu(linear(x, model[0].weight, model[0].bias)), model[2].weight)
        torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)
        clone = copy.deepcopy(model)  # oneDNN's packed tensors cannot be copied: the copy packs its own
        torch.testing.assert_close(clone(x), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("freezing", [True, False], ids=["frozen", "not-frozen"])
def test_compiled_packed_linears_give_the_eager_result(freezing):
    """Compiled with Inductor's freezing (as the decode step is), the packed weights enter the graph as constants and
    oneDNN's kernel runs in it; compiled without, the plain matmul runs. Both give the eager result."""
    import torch._inductor.config as inductor_config
    from torch._inductor.utils import run_and_get_code

    model, _ = _packed_pair()
    x = torch.randn(3, 32)
    torch._dynamo.reset()
    with torch.no_grad(), inductor_config.patch(freezing=freezing, **{"cpp.weight_prepack": False}):
        eager = model(x)
        compiled, code = run_and_get_code(torch.compile(model, fullgraph=True, dynamic=False), x)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    assert ("mkldnn._linear_pointwise" in "".join(code)) is freezing


def test_bfloat16_without_native_support_loads_with_a_warning(tmp_path, monkeypatch, caplog):
    """On a CPU without AMX or AVX512-BF16 bf16 weights run, slowly: the loader says so."""
    import logging

    import aiayn.pretrained as pretrained

    path = save_pretrained(tmp_path / "m", tiny("tiny-decoder-only"))
    monkeypatch.setattr(pretrained, "native_bf16", lambda device: False)
    with caplog.at_level(logging.WARNING, logger="aiayn.pretrained"):
        model = load_pretrained(path, dtype="bfloat16").model
    assert next(model.parameters()).dtype == torch.bfloat16
    assert "without native bf16" in caplog.text
    caplog.clear()
    monkeypatch.setattr(pretrained, "native_bf16", lambda device: True)
    with caplog.at_level(logging.WARNING, logger="aiayn.pretrained"):
        load_pretrained(path, dtype="bfloat16")
    assert "without native bf16" not in caplog.text


def test_a_packed_model_cast_afterwards_still_computes_its_linear():
    """A loaded (packed) fp32 model cast to bf16 by the user: packed again where oneDNN can pack bf16 here,
    else the plain F.linear; the result is the layer's either way."""
    from torch.nn.functional import linear

    model, _ = _packed_pair()
    model.to(torch.bfloat16)
    x = torch.randn(3, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        expected = linear(torch.nn.functional.gelu(linear(x, model[0].weight, model[0].bias)), model[2].weight)
        torch.testing.assert_close(model(x), expected, rtol=1e-2, atol=1e-2)


def test_pack_false_loads_plain_linears_with_the_same_logits(tmp_path):
    """``pack=False`` (``aiayn.load``, ``load_pretrained``, ``load_served_model``) holds each weight once, as a plain
    ``nn.Linear``; the logits are the packed model's. The default packs where oneDNN can (fp32 on any x86 CPU)."""
    import aiayn
    from aiayn.inference import PackedLinear
    from aiayn.inference.precision import can_pack
    from aiayn.serve import load_served_model
    from aiayn.tokenization import CharTokenizer

    tokenizer = CharTokenizer.train(["a cat sat", "the dog"])
    torch.manual_seed(0)
    model = build_model("tiny-decoder-only", vocab_size=tokenizer.vocab_size, dropout=0.0).eval()
    path = save_pretrained(tmp_path / "m", model, tokenizer)
    packed = load_pretrained(path).model
    assert any(isinstance(m, PackedLinear) for m in packed.modules()) == can_pack(torch.zeros(4, 4))  # fp32 here
    plain = [load_pretrained(path, pack=False).model, aiayn.load(path, pack=False).model,
             load_served_model(path, pack=False).model]
    ids = torch.randint(0, tokenizer.vocab_size, (2, 5))
    with torch.no_grad():
        expected = packed(ids)
        for loaded in plain:
            assert not any(isinstance(m, PackedLinear) for m in loaded.modules())
            assert any(type(m) is torch.nn.Linear for m in loaded.modules())
            torch.testing.assert_close(loaded(ids), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="pack must be True or False, got 'no'"):
        load_pretrained(path, pack="no")


def test_a_model_read_only_for_its_config_is_not_packed(tmp_path, monkeypatch):
    """``train.init_from`` loads a directory for its config and tokenizers and reads the weights itself:
    it must not pack (time and a second copy of every weight, thrown away)."""
    import aiayn.pretrained as pretrained
    from aiayn.tokenization import CharTokenizer
    from aiayn.training.init_from import read_init

    tokenizer = CharTokenizer.train(["a cat sat"])
    model = build_model("tiny-decoder-only", vocab_size=tokenizer.vocab_size, dropout=0.0)
    path = save_pretrained(tmp_path / "m", model, tokenizer)

    def refuse(model):
        raise AssertionError("packed a model that is never run")

    monkeypatch.setattr(pretrained, "pack_linears", refuse)
    init = read_init(str(path))
    assert init.config.family == "decoder-only" and init.tokenizers is not None
    expected = model.state_dict()
    assert init.state and all(torch.equal(tensor, expected[name]) for name, tensor in init.state.items())
