from __future__ import annotations

import pytest
import torch

from aiayn.data import IGNORE_INDEX, ClassificationBatch, LMBatch, MLMBatch, TranslationBatch


def _translation() -> TranslationBatch:
    src = torch.tensor([[5, 8, 2], [9, 2, 0]])
    tgt = torch.tensor([[1, 7], [1, 0]])
    return TranslationBatch(src, tgt, tgt.clone(), src != 0, tgt != 0)


def test_to_and_counts() -> None:
    batch = _translation()
    moved = batch.to("cpu")
    assert isinstance(moved, TranslationBatch) and torch.equal(moved.src, batch.src)
    assert batch.n_src_tokens == 5 and batch.n_tgt_tokens == 3 == batch.n_tokens and batch.batch_size == 2
    lm = LMBatch(torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long))
    assert lm.n_tokens == 8 and lm.to(torch.device("cpu")).input.shape == (2, 4)
    ids = torch.tensor([[4, 9, 5, 0]])
    labels = torch.tensor([[IGNORE_INDEX, 9, IGNORE_INDEX, IGNORE_INDEX]])
    mlm = MLMBatch(ids, labels, ids != 0, torch.zeros_like(ids))
    assert mlm.n_tokens == 1 and mlm.n_real_tokens == 3
    cls = ClassificationBatch(ids, torch.tensor([1]), ids != 0)
    assert cls.n_tokens == 3


def test_validation_names_the_field() -> None:
    src = torch.tensor([[5, 2]])
    with pytest.raises(TypeError, match="src_mask must have dtype torch.bool"):
        TranslationBatch(src, src, src, src, src != 0)
    with pytest.raises(ValueError, match=r"tgt_out must have shape \(1, 2\), got \(1, 3\)"):
        TranslationBatch(src, src, torch.zeros(1, 3, dtype=torch.long), src != 0, src != 0)
    with pytest.raises(ValueError, match=r"labels must have shape \(1,\)"):
        ClassificationBatch(src, torch.tensor([1, 0]), src != 0)
