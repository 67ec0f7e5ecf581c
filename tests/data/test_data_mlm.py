from __future__ import annotations

import numpy as np
import pytest
import torch

from aiayn.data import IGNORE_INDEX, MLMCollate, SentenceDataset, mask_tokens
from aiayn.tokenization import CLS_ID, MASK_ID, N_SPECIAL, PAD_ID, SEP_ID, CharTokenizer


def test_masking_proportions_and_invariants() -> None:
    rng = np.random.default_rng(0)
    vocab = 50
    ids = rng.integers(N_SPECIAL, vocab, size=(64, 130))
    ids[:, 0], ids[:, 100] = CLS_ID, SEP_ID
    ids[:, 101:] = PAD_ID
    inputs, labels = mask_tokens(ids, np.random.default_rng(1), vocab)
    selected = labels != IGNORE_INDEX
    real = ids >= N_SPECIAL
    assert not (selected & ~real).any()  # never special tokens or padding
    assert (labels[selected] == ids[selected]).all()
    assert (inputs[~selected] == ids[~selected]).all()
    share = selected.sum() / real.sum()
    assert 0.14 < share < 0.16
    masked = (inputs == MASK_ID) & selected
    changed = selected & (inputs != ids) & ~masked
    kept = selected & (inputs == ids)
    n = selected.sum()
    assert 0.77 < masked.sum() / n < 0.83
    # A random token can equal the original (1 in 43), so "changed" is a bit below 10% and "kept" above.
    assert 0.08 < changed.sum() / n < 0.115 and 0.085 < kept.sum() / n < 0.12
    assert (inputs[changed] >= N_SPECIAL).all() and (inputs[changed] < vocab).all()


def test_at_least_one_prediction_and_determinism() -> None:
    ids = np.array([[CLS_ID, 9, SEP_ID, PAD_ID]])
    for seed in range(20):
        inputs, labels = mask_tokens(ids, np.random.default_rng(seed), 20, mask_prob=0.0)
        assert labels.tolist() == [[IGNORE_INDEX, 9, IGNORE_INDEX, IGNORE_INDEX]]
    a = mask_tokens(np.full((4, 30), 9), np.random.default_rng(3), 20)
    b = mask_tokens(np.full((4, 30), 9), np.random.default_rng(3), 20)
    assert all((x == y).all() for x, y in zip(a, b))


def test_bad_probabilities() -> None:
    with pytest.raises(ValueError, match="mask_prob must be in"):
        MLMCollate(100, mask_prob=1.5)
    with pytest.raises(ValueError, match=r"mask_token_prob \+ random_token_prob must be <= 1"):
        MLMCollate(100, mask_token_prob=0.8, random_token_prob=0.3)
    with pytest.raises(ValueError, match="vocab_size must be > 7"):
        MLMCollate(7)


def test_mlm_batch_from_sentences() -> None:
    tok = CharTokenizer.train(["hello world", "hi"])
    ds = SentenceDataset.encode(["hello world", "hi", ""], tok)
    assert ds[1].tolist() == [CLS_ID, *tok.encode("hi"), SEP_ID]
    batch = MLMCollate(tok.vocab_size)([ds[i] for i in range(3)], np.random.default_rng(0))
    assert batch.input.shape == (3, 13)
    assert batch.pad_mask.tolist()[2] == [True, True] + [False] * 11
    assert torch.equal(batch.pad_mask, torch.tensor([[True] * 13, [True] * 4 + [False] * 9, [True] * 2 + [False] * 11]))
    assert (batch.input[~batch.pad_mask] == PAD_ID).all()
    assert (batch.labels[~batch.pad_mask] == IGNORE_INDEX).all()
    assert batch.segment_ids.dtype == torch.long and (batch.segment_ids == 0).all()
    assert batch.input[:, 0].tolist() == [CLS_ID] * 3 and batch.n_tokens >= 1
