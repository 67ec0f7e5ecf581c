"""Classification pooling: [CLS] (BERT) or the mean of the real tokens, which padding must not change."""

from __future__ import annotations

import pytest
import torch

from aiayn.decoding.encoder_only import classify
from aiayn.models.config import EncoderOnlyConfig
from aiayn.models.encoder_only import EncoderOnly


def model(pooling: str) -> EncoderOnly:
    torch.manual_seed(0)
    config = EncoderOnlyConfig(vocab_size=50, n_layers=2, d_model=16, n_heads=2, d_ff=32, dropout=0.0,
                               attention_dropout=0.0, max_len=32, n_classes=3, pad_id=0, pooling=pooling)
    return EncoderOnly(config).eval()


@torch.no_grad()
def test_mean_pooling_is_the_masked_mean_of_the_hidden_states():
    m = model("mean")
    ids = torch.tensor([[4, 9, 12, 7, 0, 0], [4, 5, 6, 7, 8, 9]])
    mask = ids != 0
    hidden = m(ids, mask)
    expected = torch.stack([hidden[0, :4].mean(0), hidden[1].mean(0)])
    torch.testing.assert_close(m.pooled(hidden, mask), torch.tanh(m.pooler(expected)))
    torch.testing.assert_close(m.pooled(hidden), torch.tanh(m.pooler(hidden.mean(1))))  # no mask: every position


@pytest.mark.parametrize("pooling", ["cls", "mean"])
@torch.no_grad()
def test_padding_does_not_change_the_class_probabilities(pooling):
    m = model(pooling)
    ids = torch.tensor([[4, 9, 12, 7]])
    padded = torch.tensor([[4, 9, 12, 7, 0, 0, 0]])
    alone = classify(m, ids).probs
    torch.testing.assert_close(classify(m, padded).probs, alone)  # mask derived from pad_id
    torch.testing.assert_close(classify(m, padded, padded != 0).probs, alone)


def test_mean_and_cls_pooling_differ():
    ids = torch.tensor([[4, 9, 12, 7]])
    with torch.no_grad():
        assert not torch.allclose(classify(model("cls"), ids).probs, classify(model("mean"), ids).probs)


def test_unknown_pooling_is_refused():
    with pytest.raises(ValueError, match="pooling.*'max'.*must be 'cls' or 'mean'"):
        EncoderOnlyConfig(vocab_size=50, n_layers=1, d_model=16, n_heads=2, d_ff=32, pooling="max")
