"""Beam search: a hand-worked example, n-best order, the length limit, beam 1 = greedy, batch = one by one."""

import math

import pytest
import torch
from decoding_helpers import A, B, TableDecoder, enc_dec, gpt, random_rows

from aiayn.decoding import BeamConfig, beam_search, greedy, left_pad, length_penalty, right_pad
from aiayn.tokenization.special import EOS_ID as EOS

# Next-token probabilities given the tokens generated so far (BOS not shown; A, B real tokens).
TABLE = {
    (): {A: 0.6, B: 0.4},
    (A,): {EOS: 0.6, A: 0.25, B: 0.15},
    (B,): {A: 0.875, EOS: 0.125},
    (B, A): {EOS: 0.96, A: 0.02, B: 0.02},
    (A, A): {EOS: 0.5, A: 0.3, B: 0.2},
}
SRC = torch.tensor([[7]])  # the fake decoder ignores its input


def test_length_penalty_is_gnmt():
    assert length_penalty(1, 0.6) == 1.0  # ((5 + 1) / 6)^alpha
    assert length_penalty(3, 0.6) == pytest.approx((8 / 6) ** 0.6)
    assert length_penalty(7, 0.0) == 1.0


def test_hand_worked_beam_with_length_penalty():
    """Beam 2, alpha 0.6 (lp(2) = (7/6)^0.6 = 1.096903, lp(3) = (8/6)^0.6 = 1.188402).

    Step 1 (one live beam, BOS): the 2K = 4 best extensions are A (0.6) and B (0.4); both live.
    Step 2: extensions ranked: A EOS 0.6*0.6 = 0.36 (rank 0, EOS -> finished),
      B A 0.4*0.875 = 0.35, A A 0.6*0.25 = 0.15 (the two live beams), A B 0.09 (not needed).
      finished: [A EOS] log 0.36 = -1.021651, score -1.021651 / 1.096903 = -0.931396.
    Step 3: from B A: EOS 0.35*0.96 = 0.336; from A A: EOS 0.15*0.5 = 0.075, A 0.045, B 0.03.
      B A EOS (rank 0) and A A EOS (rank 1) finish:
      [B A EOS] log 0.336 = -1.090644, score -1.090644 / 1.188402 = -0.917740
      [A A EOS] log 0.075 = -2.590267, score -2.590267 / 1.188402 = -2.179623 (dropped: 3rd of K = 2)
      Two finished hypotheses and early stopping: done. Best: B A EOS, although A EOS is more likely.
    Greedy takes A (0.6) then EOS (0.6): A EOS.
    """
    decoder = TableDecoder(TABLE)
    hyps = beam_search(decoder, SRC, config=BeamConfig(beam_size=2, length_penalty=0.6, n_best=2, max_new_tokens=10))[0]
    assert [h.tokens for h in hyps] == [[B, A, EOS], [A, EOS]]
    assert hyps[0].log_prob == pytest.approx(math.log(0.336), abs=1e-6)
    assert hyps[0].score == pytest.approx(-0.917740, abs=1e-6)
    assert hyps[1].log_prob == pytest.approx(math.log(0.36), abs=1e-6)
    assert hyps[1].score == pytest.approx(-0.931396, abs=1e-6)
    assert decoder.steps == 2  # stopped after the third token, not at max_new_tokens
    assert greedy(TableDecoder(TABLE), SRC, max_new_tokens=10).sequences() == [[A, EOS]]


def test_without_length_penalty_the_more_likely_short_hypothesis_wins():
    """alpha = 0: scores are log-probs, log 0.36 = -1.0217 > log 0.336 = -1.0906."""
    hyps = beam_search(TableDecoder(TABLE), SRC, config=BeamConfig(beam_size=2, length_penalty=0.0, n_best=2))[0]
    assert [h.tokens for h in hyps] == [[A, EOS], [B, A, EOS]]
    assert [h.score for h in hyps] == pytest.approx([math.log(0.36), math.log(0.336)])


