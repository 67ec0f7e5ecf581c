"""The static cache (preallocated buffers, through the model's own forward) gives the tokens and
logits of the growing cache, padded batches included. Compiled decoding (fp32 with packed Linear
layers, and int8) is a cell of tests/conformance, which compiles once for the whole matrix."""

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
from aiayn.decoding.adapters import StaticState

CONFIG = GenerationConfig(max_new_tokens=8, greedy=True, eos_id=None)


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rotary", "none"])
def test_static_equals_dynamic_cache_on_a_padded_batch(positions):
    model = gpt(positions)
    ids, mask = left_pad(random_rows([5, 2, 3]))
    dynamic, static = CausalLMDecoder(model), CausalLMDecoder(model, static_cache=True)
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
    assert beam_search(CausalLMDecoder(model, static_cache=True), ids, mask, config) == beam_search(CausalLMDecoder(model), ids, mask, config)


def test_alibi_takes_the_general_decoder_and_refuses_compile():
    model = gpt("alibi")
    ids, mask = left_pad(random_rows([4, 2]))
    assert torch.equal(generate(CausalLMDecoder(model, static_cache=True), ids, mask, CONFIG).tokens,
                       generate(CausalLMDecoder(model), ids, mask, CONFIG).tokens)
    with pytest.raises(ValueError, match="compile=True needs a static KV cache .* this model has positions='alibi': decode it without compile"):
        CausalLMDecoder(model, compile=True)
