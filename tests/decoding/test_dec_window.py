"""Generation past the learned positions: the sliding window equals recomputing the last ``max_len``
tokens from scratch at every step (nanoGPT's crop), for the cached, static and uncached decoders
and a left-padded batch; positions that extrapolate (sinusoidal, rotary, ALiBi) keep their cache."""

import pytest
import torch
from decoding_helpers import gpt, random_rows

from aiayn.decoding import CausalLMDecoder, GenerationConfig, generate, left_pad

MAX_LEN, NEW = 8, 20


def recomputed(model, row, n):
    """Greedy tokens of one row, each from a fresh forward over its last MAX_LEN tokens."""
    seq, out = torch.tensor([row]), []
    for _ in range(n):
        token = model(seq[:, -MAX_LEN:])[:, -1].argmax(dim=-1)
        out.append(int(token))
        seq = torch.cat([seq, token[:, None]], dim=1)
    return out


@pytest.mark.parametrize("make", [
    lambda m: CausalLMDecoder(m), lambda m: CausalLMDecoder(m, use_cache=False),
    lambda m: CausalLMDecoder(m, static_cache=True),
], ids=["cached", "uncached", "static-cache"])
def test_window_equals_recomputing_the_last_max_len_tokens(make):
    model = gpt("learned", max_len=MAX_LEN)
    rows = random_rows([5, 2, 11])  # the last prompt is already longer than the positions
    ids, mask = left_pad(rows)
    got = generate(make(model), ids, mask, GenerationConfig(max_new_tokens=NEW, greedy=True, eos_id=None)).tokens
    assert got.tolist() == [recomputed(model, row, NEW) for row in rows]


@pytest.mark.parametrize("positions", ["sinusoidal", "rotary", "alibi"])
def test_extrapolating_positions_keep_the_whole_sequence(positions):
    model = gpt(positions, max_len=MAX_LEN)
    ids, mask = left_pad(random_rows([5, 3]))
    config = GenerationConfig(max_new_tokens=NEW, greedy=True, eos_id=None)
    cached = generate(CausalLMDecoder(model), ids, mask, config).tokens
    uncached = generate(CausalLMDecoder(model, use_cache=False), ids, mask, config).tokens
    static = generate(CausalLMDecoder(model, static_cache=True), ids, mask, config).tokens
    assert torch.equal(cached, uncached) and torch.equal(cached, static)
    assert CausalLMDecoder(model)._window is None  # no crop: every token stays in view
