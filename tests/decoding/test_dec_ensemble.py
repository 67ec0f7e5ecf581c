"""Ensembles: the averaged distribution, decoding with it, and the members' caches kept in step."""

import math

import pytest
import torch
from decoding_helpers import A, B, TableDecoder, enc_dec, gpt, random_rows

from aiayn.decoding import (
    BeamConfig,
    CausalLMDecoder,
    GenerationConfig,
    Seq2SeqDecoder,
    beam_search,
    generate,
    greedy,
    left_pad,
    right_pad,
)
from aiayn.decoding.ensemble import EnsembleDecoder, mean_log_probs, mean_logits
from aiayn.tokenization.special import EOS_ID as EOS

SRC = torch.tensor([[7]])  # the fake decoders ignore their input


def test_mean_log_probs_is_the_log_of_the_mean_probability():
    x, y = torch.randn(3, 7, dtype=torch.float64), torch.randn(3, 7, dtype=torch.float64)
    expected = ((x.softmax(-1) + y.softmax(-1)) / 2).log()
    torch.testing.assert_close(mean_log_probs([x, y]).double(), expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(mean_log_probs([x]).double(), x.log_softmax(-1), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="at least one"):
        mean_log_probs([])


def test_the_ensemble_follows_the_mean_where_the_members_disagree():
    first = TableDecoder({(): {A: 0.6, B: 0.4}, (A,): {EOS: 1.0}, (B,): {EOS: 1.0}})
    second = TableDecoder({(): {A: 0.3, B: 0.7}, (A,): {EOS: 1.0}, (B,): {EOS: 1.0}})
    assert greedy(first, SRC, max_new_tokens=3).sequences() == [[A, EOS]]
    ensemble = EnsembleDecoder([first, second])
    assert greedy(ensemble, SRC, max_new_tokens=3).sequences() == [[B, EOS]]  # mean: A 0.45, B 0.55
    best = beam_search(ensemble, SRC, None, BeamConfig(beam_size=2, n_best=2, length_penalty=0.0))[0]
    assert [h.tokens for h in best] == [[B, EOS], [A, EOS]]
    assert [h.score for h in best] == pytest.approx([math.log(0.55), math.log(0.45)])


@pytest.mark.parametrize("family", ["encoder-decoder", "decoder-only"])
def test_an_ensemble_of_one_is_the_model(family):
    if family == "encoder-decoder":
        model, (ids, mask), member = enc_dec(), right_pad(random_rows([5, 3])), Seq2SeqDecoder
    else:
        model, (ids, mask), member = gpt(), left_pad(random_rows([5, 3])), CausalLMDecoder
    config = BeamConfig(beam_size=3, n_best=2, max_new_tokens=6)
    alone = beam_search(model, ids, mask, config)
    ensembled = beam_search(EnsembleDecoder([member(model)]), ids, mask, config)
    assert [[h.tokens for h in row] for row in ensembled] == [[h.tokens for h in row] for row in alone]


@pytest.mark.parametrize("family", ["encoder-decoder", "decoder-only"])
def test_members_caches_follow_the_beams(family):
    """Beam search reorders rows every step: each member's KV cache must be reordered too, so the
    cached ensemble gives what the ensemble recomputing every prefix gives."""
    if family == "encoder-decoder":
        models, (ids, mask), member = [enc_dec("rotary"), enc_dec("sinusoidal")], right_pad(random_rows([6, 2, 4])), Seq2SeqDecoder
    else:
        models, (ids, mask), member = [gpt("rotary"), gpt("learned")], left_pad(random_rows([6, 2, 4])), CausalLMDecoder
    config = BeamConfig(beam_size=3, n_best=3, max_new_tokens=6)
    cached = beam_search(EnsembleDecoder([member(m) for m in models]), ids, mask, config)
    recomputed = beam_search(EnsembleDecoder([member(m, use_cache=False) for m in models]), ids, mask, config)
    for a, b in zip(cached, recomputed):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)


def test_members_must_share_a_vocabulary():
    class Other(TableDecoder):
        vocab_size = 9

    with pytest.raises(ValueError, match=r"share one vocabulary, got vocab sizes \[5, 9\]"):
        EnsembleDecoder([TableDecoder({}), Other({})])
    with pytest.raises(ValueError, match="at least one member"):
        EnsembleDecoder([])


def test_mean_logits_are_the_model_logits_for_copies_and_give_the_mean_distribution():
    x, y = torch.randn(3, 7, dtype=torch.float64) * 3, torch.randn(3, 7, dtype=torch.float64)
    torch.testing.assert_close(mean_logits([x, x]).double(), x, atol=1e-5, rtol=0)
    torch.testing.assert_close(mean_logits([x, y]).double().log_softmax(-1), mean_log_probs([x, y]).double(), atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", ["encoder-decoder", "decoder-only"])
def test_two_copies_of_a_model_decode_as_the_model_with_a_repetition_penalty(family):
    """The protocol promises logits: with log-probabilities (all negative) the CTRL penalty multiplied
    every repeated token's score, so an ensemble of two copies decoded differently from the model."""
    if family == "encoder-decoder":
        model, (ids, mask), member = enc_dec(), right_pad(random_rows([5, 3, 6])), Seq2SeqDecoder
    else:
        model, (ids, mask), member = gpt(), left_pad(random_rows([5, 3, 6])), CausalLMDecoder
    config = GenerationConfig(greedy=True, max_new_tokens=12, repetition_penalty=3.0, eos_id=None)
    alone = generate(member(model), ids, mask, config).tokens
    pair = generate(EnsembleDecoder([member(model), member(model)]), ids, mask, config).tokens
    assert torch.equal(pair, alone)
    plain = generate(member(model), ids, mask, GenerationConfig(greedy=True, max_new_tokens=12, eos_id=None)).tokens
    assert not torch.equal(plain, alone)  # the penalty does change the output: the test can fail
