"""Encoded sentence pairs for translation and their collate function.

Each example is ``(src, y)``: ``src`` = the source ids (+ EOS by default, as fairseq does, so the
encoder sees where the sentence ends) and ``y`` = the target ids; the batch makes
``tgt_in = BOS + y`` and ``tgt_out = y + EOS``, so a target side takes ``T = len(y) + 1`` positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from aiayn.data.batch import TranslationBatch
from aiayn.data.encoded import Ragged, Rows, TooLong, limit_lengths
from aiayn.data.readers import ParallelText
from aiayn.tokenization.base import Tokenizer
from aiayn.tokenization.special import BOS_ID, EOS_ID, encode_sources, special_ids

__all__ = ["TranslationDataset", "PairBatch", "collate_translation"]


class TranslationDataset(Dataset):
    """Encoded pairs; ``src_lengths``/``tgt_lengths`` are the ``S``/``T`` each example takes in a batch.

    ``n_dropped`` and ``n_truncated`` report what ``max_len`` did when the set was encoded.
    """

    def __init__(self, src: Ragged, tgt: Ragged, *, n_dropped: int = 0, n_truncated: int = 0) -> None:
        if len(src) != len(tgt):
            raise ValueError(f"src has {len(src)} sequences but tgt has {len(tgt)}")
        self.src, self.tgt = src, tgt
        self.n_dropped, self.n_truncated = n_dropped, n_truncated

    @classmethod
    def encode(
        cls,
        pairs: ParallelText,
        src_tokenizer: Tokenizer,
        tgt_tokenizer: Tokenizer,
        *,
        max_len: int | None = None,
        too_long: TooLong = "error",
        src_eos: bool = True,
    ) -> TranslationDataset:
        """Tokenize ``pairs``; a pair with ``S`` or ``T`` above ``max_len`` is handled per ``too_long``
        (``"error"``, ``"drop"`` or ``"truncate"``). Raises ``DataError`` when no pair is left."""
        src_ids = encode_sources(src_tokenizer, pairs.src) if src_eos else src_tokenizer.encode_batch(pairs.src)
        src_eos_id = special_ids(src_tokenizer).eos  # ours (2) or the tokenizer's own (Marian: 0)
        tgt_ids = tgt_tokenizer.encode_batch(pairs.tgt)
        src_len = np.array([len(s) for s in src_ids], dtype=np.int64)
        tgt_len = np.array([len(t) + 1 for t in tgt_ids], dtype=np.int64)
        limit = limit_lengths([src_len, tgt_len], max_len, too_long, "sentence pairs")
        cap = max_len or 0  # only read for truncated pairs, which exist only with a max_len
        src_out, tgt_out = [], []
        for i, cut in zip(limit.keep.tolist(), limit.truncate.tolist()):
            s, t = src_ids[i], tgt_ids[i]
            if cut:
                s = s[: cap - 1] + [src_eos_id] if src_eos else s[:cap]
                t = t[: cap - 1]
            src_out.append(s)
            tgt_out.append(t)
        return cls(
            Ragged.from_lists(src_out), Ragged.from_lists(tgt_out), n_dropped=limit.n_dropped, n_truncated=limit.n_truncated
        )

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.src[i], self.tgt[i]

    @property
    def src_lengths(self) -> np.ndarray:
        return self.src.lengths

    @property
    def tgt_lengths(self) -> np.ndarray:
        return self.tgt.lengths + 1


@dataclass(frozen=True, eq=False)
class PairBatch:
    """A batch of ``(src, y)`` examples held as two sides of :class:`~aiayn.data.encoded.Rows` (a :class:`Ragged`,
    or :class:`~aiayn.data.prepared_pairs.ShardRows` from a prepared corpus), so the collate pads each side
    without a loop over the pairs. It is also a sequence of the pairs (item ``i`` is ``(src[i], tgt[i])``),
    for any other collate."""

    src: Rows
    tgt: Rows

    @classmethod
    def of(cls, examples: Sequence[tuple[np.ndarray, np.ndarray]] | PairBatch) -> PairBatch:
        """``examples`` as a PairBatch: itself when it is one, else its pairs' sides joined."""
        if isinstance(examples, PairBatch):
            return examples
        return cls(Ragged.from_arrays([e[0] for e in examples]), Ragged.from_arrays([e[1] for e in examples]))

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"pair {i} out of range for a batch of {len(self)}")
        i = i % len(self)  # Ragged reads offsets[i + 1]: no negative index
        return self.src[i], self.tgt[i]

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        return (self[i] for i in range(len(self)))


def collate_translation(
    examples: Sequence[tuple[np.ndarray, np.ndarray]] | PairBatch, rng: np.random.Generator | None = None,
    *, bos_id: int = BOS_ID, eos_id: int = EOS_ID, pad_to_multiple: int = 1,
) -> TranslationBatch:
    """Pad ``(src, y)`` examples (a list of pairs, or a :class:`PairBatch`) into a :class:`TranslationBatch`
    (``rng`` is unused: no randomness).

    ``bos_id`` / ``eos_id``: the target tokenizer's (Marian starts from its pad id and ends with 0);
    ``pad_to_multiple``: both lengths are rounded up to a multiple of it (masked padding).
    """
    pairs = PairBatch.of(examples)
    src, src_mask = pairs.src.padded(multiple=pad_to_multiple)
    # y once, with a free column: tgt_out is y + EOS, and tgt_in = BOS + y is the same ids one column right
    tgt_out, _ = pairs.tgt.padded(extra=1, multiple=pad_to_multiple)
    n = pairs.tgt.lengths
    tgt_in = np.empty_like(tgt_out)
    tgt_in[:, 0] = bos_id
    tgt_in[:, 1:] = tgt_out[:, :-1]  # the last column of tgt_out is padding in every row
    tgt_out[np.arange(len(n)), n] = eos_id
    return TranslationBatch(
        src=torch.from_numpy(src),
        tgt_in=torch.from_numpy(tgt_in),
        tgt_out=torch.from_numpy(tgt_out),
        src_mask=torch.from_numpy(src_mask),
        tgt_mask=torch.from_numpy(np.arange(tgt_out.shape[1]) <= n[:, None]),  # y and its EOS
    )
