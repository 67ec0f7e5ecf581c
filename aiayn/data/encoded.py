"""Encoded sequences: compact storage, the ``max_len`` policy, and padding into a batch tensor.

Sequences are stored as one flat integer array plus offsets (cheap to hand to DataLoader workers); a
batch of them is padded with a few array operations, not a loop over its rows.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Literal, Protocol, Sequence

import numpy as np
import torch
from torch import Tensor

from aiayn.data.batching import index_dtype, padded_length
from aiayn.data.errors import DataError
from aiayn.tokenization.special import PAD_ID

__all__ = ["Rows", "Ragged", "TooLong", "TOO_LONG_OPTIONS", "LengthLimit", "limit_lengths", "pad_batch"]

logger = logging.getLogger(__name__)

TooLong = Literal["error", "drop", "truncate"]
TOO_LONG_OPTIONS: tuple[str, ...] = ("error", "drop", "truncate")


class Rows(Protocol):
    """A batch's sequences however they are held (a :class:`Ragged`, or lines still in a prepared corpus's shards):
    what a collate pads, and a sequence of arrays for any other use."""

    @property
    def lengths(self) -> np.ndarray: ...

    def padded(self, *, extra: int = 0, multiple: int = 1) -> tuple[np.ndarray, np.ndarray]: ...

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> np.ndarray: ...


@dataclass(frozen=True)
class Ragged:
    """``n`` integer sequences of varying length: sequence ``i`` is ``values[offsets[i]:offsets[i + 1]]``."""

    values: np.ndarray  # (sum of lengths,) int32 (or a prepared corpus's uint16 / uint32 ids)
    offsets: np.ndarray  # (n + 1,) int64, offsets[0] = 0

    @classmethod
    def from_lists(cls, seqs: Sequence[Sequence[int]]) -> Ragged:
        values = np.fromiter((t for s in seqs for t in s), dtype=np.int32, count=sum(map(len, seqs)))
        return cls(values, _offsets(np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))))

    @classmethod
    def from_arrays(cls, seqs: Sequence[np.ndarray]) -> Ragged:
        """Sequences given as arrays (a batch of examples), joined by one ``np.concatenate``; their dtype is kept."""
        if len(seqs) == 0:
            return cls(np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64))
        values = np.concatenate(seqs)
        if values.dtype.kind not in "iu":  # rows given as lists, some empty: [] concatenates as float
            values = values.astype(np.int64)
        return cls(values, _offsets(np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))))

    def padded(self, *, extra: int = 0, multiple: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """The rows left-aligned in a ``PAD_ID`` array -> ``(ids (B, L) int64, real (B, L) bool)``, ``real`` True at
        each row's ids (the padding mask, for free). ``L``: the longest row plus ``extra`` free columns (room for
        a BOS or EOS), rounded up to ``multiple``. One masked assignment places every id: no loop over the rows."""
        if len(self) == 0:
            raise ValueError("cannot pad an empty batch: seqs has no sequences")
        n = self.lengths
        real = np.arange(padded_length(int(n.max()) + extra, multiple)) < n[:, None]
        out = np.full(real.shape, PAD_ID, dtype=np.int64)
        out[real] = self.values[self.offsets[0] : self.offsets[-1]]  # row-major: row by row
        return out, real

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    @property
    def lengths(self) -> np.ndarray:
        return self.offsets[1:] - self.offsets[:-1]


def _offsets(lengths: np.ndarray) -> np.ndarray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    lengths.cumsum(out=offsets[1:])
    return offsets


@dataclass(frozen=True)
class LengthLimit:
    """Outcome of :func:`limit_lengths`: the examples kept, and which of them must be truncated."""

    keep: np.ndarray  # indices into the original examples (int32 while they fit)
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
    index = index_dtype(n)  # keep: int32 indices while they fit (18 MB, not 36, for 4.5M pairs)
    if max_len is None:
        return LengthLimit(np.arange(n, dtype=index), np.zeros(n, dtype=bool), 0, 0)
    if max_len < 2:
        raise ValueError(f"max_len must be >= 2 (room for a token and an end marker), got {max_len}")
    longest = functools.reduce(np.maximum, lengths)  # (N,) in the lengths' dtype: no (sides, N) stack
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
        keep = np.flatnonzero(~over).astype(index)
        if len(keep) == 0:
            raise DataError(
                f"all {n} {what} are longer than max_len={max_len} tokens and were dropped: the data set is empty; "
                "raise max_len or pass too_long='truncate'"
            )
        return LengthLimit(keep, np.zeros(len(keep), dtype=bool), n_over, 0)
    if n_over:
        logger.info("truncated %d of %d %s longer than max_len=%d tokens", n_over, n, what, max_len)
    return LengthLimit(np.arange(n, dtype=index), over, 0, n_over)


def pad_batch(seqs: Sequence[np.ndarray] | Ragged, *, multiple: int = 1) -> tuple[Tensor, Tensor]:
    """Stack rows padded with ``PAD_ID`` -> ``(ids (B, L) long, lengths (B,) long)``; ``L`` is the longest row
    rounded up to ``multiple`` (:func:`~aiayn.data.batching.padded_length`).

    ``seqs``: the rows as arrays, or as one :class:`Ragged`; either way they are placed by :meth:`Ragged.padded`,
    not a loop over the rows."""
    rows = seqs if isinstance(seqs, Ragged) else Ragged.from_arrays(seqs)
    out, _ = rows.padded(multiple=multiple)
    return torch.from_numpy(out), torch.from_numpy(rows.lengths)
