"""Language-modelling data: one token stream cut into windows (nanoGPT style).

Training takes random contiguous windows ``x = data[i:i+T]``, ``y = data[i+1:i+T+1]``;
evaluation takes sequential non-overlapping blocks. Either way an example is a start offset.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from aiayn.data.batch import LMBatch
from aiayn.data.batching import Batches, EpochSampler, check_seed
from aiayn.data.errors import DataError
from aiayn.tokenization.base import Tokenizer

__all__ = ["split_text", "TokenStream", "RandomWindowSampler", "SequentialBlockSampler", "collate_lm"]


def split_text(text: str, train_fraction: float = 0.9) -> tuple[str, str]:
    """First ``train_fraction`` of the characters for training, the rest for validation (nanoGPT's split)."""
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
    cut = int(len(text) * train_fraction)
    return text[:cut], text[cut:]


class TokenStream(Dataset):
    """A token stream read in windows of ``block_size``: item ``i`` is ``(data[i:i+T], data[i+1:i+T+1])``."""

    def __init__(self, tokens: np.ndarray | Sequence[int], block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.tokens = np.asarray(tokens, dtype=np.int64)
        if self.tokens.ndim != 1:
            raise ValueError(f"tokens must be 1-D, got shape {self.tokens.shape}")
        if len(self.tokens) < block_size + 1:
            raise DataError(
                f"the token stream has {len(self.tokens)} tokens, fewer than block_size + 1 = {block_size + 1}: "
                "use more text or a smaller block_size"
            )
        self.block_size = block_size

    @classmethod
    def encode(cls, text: str, tokenizer: Tokenizer, block_size: int) -> TokenStream:
        if not text:
            raise DataError("the text is empty: nothing to model")
        return cls(np.asarray(tokenizer.encode(text), dtype=np.int64), block_size)

    @property
    def n_windows(self) -> int:
        """Number of valid start offsets."""
        return len(self.tokens) - self.block_size

    def __len__(self) -> int:
        return self.n_windows

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        if not 0 <= i < self.n_windows:
            raise IndexError(f"window start {i} out of range [0, {self.n_windows})")
        window = self.tokens[i : i + self.block_size + 1]
        return window[:-1], window[1:]


class RandomWindowSampler(EpochSampler):
    """Random window starts, ``batch_size`` per batch, drawn from ``(seed, epoch)``.

    An "epoch" is ``batches_per_epoch`` batches (default: as many as cover the stream once).
    """

    def __init__(
        self, stream: TokenStream, batch_size: int, *, batches_per_epoch: int | None = None, seed: int = 0
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if batches_per_epoch is None:
            batches_per_epoch = max(1, (len(stream.tokens) - 1) // (stream.block_size * batch_size))
        if batches_per_epoch < 1:
            raise ValueError(f"batches_per_epoch must be >= 1, got {batches_per_epoch}")
        check_seed(seed)
        self.n_windows, self.batch_size, self.batches_per_epoch, self.seed = (
            stream.n_windows, batch_size, batches_per_epoch, seed
        )
        self.epoch, self._cache = 0, None

    def _plan(self, epoch: int) -> Batches:
        rng = np.random.default_rng([self.seed, epoch])
        starts = rng.integers(0, self.n_windows, size=(self.batches_per_epoch, self.batch_size))
        return Batches.split(starts.ravel(), self.batch_size)


class SequentialBlockSampler(EpochSampler):
    """Non-overlapping blocks ``0, T, 2T, ...`` in order, ``batch_size`` per batch (the last may be
    smaller); the tail shorter than a block is left out. Same batches every epoch."""

    def __init__(self, stream: TokenStream, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.starts = np.arange(0, stream.n_windows, stream.block_size)
        self.batch_size, self.seed = batch_size, 0
        self.epoch, self._cache = 0, None

    def _plan(self, epoch: int) -> Batches:
        return Batches.split(self.starts, self.batch_size)


def collate_lm(examples: Sequence[tuple[np.ndarray, np.ndarray]], rng: np.random.Generator | None = None) -> LMBatch:
    """Stack ``(x, y)`` windows into an :class:`LMBatch` (``rng`` is unused)."""
    return LMBatch(
        input=torch.from_numpy(np.stack([e[0] for e in examples])),
        target=torch.from_numpy(np.stack([e[1] for e in examples])),
    )
