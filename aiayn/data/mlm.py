"""Masked-LM batches (BERT): 15% of the real tokens are predicted; of those 80% become ``MASK``,
10% a random non-special token and 10% stay as they are. Labels are ``IGNORE_INDEX`` elsewhere.

Each position is selected independently with probability ``mask_prob`` (as Hugging Face's
collator does); special tokens and padding are never selected.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from aiayn.data.batch import IGNORE_INDEX, MLMBatch
from aiayn.data.batching import padded_length
from aiayn.data.encoded import pad_batch
from aiayn.nn.masks import padding_mask_from_lengths
from aiayn.tokenization.base import N_SPECIAL
from aiayn.tokenization.special import MASK_ID, PAD_ID

__all__ = ["mask_tokens", "MLMCollate"]


def mask_tokens(
    ids: np.ndarray,
    rng: np.random.Generator,
    vocab_size: int,
    *,
    mask_prob: float = 0.15,
    mask_token_prob: float = 0.8,
    random_token_prob: float = 0.1,
    mask_id: int = MASK_ID,
    special: Sequence[int] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``ids (B, T)`` -> ``(input, labels)``, both ``(B, T)`` int64; ``ids`` is not modified.

    ``mask_id`` and ``special`` (ids never masked nor drawn as random tokens; default our ``0..6``)
    are the tokenizer's: a pretrained BERT's ``[MASK]`` is 103 and its specials 0, 100..103.

    When nothing is selected but something could be, one random real token is selected, so a
    batch always has a target (an all-ignored batch makes the mean loss NaN).
    """
    if vocab_size <= N_SPECIAL:
        raise ValueError(f"vocab_size must be > {N_SPECIAL} (the special tokens), got {vocab_size}")
    for name, p in (("mask_prob", mask_prob), ("mask_token_prob", mask_token_prob), ("random_token_prob", random_token_prob)):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {p}")
    if mask_token_prob + random_token_prob > 1.0:
        raise ValueError(
            f"mask_token_prob + random_token_prob must be <= 1, got {mask_token_prob} + {random_token_prob}"
        )
    ids = np.asarray(ids, dtype=np.int64)
    excluded = np.arange(N_SPECIAL) if special is None else np.asarray(sorted(set(special)), dtype=np.int64)
    maskable = ~np.isin(ids, excluded)  # never PAD, CLS, SEP, UNK, ...
    selected = (rng.random(ids.shape) < mask_prob) & maskable
    if not selected.any() and maskable.any():
        candidates = np.flatnonzero(maskable)
        selected.flat[candidates[rng.integers(len(candidates))]] = True
    labels = np.where(selected, ids, IGNORE_INDEX)
    r = rng.random(ids.shape)
    to_mask = selected & (r < mask_token_prob)
    to_random = selected & (r >= mask_token_prob) & (r < mask_token_prob + random_token_prob)
    inputs = ids.copy()
    inputs[to_mask] = mask_id
    if special is None:
        inputs[to_random] = rng.integers(N_SPECIAL, vocab_size, size=int(to_random.sum()))
    else:  # any id but the specials
        ordinary = np.setdiff1d(np.arange(vocab_size), excluded)
        inputs[to_random] = ordinary[rng.integers(len(ordinary), size=int(to_random.sum()))]
    return inputs, labels


class MLMCollate:
    """Collate ``[CLS] text [SEP]`` arrays (a :class:`~aiayn.data.sentences.SentenceDataset`) into an
    :class:`MLMBatch`. Pass the ``rng`` for reproducible masks (:class:`ResumableLoader` does)."""

    def __init__(
        self, vocab_size: int, *, mask_prob: float = 0.15, mask_token_prob: float = 0.8, random_token_prob: float = 0.1,
        mask_id: int = MASK_ID, special: Sequence[int] | None = None, pad_to_multiple: int = 1,
    ) -> None:
        # Validate once, here, rather than at the first batch.
        mask_tokens(np.zeros((1, 1), dtype=np.int64), np.random.default_rng(0), vocab_size,
                    mask_prob=mask_prob, mask_token_prob=mask_token_prob, random_token_prob=random_token_prob)
        self.vocab_size, self.mask_prob = vocab_size, mask_prob
        self.mask_token_prob, self.random_token_prob = mask_token_prob, random_token_prob
        self.mask_id, self.special = mask_id, None if special is None else list(special)
        self.pad_to_multiple = pad_to_multiple  # widen after masking: the masks stay those of the unpadded batch

    def __call__(self, examples: Sequence[np.ndarray], rng: np.random.Generator | None = None) -> MLMBatch:
        ids, lengths = pad_batch(examples)
        inputs, labels = mask_tokens(
            ids.numpy(),
            rng if rng is not None else np.random.default_rng(),
            self.vocab_size,
            mask_prob=self.mask_prob,
            mask_token_prob=self.mask_token_prob,
            random_token_prob=self.random_token_prob,
            mask_id=self.mask_id,
            special=self.special,
        )
        extra = padded_length(ids.shape[1], self.pad_to_multiple) - ids.shape[1]
        if extra:
            inputs = np.pad(inputs, ((0, 0), (0, extra)), constant_values=PAD_ID)
            labels = np.pad(labels, ((0, 0), (0, extra)), constant_values=IGNORE_INDEX)
        return MLMBatch(
            input=torch.from_numpy(inputs),
            labels=torch.from_numpy(labels),
            pad_mask=padding_mask_from_lengths(lengths, inputs.shape[1]),
            segment_ids=torch.zeros(inputs.shape, dtype=torch.long),
        )
