"""A prepared split read back as sentence pairs: the shards of each side memory-mapped, a batch gathered at once.

Each example is what :class:`~aiayn.data.translation.TranslationDataset` makes of a pair (source ids +
EOS, target ids), so the same batches come out; ``max_len`` / ``too_long`` are applied when the shards
are opened, from the index alone. What stays in the process is small: the lengths the batch plan is made
from, in the smallest dtype that holds them (uint16 at WMT14's scale), which lines are kept or cut, and,
from the first batch, each line's start (18 MB a side at 4.5M lines); the ids stay in the shards
until a collate pads a batch of them (:class:`ShardRows`).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from torch.utils.data import Dataset

from aiayn.data.batching import index_dtype, length_dtype, padded_length
from aiayn.data.encoded import Ragged, TooLong, limit_lengths
from aiayn.data.shards import Shard
from aiayn.data.translation import PairBatch
from aiayn.tokenization.special import PAD_ID

__all__ = ["ShardRows", "PreparedSide", "PreparedPairs"]


@dataclass(frozen=True)
class _Lines:
    """A batch's lines as the shards hold them, found once for both sides: grouped by shard (in batch order
    within one) so that each shard is read in one slice, with the way back to the batch's order."""

    lines: np.ndarray  # the lines (numbers over the whole side), grouped
    bounds: np.ndarray | None  # lines[bounds[k]:bounds[k + 1]] lie in shard k; None: one shard, nothing grouped
    order: np.ndarray | None  # grouped line g is line order[g] of the batch
    back: np.ndarray | None  # and line r of the batch is grouped line back[r]

    @classmethod
    def of(cls, lines: np.ndarray, shard_lines: int, n_shards: int) -> _Lines:
        if n_shards == 1:
            return cls(lines, None, None, None)
        shard = lines // shard_lines
        order = shard.argsort(kind="stable")
        bounds = shard.searchsorted(np.arange(n_shards + 1), sorter=order)
        return cls(lines[order], bounds, order, order.argsort())

    def grouped(self, values: np.ndarray) -> np.ndarray:
        """``values`` (one per line, in the batch's order) in the grouped order."""
        return values if self.order is None else values[self.order]


