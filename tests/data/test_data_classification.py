from __future__ import annotations

import pytest
import torch

from aiayn.data import ClassificationDataset, DataError, LabeledText, collate_classification
from aiayn.tokenization import CLS_ID, PAD_ID, SEP_ID, CharTokenizer

DATA = LabeledText(["good film", "bad", "a very long review indeed"], [1, 0, 1], ["0", "1"])


@pytest.fixture(scope="module")
def tok() -> CharTokenizer:
    return CharTokenizer.train(DATA.texts)


def test_encode_and_collate(tok: CharTokenizer) -> None:
    ds = ClassificationDataset.encode(DATA, tok)
    ids, label = ds[0]
    assert ids.tolist() == [CLS_ID, *tok.encode("good film"), SEP_ID] and label == 1
    batch = collate_classification([ds[i] for i in range(3)])
    assert batch.input.shape == (3, 27) and batch.labels.tolist() == [1, 0, 1]
    assert torch.equal(batch.input == PAD_ID, ~batch.pad_mask)
    assert batch.pad_mask.sum(1).tolist() == [11, 5, 27]


def test_max_len_drop_keeps_labels_aligned(tok: CharTokenizer) -> None:
    ds = ClassificationDataset.encode(DATA, tok, max_len=11, too_long="drop")
    assert len(ds) == 2 and ds.n_dropped == 1 and ds.labels.tolist() == [1, 0]
    cut = ClassificationDataset.encode(DATA, tok, max_len=6, too_long="truncate")
    assert cut.n_truncated == 2 and max(cut.lengths) == 6
    assert cut[0][0].tolist() == [CLS_ID, *tok.encode("good"), SEP_ID]
    with pytest.raises(DataError, match="2 of 3 sentences are longer than max_len=6"):
        ClassificationDataset.encode(DATA, tok, max_len=6)
    with pytest.raises(DataError, match="no labelled examples"):
        ClassificationDataset.encode(LabeledText([], [], ["0"]), tok)
