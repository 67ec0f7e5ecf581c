"""A prepared split read back as sentence pairs: the shards of each side memory-mapped, a batch gathered at once.

Each example is what :class:`~aiayn.data.translation.TranslationDataset` makes of a pair (source ids +
EOS, target ids), so the same batches come out; ``max_len`` / ``too_long`` are applied when the shards
are opened, from the index alone. What stays in the process is small: the lengths the batch plan is made
from, in the smallest dtype that holds them (uint16 at WMT14's scale), and which lines are kept or cut.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from torch.utils.data import Dataset

from aiayn.data.batching import length_dtype
from aiayn.data.encoded import Ragged, TooLong, limit_lengths, take_grouped
from aiayn.data.shards import Shard
from aiayn.data.translation import PairBatch

__all__ = ["PreparedSide", "PreparedPairs"]


@dataclass(frozen=True)
class _Lines:
    """A batch's lines as the shards hold them, found once for both sides: grouped by shard (in batch order
    within one) so that each shard is read in one slice, with the way back to the batch's order."""

    local: np.ndarray  # each line's number in its shard, grouped
    bounds: np.ndarray | None  # local[bounds[k]:bounds[k + 1]] lie in shard k; None: one shard, nothing grouped
    order: np.ndarray | None  # grouped line g is line order[g] of the batch
    back: np.ndarray | None  # and line r of the batch is grouped line back[r]

    @classmethod
    def of(cls, lines: np.ndarray, shard_lines: int, n_shards: int) -> _Lines:
        if n_shards == 1:
            return cls(lines, None, None, None)
        shard, local = np.divmod(lines, shard_lines)
        order = shard.argsort(kind="stable")
        bounds = shard.searchsorted(np.arange(n_shards + 1), sorter=order)
        return cls(local[order], bounds, order, order.argsort())


class PreparedSide:
    """One side of a split: its shards end to end; line ``i`` is line ``i % shard_lines`` of shard ``i // shard_lines``."""

    def __init__(self, shards: list[Shard], shard_lines: int) -> None:
        self.shards, self.shard_lines = shards, shard_lines
        self._mapped: tuple[list[np.ndarray], list[np.ndarray]] | None = None  # each shard's (tokens, index), once mapped

    def lengths(self, plus: int = 0) -> np.ndarray:
        """Each line's length plus ``plus``, in the smallest dtype that holds them (uint16 for WMT14's sentences):
        written shard by shard into that array, with no full-size int64 copy on the way."""
        longest = max((int(s.lengths.max()) for s in self.shards if len(s)), default=0)
        out = np.empty(sum(len(s) for s in self.shards), dtype=length_dtype(longest + plus))
        start = 0
        for s in self.shards:
            np.add(s.lengths, plus, out=out[start : start + len(s)], casting="unsafe")  # every value fits: see longest
            start += len(s)
        return out

    def take(self, lines: _Lines, most: np.ndarray | None = None) -> Ragged:
        """A batch's lines, line ``r`` cut to its first ``most[r]`` ids, as one :class:`Ragged` in the batch's order:
        their ``(offset, length)`` read from the shards' indexes and their ids copied, one ``take`` a shard each."""
        if self._mapped is None:
            self._mapped = [s.tokens for s in self.shards], [s.index for s in self.shards]
        tokens, index = self._mapped
        entries = take_grouped(index, lines.local, lines.bounds)  # (B, 2): offset, length
        if most is not None:
            most = most if lines.order is None else most[lines.order]
        lengths = entries[:, 1] if most is None else np.minimum(entries[:, 1], most)
        # Each line's first id read on its own first: B independent loads that the CPU overlaps, so that the copy of
        # every id finds them in cache (lines lie at random in 100s of MB of shards; the copy is then about 2x faster).
        take_grouped(tokens, entries[:, 0], lines.bounds, mode="clip")
        rows = Ragged.gather(tokens, entries[:, 0], lengths, lines.bounds)
        return rows if lines.back is None else rows.take(lines.back)

    def __getstate__(self) -> dict[str, object]:
        return {"shards": self.shards, "shard_lines": self.shard_lines, "_mapped": None}  # a worker maps the files itself