@dataclass(frozen=True, eq=False)
class ShardRows:
    """One side of a batch with its lines still in the shards: each line's first id and how many ids to read,
    grouped by shard (:class:`_Lines`). :meth:`padded` reads them straight into the batch's ``(B, L)`` array,
    one ``take`` a shard and no copy in between; indexing reads a line as an array, for any other collate."""

    parts: Sequence[np.ndarray]  # each shard's ids
    starts: np.ndarray  # (B,) each line's first id in its shard, grouped
    counts: np.ndarray  # (B,) the ids to read of each line (after a cut), grouped
    lines: _Lines
    end_id: int = 0  # an id added after the line where ``ended`` is set: the source EOS of a truncated pair
    ended: np.ndarray | None = None  # (B,) bool, grouped

    def append(self, value: int, where: np.ndarray) -> ShardRows:
        """These lines, with ``value`` added at the end of each one where ``where`` (bool, in the batch's order) is set."""
        return dataclasses.replace(self, end_id=value, ended=self.lines.grouped(where))

    def _in_batch_order(self, grouped: np.ndarray) -> np.ndarray:
        return grouped if self.lines.back is None else grouped[self.lines.back]

    @property
    def lengths(self) -> np.ndarray:
        return self._in_batch_order(self.counts if self.ended is None else self.counts + self.ended)

    def padded(self, *, extra: int = 0, multiple: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """As :meth:`Ragged.padded <aiayn.data.encoded.Ragged.padded>`: ``(ids (B, L) int64, real (B, L) bool)``."""
        if len(self) == 0:
            raise ValueError("cannot pad an empty batch: seqs has no sequences")
        n = self.counts
        cols = np.arange(padded_length(int((n if self.ended is None else n + self.ended).max()) + extra, multiple))
        where = self.starts[:, None] + cols  # each cell's place in its shard; past its line's end, masked below
        ids = np.empty(where.shape, dtype=self.parts[0].dtype)
        ends = [0, len(n)] if self.lines.bounds is None else self.lines.bounds.tolist()
        spans = [(part, a, b) for part, a, b in zip(self.parts, ends[:-1], ends[1:]) if a < b]
        # Each line's first id read on its own first: B independent loads that the CPU overlaps, so that the copy
        # finds them in cache (lines lie at random in 100s of MB of shards: the batch is read ~1.3x faster).
        for part, a, b in spans:
            part.take(self.starts[a:b], mode="clip")
        for part, a, b in spans:  # clip: a cell past the shard's last id reads that id (it is padding)
            part.take(where[a:b], out=ids[a:b], mode="clip")
        n = self._in_batch_order(n)
        real = cols < n[:, None]
        ids = np.where(real, self._in_batch_order(ids), np.int64(PAD_ID))  # int64, padding put in the same pass
        if self.ended is not None:
            rows = np.flatnonzero(self._in_batch_order(self.ended))
            ids[rows, n[rows]], real[rows, n[rows]] = self.end_id, True
        return ids, real

    @functools.cached_property
    def _ragged(self) -> Ragged:
        ids, real = self.padded()
        return Ragged(ids[real], np.concatenate([[0], self.lengths.cumsum()]))

    def __len__(self) -> int:
        return len(self.counts)

    def __getitem__(self, i: int) -> np.ndarray:
        return self._ragged[i]


class PreparedSide:
    """One side of a split: its shards end to end; line ``i`` is line ``i % shard_lines`` of shard ``i // shard_lines``."""

    def __init__(self, shards: list[Shard], shard_lines: int) -> None:
        self.shards, self.shard_lines = shards, shard_lines
        # Read once, when first asked for: each line's length (lengths); at the first batch (take), each shard's ids,
        # mapped, and each line's first id in its shard.
        self._lengths: np.ndarray | None = None
        self._tokens: list[np.ndarray] | None = None
        self._starts: np.ndarray | None = None

    def lengths(self, plus: int = 0) -> np.ndarray:
        """Each line's length plus ``plus``, in the smallest dtype that holds them (uint16 for WMT14's sentences).

        The lengths are read from the indexes once, shard by shard into that array (no full-size int64 copy on
        the way), and kept: ``lengths()`` is that array itself, which the batch plan and :meth:`take` share
        (read-only); with ``plus`` a new one."""
        if self._lengths is None:
            longest = max((int(s.lengths.max()) for s in self.shards if len(s)), default=0)
            self._lengths = np.empty(sum(len(s) for s in self.shards), dtype=length_dtype(longest))
            start = 0
            for s in self.shards:
                self._lengths[start : start + len(s)] = s.lengths
                start += len(s)
        if plus == 0:
            return self._lengths
        return np.add(self._lengths, plus, dtype=length_dtype(int(self._lengths.max(initial=0)) + plus))

    def take(self, lines: _Lines, most: np.ndarray | None = None) -> ShardRows:
        """A batch's lines, line ``r`` cut to its first ``most[r]`` ids (``most`` in the batch's order), as :class:`ShardRows`.

        Where each line starts is read from a copy of the indexes' offsets made at the first batch (int32: 18 MB
        a side for WMT14's 4.5M lines, in huge pages), and how long it is from :meth:`lengths`: a batch's lines
        lie at random in the side, and reading them from the memory-mapped indexes, one ``take`` a shard through
        4 kB pages, made the loader about 1.5x slower."""
        if self._tokens is None or self._starts is None:
            self._tokens = [s.tokens for s in self.shards]
            largest = max((len(t) for t in self._tokens), default=0)
            self._starts = np.concatenate([s.index[:, 0] for s in self.shards]).astype(index_dtype(largest))
        counts = self.lengths().take(lines.lines).astype(np.int64)
        if most is not None:
            np.minimum(counts, lines.grouped(most), out=counts)
        return ShardRows(self._tokens, self._starts.take(lines.lines).astype(np.int64), counts, lines)

    def __getstate__(self) -> dict[str, object]:
        # a worker maps the files and reads the indexes itself
        return {"shards": self.shards, "shard_lines": self.shard_lines, "_tokens": None, "_starts": None, "_lengths": None}


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
        """Examples ``indices`` at once, no loop over them: their lines found in the shards' indexes, their ids read
        when the collate pads them (:class:`ShardRows`)."""
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
    out = lengths.astype(length_dtype(max(int(lengths.max()), int(cut.max()))))  # a copy: lengths may be a side's own
    out[rows] = cut
    return out
