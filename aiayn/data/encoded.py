"""Encoded sequences: compact storage, the ``max_len`` policy, and padding into a batch tensor.

Sequences are stored as one flat int32 array plus offsets (cheap to hand to DataLoader workers).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np
import torch
from torch import Tensor

from aiayn.data.batching import padded_length
from aiayn.data.errors import DataError
from aiayn.tokenization.special import PAD_ID

__all__ = ["Ragged", "TooLong", "TOO_LONG_OPTIONS", "LengthLimit", "limit_lengths", "pad_batch"]

logger = logging.getLogger(__name__)

TooLong = Literal["error", "drop", "truncate"]
TOO_LONG_OPTIONS: tuple[str, ...] = ("error", "drop", "truncate")


@dataclass(frozen=True)
class Ragged:
    """``n`` integer sequences of varying length: sequence ``i`` is ``values[offsets[i]:offsets[i + 1]]``."""

    values: np.ndarray  # (sum of lengths,) int32
    offsets: np.ndarray  # (n + 1,) int64

    @classmethod
    def from_lists(cls, seqs: Sequence[Sequence[int]]) -> Ragged:
        lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
        offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = np.fromiter((t for s in seqs for t in s), dtype=np.int32, count=int(offsets[-1]))
        return cls(values, offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


@dataclass(frozen=True)
class LengthLimit:
    """Outcome of :func:`limit_lengths`: the examples kept, and which of them must be truncated."""

    keep: np.ndarray  # indices into the original examples
    truncate: np.ndarray  # bool, one per kept example
    n_dropped: int
    n_truncated: int


def limit_lengths(lengths: Sequence[np.ndarray], max_len: int | None, too_long: TooLong, what: str) -> LengthLimit:
    """Apply ``max_len`` to examples whose sides have ``lengths`` (tokens as they will be in the batch).

    ``too_long``: ``"error"`` raises ``DataError`` (counting the long examples), ``"drop"`` removes
    them, ``"truncate"`` keeps them marked for truncation. Counts are logged. Raises ``DataError``
    when no example is left, so an empty data set never becomes a silent zero-step run.
    """
    if too_long not in TOO_LONG_OPTIONS:
        raise ValueError(f"too_long must be one of {TOO_LONG_OPTIONS}, got {too_long!r}")
    n = len(lengths[0])
    if n == 0:
        raise DataError(f"no {what}: the data set is empty")
    if max_len is None:
        return LengthLimit(np.arange(n), np.zeros(n, dtype=bool), 0, 0)
    if max_len < 2:
        raise ValueError(f"max_len must be >= 2 (room for a token and an end marker), got {max_len}")
    longest = np.max(np.stack(lengths), axis=0)
    over = longest > max_len
    n_over = int(over.sum())
    if n_over and too_long == "error":
        first = int(np.argmax(over))
        raise DataError(
            f"{n_over} of {n} {what} are longer than max_len={max_len} tokens (the first is line {first + 1}, "
            f"{int(longest[first])} tokens; the longest has {int(longest.max())}); pass too_long='drop' or "
            "too_long='truncate', or raise max_len"
        )
    if too_long == "drop":
        if n_over:
            logger.info("dropped %d of %d %s longer than max_len=%d tokens", n_over, n, what, max_len)
        keep = np.flatnonzero(~over)
        if len(keep) == 0:
            raise DataError(
                f"all {n} {what} are longer than max_len={max_len} tokens and were dropped: the data set is empty; "
                "raise max_len or pass too_long='truncate'"
            )
        return LengthLimit(keep, np.zeros(len(keep), dtype=bool), n_over, 0)
    if n_over:
        logger.info("truncated %d of %d %s longer than max_len=%d tokens", n_over, n, what, max_len)
    return LengthLimit(np.arange(n), over, 0, n_over)


def pad_batch(
    seqs: Sequence[np.ndarray], *, prefix: int | None = None, suffix: int | None = None, multiple: int = 1,
) -> tuple[Tensor, Tensor]:
    """Stack ``prefix + seq + suffix`` rows padded with ``PAD_ID`` -> ``(ids (B, L) long, lengths (B,) long)``;
    ``L`` is the longest row rounded up to ``multiple`` (:func:`~aiayn.data.batching.padded_length`)."""
    if len(seqs) == 0:
        raise ValueError("cannot pad an empty batch: seqs has no sequences")
    start = 0 if prefix is None else 1
    extra = start + (0 if suffix is None else 1)
    lengths = np.fromiter((len(s) + extra for s in seqs), dtype=np.int64, count=len(seqs))
    out = np.full((len(seqs), padded_length(int(lengths.max()), multiple)), PAD_ID, dtype=np.int64)
    if prefix is not None:
        out[:, 0] = prefix
    for b, s in enumerate(seqs):
        out[b, start : start + len(s)] = s
        if suffix is not None:
            out[b, start + len(s)] = suffix
    return torch.from_numpy(out), torch.from_numpy(lengths)
