"""The static-cache decoder (prefill + decode_one over preallocated buffers) gives the tokens and
logits of the dynamic cache, padded batches included; compiled, it gives the same tokens again."""

import pytest
import torch
from decoding_helpers import gpt, random_rows

from aiayn.decoding import (
    BeamConfig,
    CausalLMDecoder,
    GenerationConfig,
    beam_search,
    generate,
    left_pad,
)
from aiayn.decoding.static import StaticCausalLMDecoder, StaticState

CONFIG = GenerationConfig(max_new_tokens=8, greedy=True, eos_id=None)


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rotary", "none"])
def test_static_equals_dynamic_cache_on_a_padded_batch(positions):
    model = gpt(positions)
    ids, mask = left_pad(random_rows([5, 2, 3]))
    dynamic, static = CausalLMDecoder(model), StaticCausalLMDecoder(model)
    state_d, logits_d = dynamic.start(ids, mask, max_new_tokens=4)
    state_s, logits_s = static.start(ids, mask, max_new_tokens=4)
    assert isinstance(state_s, StaticState) and state_s.cache.self_attn[0].k.shape[2] == 5 + 4
    for token in torch.tensor([[7, 8, 9], [10, 11, 12], [13, 14, 15]]):
        torch.testing.assert_close(logits_s, logits_d, rtol=1e-5, atol=1e-5)
        logits_d, logits_s = dynamic.step(token, state_d), static.step(token, state_s)
    torch.testing.assert_close(logits_s, logits_d, rtol=1e-5, atol=1e-5)


def test_beam_search_reorders_the_static_cache():
    model = gpt("rotary")
    ids, mask = left_pad(random_rows([4, 2]))
    config = BeamConfig(beam_size=3, max_new_tokens=6)
    assert beam_search(StaticCausalLMDecoder(model), ids, mask, config) == beam_search(CausalLMDecoder(model), ids, mask, config)


def test_alibi_takes_the_general_decoder_and_refuses_compile():
    model = gpt("alibi")
    ids, mask = left_pad(random_rows([4, 2]))
    assert torch.equal(generate(StaticCausalLMDecoder(model), ids, mask, CONFIG).tokens,
                       generate(CausalLMDecoder(model), ids, mask, CONFIG).tokens)
    with pytest.raises(ValueError, match="compile=True needs positions learned, sinusoidal, rotary or none .* got positions='alibi'"):
        StaticCausalLMDecoder(model, compile=True)


@pytest.mark.slow
def test_compiled_decode_step_gives_the_eager_tokens():
    """With the Linear layers as load_pretrained gives them on the CPU (packed for oneDNN; under compile
    they run through the opaque aiayn::packed_linear op)."""
    from aiayn.inference import pack_linears

    model = gpt("sinusoidal")
    assert pack_linears(model) > 0
    ids, mask = left_pad(random_rows([5, 2, 3]))
    eager = generate(StaticCausalLMDecoder(model), ids, mask, CONFIG).tokens
    compiled = generate(StaticCausalLMDecoder(model, compile=True), ids, mask, CONFIG).tokens
    assert torch.equal(compiled, eager)


@pytest.mark.slow
def test_compiled_decode_step_with_int8_weights_gives_the_eager_tokens():
    """int8 weights compile too: the kernel is an opaque op to torch.compile (inductor's own lowering of
    _weight_int8pack_mm failed in torch 2.13 on a CPU without AMX)."""
    from aiayn.inference.quantization import quantize_int8

    model = quantize_int8(gpt("sinusoidal", d_model=32))
    ids, mask = left_pad(random_rows([5, 2, 3]))
    eager = generate(StaticCausalLMDecoder(model), ids, mask, CONFIG).tokens
    compiled = generate(StaticCausalLMDecoder(model, compile=True), ids, mask, CONFIG).tokens
    assert torch.equal(compiled, eager)