def test_n_best_is_sorted_by_score():
    hyps = beam_search(TableDecoder(TABLE), SRC, config=BeamConfig(beam_size=3, n_best=3, early_stopping=False))[0]
    scores = [h.score for h in hyps]
    assert len(hyps) == 3 and scores == sorted(scores, reverse=True)
    for h in hyps:
        assert h.score == pytest.approx(h.log_prob / length_penalty(len(h.tokens), 0.6))


def test_length_limit_finishes_live_beams_without_eos():
    """max 2 tokens: step 2 is the last; live B A (0.35: -1.049822 / 1.096903 = -0.957079) ends there
    and ranks after A EOS (-0.931396); A A (0.15: -1.729525) is third and dropped."""
    hyps = beam_search(TableDecoder(TABLE), SRC, config=BeamConfig(beam_size=2, n_best=2, max_new_tokens=2))[0]
    assert [h.tokens for h in hyps] == [[A, EOS], [B, A]]
    assert hyps[1].score == pytest.approx(-0.957079, abs=1e-6)


def test_min_new_tokens_in_beam_search():
    hyps = beam_search(TableDecoder(TABLE), SRC, config=BeamConfig(beam_size=2, n_best=2, min_new_tokens=2))[0]
    assert all(len(h.tokens) >= 3 for h in hyps)  # EOS only as the third token or later
    assert hyps[0].tokens == [B, A, EOS]


def test_beam_config_errors_name_the_field():
    with pytest.raises(ValueError, match="beam_size=0"):
        BeamConfig(beam_size=0)
    with pytest.raises(ValueError, match=r"n_best=5 .*beam_size=4"):
        BeamConfig(n_best=5)
    with pytest.raises(ValueError, match="min_new_tokens=3 must be <= max_new_tokens=2"):
        BeamConfig(min_new_tokens=3, max_new_tokens=2)


@pytest.mark.parametrize("family", ["encoder-decoder", "decoder-only"])
def test_beam_one_equals_greedy(family):
    if family == "encoder-decoder":
        model, (ids, mask) = enc_dec(), right_pad(random_rows([6, 3, 5]))
    else:
        model, (ids, mask) = gpt(), left_pad(random_rows([6, 3, 5]))
    expected = greedy(model, ids, mask, max_new_tokens=8).sequences()
    hyps = beam_search(model, ids, mask, BeamConfig(beam_size=1, max_new_tokens=8))
    assert [h[0].tokens for h in hyps] == expected


@pytest.mark.parametrize("family", ["encoder-decoder", "decoder-only"])
def test_batch_beam_equals_one_by_one(family):
    rows = random_rows([6, 2, 4], seed=1)
    if family == "encoder-decoder":
        model, pad = enc_dec("rotary"), right_pad
    else:
        model, pad = gpt("rotary"), left_pad
    config = BeamConfig(beam_size=3, n_best=3, max_new_tokens=6)
    batched = beam_search(model, *pad(rows), config)
    for row, hyps in zip(rows, batched):
        alone = beam_search(model, torch.tensor([row]), None, config)[0]
        assert [h.tokens for h in hyps] == [h.tokens for h in alone]
        assert [h.score for h in hyps] == pytest.approx([h.score for h in alone], abs=1e-4)


def test_default_max_length_is_source_length_plus_50():
    """Section 6.1: at most |src| + 50 tokens per row (EOS counted); the live beams end there."""
    model = enc_dec()
    ids, mask = right_pad(random_rows([2, 1]))
    hyps = beam_search(model, ids, mask, BeamConfig(beam_size=2, n_best=2, eos_id=63, early_stopping=False))
    for n, row in zip([2, 1], hyps):
        assert all(len(h.tokens) <= n + 50 for h in row)
    assert greedy(model, ids, mask, eos_id=None).lengths.tolist() == [52, 51]
