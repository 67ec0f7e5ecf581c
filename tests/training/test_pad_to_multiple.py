"""data.pad_to_multiple: batch lengths rounded up to a multiple, the padding masked, so no loss changes;
the token budget counts the padded width; a bad multiple is refused naming the key."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aiayn import build_model
from aiayn.config_io import apply_overrides
from aiayn.data import MLMCollate, TokenBudgetBatchSampler, collate_classification, collate_translation
from aiayn.data.batching import padded_length
from aiayn.training.config import DataSection, TrainConfig
from aiayn.training.objectives import Objective

RNG = np.random.default_rng(0)


def _sentences(n: int, low: int = 4, high: int = 30, lengths: tuple[int, int] = (2, 11)) -> list[np.ndarray]:
    return [RNG.integers(low, high, size=int(RNG.integers(*lengths))) for _ in range(n)]


def _loss_and_grads(objective: Objective, batch) -> tuple[torch.Tensor, list[torch.Tensor]]:
    objective.zero_grad()
    loss = objective(batch)
    loss.sum.backward()
    return loss.sum.detach(), [p.grad.clone() for p in objective.parameters()]


@pytest.mark.parametrize("multiple", [8, 16])
def test_translation_padding_to_a_multiple_changes_no_loss_or_gradient(multiple):
    torch.manual_seed(0)
    model = build_model("tiny-encoder-decoder", d_model=16, d_ff=32, n_heads=2, vocab_size=30).double()  # exact up to rounding
    objective = Objective(model, "translation", label_smoothing=0.1).eval()
    pairs = list(zip(_sentences(5), _sentences(5)))
    plain, padded = collate_translation(pairs), collate_translation(pairs, pad_to_multiple=multiple)
    assert padded.src.shape[1] % multiple == 0 and padded.tgt_in.shape[1] % multiple == 0
    assert padded.src.shape[1] > plain.src.shape[1] and padded.n_tokens == plain.n_tokens
    (a, grads_a), (b, grads_b) = _loss_and_grads(objective, plain), _loss_and_grads(objective, padded)
    torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)
    for ga, gb in zip(grads_a, grads_b):
        torch.testing.assert_close(gb, ga, rtol=1e-10, atol=1e-12)


def test_classification_and_masked_lm_padding_change_no_loss():
    torch.manual_seed(0)
    model = build_model("tiny-encoder-only", d_model=16, d_ff=32, n_heads=2, vocab_size=30, n_classes=3, pooling="mean").double()
    examples = [(s, i % 3) for i, s in enumerate(_sentences(4))]
    plain, padded = collate_classification(examples), collate_classification(examples, pad_to_multiple=16)
    assert padded.input.shape[1] == 16
    objective = Objective(model, "classification").eval()
    torch.testing.assert_close(objective(padded).sum, objective(plain).sum, rtol=1e-12, atol=1e-12)

    sentences = _sentences(4)
    mlm_plain = MLMCollate(30)(sentences, np.random.default_rng(3))
    mlm_padded = MLMCollate(30, pad_to_multiple=16)(sentences, np.random.default_rng(3))
    width = mlm_plain.input.shape[1]
    assert mlm_padded.input.shape[1] == 16 and torch.equal(mlm_padded.labels[:, :width], mlm_plain.labels)  # the same masks
    assert (mlm_padded.labels[:, width:] == -100).all() and not mlm_padded.pad_mask[:, width:].any()


def test_the_token_budget_counts_the_padded_width():
    src = RNG.integers(1, 40, size=500)
    tgt = RNG.integers(1, 40, size=500)
    plan = TokenBudgetBatchSampler([src, tgt], 256, seed=1, pad_to_multiple=16)
    for batch in plan.batches(0):
        for side in (src, tgt):
            assert len(batch) * padded_length(int(side[batch].max()), 16) <= 256
    with pytest.raises(ValueError, match=r"takes 48 positions \(padded to a multiple of 16\)"):
        TokenBudgetBatchSampler([np.array([33])], 40, pad_to_multiple=16)


@pytest.mark.parametrize("bad", [0, -8, 2.5, True])
def test_a_multiple_that_is_not_a_positive_integer_is_refused_naming_the_key(bad):
    with pytest.raises(ValueError, match=rf"data\.pad_to_multiple={bad!r} must be a positive integer"):
        DataSection(pad_to_multiple=bad)


def test_a_multiple_from_the_command_line_is_checked():
    assert apply_overrides(TrainConfig(), ["data.pad_to_multiple=8"]).data.pad_to_multiple == 8
    with pytest.raises((TypeError, ValueError), match=r"data\.pad_to_multiple"):
        apply_overrides(TrainConfig(), ["data.pad_to_multiple=eight"])
    with pytest.raises(ValueError, match=r"data\.pad_to_multiple=0"):
        apply_overrides(TrainConfig(), ["data.pad_to_multiple=0"])


def test_learned_positions_must_hold_the_padded_length():
    from aiayn.training.config import ModelSection
    from aiayn.training.loop import _check_lengths

    config = TrainConfig(model=ModelSection(preset="tiny-encoder-only", max_len=100),
                         data=DataSection(task="classification", dataset="sst2", max_len=100, pad_to_multiple=16))
    with pytest.raises(ValueError, match=r"data\.max_len=100 rounded up to data\.pad_to_multiple=16 is 112, longer than model\.max_len=100"):
        _check_lengths(config, config.model.build(vocab_size=64))
    _check_lengths(TrainConfig(model=config.model, data=DataSection(task="classification", dataset="sst2", max_len=96,
                                                                       pad_to_multiple=16)), config.model.build(vocab_size=64))
