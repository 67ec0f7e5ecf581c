"""The KV cache changes nothing: cached, static-cache and uncached decoding give the same logits at
every step, and a padded batch gives each row the logits it gets alone (per-row position offsets,
key padding over cache + new positions, cross-attention over a padded source)."""

import pytest
import torch
from decoding_helpers import enc_dec, gpt, random_rows

from aiayn.decoding import CausalLMDecoder, Seq2SeqDecoder, left_pad, right_pad
from aiayn.decoding.beam import BeamConfig, beam_search

POSITIONS = ["sinusoidal", "learned", "rotary", "alibi"]
LENGTHS = [5, 2, 3]
STEPS = 5


def teacher_forced(decoder, ids, mask, feed):
    """Logits ``(B, 1 + STEPS, V)``: after start, then after feeding each column of ``feed (B, STEPS)``."""
    state, logits = decoder.start(ids, mask, max_new_tokens=STEPS + 1)
    out = [logits]
    for i in range(feed.shape[1]):
        out.append(decoder.step(feed[:, i], state))
    return torch.stack(out, dim=1)


def family(name, positions):
    if name == "encoder-decoder":
        model = enc_dec(positions)
        return model, lambda **kw: Seq2SeqDecoder(model, **kw), right_pad
    model = gpt(positions)
    return model, lambda **kw: CausalLMDecoder(model, **kw), left_pad


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("name", ["encoder-decoder", "decoder-only"])
@pytest.mark.parametrize("padded", [False, True], ids=["same-length", "padded"])
def test_cached_equals_uncached_at_every_step(name, positions, padded):
    _, make, pad = family(name, positions)
    ids, mask = pad(random_rows(LENGTHS if padded else [4, 4, 4]))
    feed = torch.randint(7, 64, (3, STEPS), generator=torch.Generator().manual_seed(1))
    reference = teacher_forced(make(use_cache=False), ids, mask, feed)
    for kind in ({}, {"static_cache": True}):
        cached = teacher_forced(make(**kind), ids, mask, feed)
        torch.testing.assert_close(cached, reference, atol=1e-5, rtol=0)


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("name", ["encoder-decoder", "decoder-only"])
def test_padded_batch_equals_rows_alone(name, positions):
    _, make, pad = family(name, positions)
    rows = random_rows(LENGTHS)
    feed = torch.randint(7, 64, (3, STEPS), generator=torch.Generator().manual_seed(1))
    batched = teacher_forced(make(), *pad(rows), feed)
    for b, row in enumerate(rows):
        alone = teacher_forced(make(), torch.tensor([row]), None, feed[b : b + 1])
        torch.testing.assert_close(batched[b : b + 1], alone, atol=1e-5, rtol=0)


def test_decoder_only_prefill_equals_full_forward_on_unpadded_rows():
    """The first logits of a left-padded batch are each row's last-position logits of a plain forward."""
    model = gpt("learned")
    rows = random_rows(LENGTHS)
    state, logits = CausalLMDecoder(model).start(*left_pad(rows), max_new_tokens=1)
    for b, row in enumerate(rows):
        torch.testing.assert_close(logits[b], model(torch.tensor([row]))[0, -1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["encoder-decoder", "decoder-only"])
def test_reorder_keeps_each_rows_cache(name):
    """After reorder(index), stepping gives the logits the selected rows would give (beam search's need)."""
    _, make, pad = family(name, "rotary")
    ids, mask = pad(random_rows(LENGTHS))
    decoder = make()
    state, _ = decoder.start(ids, mask, max_new_tokens=4)
    token = torch.tensor([9, 10, 11])
    reference = decoder.step(token, state)
    state2, _ = (decoder := make()).start(ids, mask, max_new_tokens=4)
    index = torch.tensor([2, 0, 0, 1])
    decoder.reorder(state2, index)
    torch.testing.assert_close(decoder.step(token[index], state2), reference[index], atol=1e-5, rtol=0)


def test_reorder_within_sources_keeps_the_encoder_side_untouched():
    """same_sources=True (beam search after its first expansion) reorders the self-attention caches
    only; the encoder output and cross-attention keys stay the same objects, and the next logits
    equal those of a full reorder."""
    _, make, pad = family("encoder-decoder", "sinusoidal")
    ids, mask = pad(random_rows([4, 3]))
    expand = torch.tensor([0, 0, 1, 1])  # two beams per source
    within = torch.tensor([1, 1, 3, 2])  # each beam replaced by a beam of its own source
    states = []
    for same_sources in (False, True):
        decoder = make()
        state, _ = decoder.start(ids, mask, max_new_tokens=4)
        decoder.reorder(state, expand)
        decoder.step(torch.tensor([9, 10, 11, 12]), state)
        memory, cross_k = state.memory, state.cache.cross_attn[0].k
        decoder.reorder(state, within, same_sources=same_sources)
        if same_sources:
            assert state.memory is memory and state.cache.cross_attn[0].k is cross_k
        states.append(decoder.step(torch.tensor([13, 14, 15, 16]), state))
    torch.testing.assert_close(states[1], states[0], atol=0, rtol=0)


def test_cross_attention_keys_are_projected_once():
    model = enc_dec()
    calls = []
    handle = model.decoder.layers[0].cross_attn.w_k.register_forward_hook(lambda *a: calls.append(1))
    try:
        beam_search(Seq2SeqDecoder(model), *right_pad(random_rows([3, 2])), BeamConfig(beam_size=3, max_new_tokens=5))
    finally:
        handle.remove()
    assert len(calls) == 1  # on the first step only; the beams then share the cached projection


def test_static_cache_is_preallocated():
    model = gpt()
    state, _ = CausalLMDecoder(model, static_cache=True).start(*left_pad(random_rows([3, 2])), max_new_tokens=4)
    assert state.cache.self_attn[0].k.shape[2] == 3 + 4  # prompt columns + new tokens, allocated once


def test_learned_positions_no_longer_limit_max_new_tokens():
    model = gpt("learned")  # max_len 128: past it, the sliding window takes over (tests/decoding/test_dec_window.py)
    state, _ = CausalLMDecoder(model).start(torch.tensor([[9, 10, 11, 12]]), max_new_tokens=500)
    assert int(state.max_new_tokens[0]) == 500


def test_prompt_must_be_left_padded():
    ids, mask = right_pad(random_rows([3, 2]))
    with pytest.raises(ValueError, match="left-padded"):
        CausalLMDecoder(gpt()).start(ids, mask, max_new_tokens=2)


def test_all_padding_row_is_rejected():
    ids = torch.tensor([[9, 10], [0, 0]])
    with pytest.raises(ValueError, match=r"rows \[1\] are all padding"):
        Seq2SeqDecoder(enc_dec()).start(ids)