class PreparedPairs(Dataset):
    """Sentence pairs read from shards: item ``i`` is ``(source ids + EOS, target ids)`` as in ``TranslationDataset``.

    ``src_lengths``/``tgt_lengths`` are the ``S``/``T`` each example takes in a batch, from the index alone,
    in the smallest dtype that holds them (uint16 at WMT14's scale: 9 MB a side for 4.5M pairs).
    A batch is read whole by ``__getitems__`` (the DataLoader's batched protocol), into a :class:`PairBatch`.
    """

    def __init__(self, src: PreparedSide, tgt: PreparedSide, *, max_len: int | None, too_long: TooLong, eos_id: int) -> None:
        src_len, tgt_len = src.lengths(), tgt.lengths(plus=1)
        limit = limit_lengths([src_len, tgt_len], max_len, too_long, "sentence pairs")
        self.src, self.tgt, self.eos_id, self.cap, self.n = src, tgt, eos_id, max_len or 0, len(limit.keep)
        self.n_dropped, self.n_truncated = limit.n_dropped, limit.n_truncated
        # None when every line is kept / none is cut: 5 bytes a line less in the process and in every worker
        self.keep = limit.keep if limit.n_dropped else None  # int32 indices while they fit (limit_lengths)
        self.truncate = limit.truncate if limit.n_truncated else None
        del limit
        if self.keep is not None:
            src_len, tgt_len = src_len[self.keep], tgt_len[self.keep]
        if self.truncate is not None:  # a truncated pair is cut on both sides, as TranslationDataset.encode cuts it (see __getitems__)
            src_len = _cut(src_len, self.truncate, self.cap - 1, 1)
            tgt_len = _cut(tgt_len, self.truncate, self.cap, 0)
        self.src_lengths, self.tgt_lengths = src_len, tgt_len

    def __len__(self) -> int:
        return self.n

    def __getitems__(self, indices: Sequence[int] | np.ndarray) -> PairBatch:
        """Examples ``indices`` at once: their lines' ids gathered from the shards with NumPy, no loop over the examples."""
        i = np.asarray(indices)
        if len(i) and (int(i.min()) < 0 or int(i.max()) >= self.n):  # a line past a shard's end would read another's ids
            raise IndexError(f"example indices must be in [0, {self.n}), got {int(i.min())} to {int(i.max())}")
        lines = _Lines.of(i if self.keep is None else self.keep[i], self.src.shard_lines, len(self.src.shards))
        cut = None if self.truncate is None else self.truncate[i]
        if cut is None or not cut.any():
            return PairBatch(self.src.take(lines), self.tgt.take(lines))
        # As TranslationDataset.encode: a truncated pair keeps cap - 1 source ids then EOS, and cap - 1 target ids.
        most = np.where(cut, self.cap - 1, np.iinfo(np.int64).max)
        return PairBatch(self.src.take(lines, most).append(self.eos_id, cut), self.tgt.take(lines, most))

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.__getitems__([i])[0]

    def __getstate__(self) -> dict[str, Any]:
        # A DataLoader worker only reads examples: the lengths (for the batch plan) stay in the main process.
        return {k: v for k, v in self.__dict__.items() if k not in ("src_lengths", "tgt_lengths")}


def _cut(lengths: np.ndarray, rows: np.ndarray, most: int, plus: int) -> np.ndarray:
    """``lengths`` with ``min(length, most) + plus`` where ``rows`` is set: what truncation leaves of those pairs."""
    cut = np.minimum(lengths[rows].astype(np.int64), most) + plus
    out = lengths.astype(length_dtype(max(int(lengths.max()), int(cut.max()))), copy=False)  # ours: changed in place
    out[rows] = cut
    return out
