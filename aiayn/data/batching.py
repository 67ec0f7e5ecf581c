"""Batch plans: which example indices form each batch of an epoch, deterministic per (seed, epoch).

A plan is any object with a ``seed`` and ``batches(epoch) -> Batches``. Plans are also
``torch.utils.data`` batch samplers (``set_epoch`` + ``__iter__``), but resuming mid-epoch goes
through :class:`aiayn.data.loader.ResumableLoader`, which counts the batches actually consumed.
"""

from __future__ import annotations

import functools
from typing import Iterator, Protocol, Sequence, overload

import numpy as np

from aiayn.validation import check_positive

__all__ = [
    "BatchPlan", "Batches", "EpochSampler", "TokenBudgetBatchSampler", "FixedSizeBatchSampler", "check_seed", "padded_length",
    "index_dtype", "length_dtype",
]


class Batches:
    """An epoch's batches in three arrays: batch ``b`` is ``order[starts[b]:stops[b]]`` (a view of ``order``).

    One array of example indices for the epoch (int32 while there are fewer than 2**31 examples), not a
    list of Python ints per batch: 4 bytes an example instead of about 36 (160 MB at WMT14's 4.5M pairs).
    A slice (``batches[rank::world_size]``) shares ``order``; only the bounds are copied.
    """

    __slots__ = ("order", "starts", "stops")

    def __init__(self, order: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> None:
        if order.ndim != 1 or starts.shape != stops.shape or starts.ndim != 1:
            raise ValueError(f"order must be 1-D and starts, stops 1-D of one shape; got {order.shape}, {starts.shape}, {stops.shape}")
        self.order, self.starts, self.stops = order, starts, stops

    @classmethod
    def split(cls, order: np.ndarray, size: int, stop: int | None = None) -> Batches:
        """``order[:stop]`` cut into batches of ``size`` examples in turn, the last one shorter when they do not divide."""
        stop = len(order) if stop is None else stop
        starts = np.arange(0, stop, size)
        return cls(order, starts, np.minimum(starts + size, stop))

    def __len__(self) -> int:
        return len(self.starts)

    @overload
    def __getitem__(self, b: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, b: slice) -> Batches: ...

    def __getitem__(self, b: int | slice) -> np.ndarray | Batches:
        if isinstance(b, slice):
            return Batches(self.order, self.starts[b], self.stops[b])
        return self.order[self.starts[b] : self.stops[b]]

    def __iter__(self) -> Iterator[np.ndarray]:
        order = self.order
        return (order[start:stop] for start, stop in zip(self.starts.tolist(), self.stops.tolist()))

    def tolist(self) -> list[list[int]]:
        """The batches as lists of Python ints (what plans returned before they were compact)."""
        return [batch.tolist() for batch in self]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Batches):
            return NotImplemented
        return len(self) == len(other) and all(np.array_equal(a, b) for a, b in zip(self, other))

    def __repr__(self) -> str:
        return f"Batches({len(self)} batches of {int((self.stops - self.starts).sum())} examples)"


class BatchPlan(Protocol):
    seed: int

    def batches(self, epoch: int) -> Batches: ...


class EpochSampler:
    """``set_epoch``/``__iter__``/``__len__`` on top of ``batches(epoch)``, with the last epoch cached."""

    seed: int
    epoch: int = 0
    _cache: tuple[int, Batches] | None = None

    def _plan(self, epoch: int) -> Batches:
        raise NotImplementedError

    def batches(self, epoch: int) -> Batches:
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if self._cache is None or self._cache[0] != epoch:
            self._cache = (epoch, self._plan(epoch))
        return self._cache[1]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter(self.batches(self.epoch))

    def __len__(self) -> int:
        return len(self.batches(self.epoch))


class TokenBudgetBatchSampler(EpochSampler):
    """Length-bucketed batches under a token budget (paper section 5.1: ~25000 source and 25000 target tokens).

    ``lengths`` holds one array per side (e.g. ``[dataset.src_lengths, dataset.tgt_lengths]``), each
    the number of positions an example takes in the batch tensor. A batch of ``n`` examples is
    within budget when ``n * max(length) <= max_tokens`` on every side (the padded size), the longest
    length rounded up to ``pad_to_multiple`` (:func:`padded_length`: the width the collate pads to).
    Integer arrays are kept as they are, not copied: a data set's compact (uint16) lengths serve the plan.
    With ``shuffle``, each epoch orders examples by length with random tie-breaks, packs them
    greedily and shuffles the batches; all of it from ``(seed, epoch)``.
    Raises ``ValueError`` when one example alone exceeds the budget.
    """

    def __init__(
        self,
        lengths: Sequence[Sequence[int] | np.ndarray],
        max_tokens: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        max_sentences: int | None = None,
        pad_to_multiple: int = 1,
    ) -> None:
        check_pad_multiple(pad_to_multiple)
        if len(lengths) == 0:
            raise ValueError("lengths must hold at least one side, got none")
        sides = [_integers(side) for side in lengths]
        n = len(sides[0])
        for k, side in enumerate(sides):
            if side.ndim != 1 or len(side) != n:
                raise ValueError(f"lengths[{k}] must be 1-D with {n} entries like lengths[0], got shape {side.shape}")
        if n == 0:
            raise ValueError("lengths is empty: no examples to batch")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if max_sentences is not None and max_sentences < 1:
            raise ValueError(f"max_sentences must be >= 1 or None, got {max_sentences}")
        for k, side in enumerate(sides):
            worst = int(np.argmax(side))
            if padded_length(int(side[worst]), pad_to_multiple) > max_tokens:
                padded = f" (padded to a multiple of {pad_to_multiple})" if pad_to_multiple > 1 else ""
                raise ValueError(
                    f"example {worst} takes {padded_length(int(side[worst]), pad_to_multiple)} positions{padded} on side {k}, "
                    f"more than max_tokens={max_tokens}: raise max_tokens or lower the data set's max_len"
                )
        check_seed(seed)
        self.lengths = sides  # one (N,) array per side
        self.max_tokens, self.shuffle, self.seed, self.max_sentences = max_tokens, shuffle, seed, max_sentences
        self.pad_to_multiple = pad_to_multiple
        self.epoch, self._cache = 0, None

    def _plan(self, epoch: int) -> Batches:
        rng = np.random.default_rng([self.seed, epoch])
        n = len(self.lengths[0])
        order = (rng.permutation(n) if self.shuffle else np.arange(n)).astype(index_dtype(n))
        order = order[_stable_length_order([side[order] for side in self.lengths])]
        starts, stops = self._pack(order)
        if self.shuffle:
            shuffled = rng.permutation(len(starts))
            starts, stops = starts[shuffled], stops[shuffled]
        return Batches(order, starts, stops)

    def _pack(self, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Greedy packing in ``order``: a batch takes the next example while ``n * padded(longest) <= max_tokens``.
        Returns the batches' ``(starts, stops)`` in ``order``.

        The padded size of a batch depends only on its longest example over all sides, so each example
        counts as that one width, and each batch's end is found with NumPy over a window of the widths
        (no Python loop over the examples: 4.5M pairs are planned in about a second).
        """
        budget, cap, multiple = self.max_tokens, self.max_sentences or len(order), self.pad_to_multiple
        widths = functools.reduce(np.maximum, (side[order] for side in self.lengths))  # (N,) in packing order
        stops: list[int] = []
        start, n = 0, len(order)
        while start < n:
            # k examples need k * padded(their longest) <= budget, and their longest is at least this one's
            window = max(1, min(cap, budget // padded_length(int(widths[start]), multiple), n - start))
            longest = np.maximum.accumulate(widths[start : start + window]).astype(np.int64)  # signed: rounded up below
            sizes = np.arange(1, window + 1) * (-(-longest // multiple) * multiple)
            start += max(1, int(np.count_nonzero(sizes <= budget)))  # sizes only grow: the fitting ones are a prefix
            stops.append(start)
        ends = np.array(stops, dtype=np.int64)
        return np.concatenate([[0], ends[:-1]]), ends


class FixedSizeBatchSampler(EpochSampler):
    """Batches of ``batch_size`` examples, shuffled per ``(seed, epoch)`` when ``shuffle``; the last
    batch is smaller unless ``drop_last``."""

    def __init__(self, n: int, batch_size: int, *, shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> None:
        if n < 1:
            raise ValueError(f"n must be >= 1 (examples to batch), got {n}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if drop_last and n < batch_size:
            raise ValueError(f"drop_last with n={n} < batch_size={batch_size} leaves no batch")
        check_seed(seed)
        self.n, self.batch_size, self.shuffle, self.seed, self.drop_last = n, batch_size, shuffle, seed, drop_last
        self.epoch, self._cache = 0, None

    def _plan(self, epoch: int) -> Batches:
        order = np.random.default_rng([self.seed, epoch]).permutation(self.n) if self.shuffle else np.arange(self.n)
        stop = self.n - self.n % self.batch_size if self.drop_last else self.n
        return Batches.split(order.astype(index_dtype(self.n)), self.batch_size, stop)


def _integers(side: Sequence[int] | np.ndarray) -> np.ndarray:
    """``side`` as an integer array: an integer array as it is (no copy), anything else as int64."""
    if isinstance(side, np.ndarray) and side.dtype.kind in "iu":
        return side
    return np.asarray(side, dtype=np.int64)


def _stable_length_order(sides: list[np.ndarray]) -> np.ndarray:
    """The permutation sorting examples by their length on side 0, then side 1, ..., equal ones keeping their
    order: ``np.lexsort(sides[::-1])``, as radix sorts (one stable sort per side, from the last) when lengths
    fit 16 bits. The permutation is int32 when the examples allow (a 4.5M-pair epoch: 18 MB, not 36)."""
    n = len(sides[0])
    if n == 0 or any(side.min() < 0 or side.max() >= 1 << 16 for side in sides):
        return np.lexsort(sides[::-1])
    index = np.arange(n, dtype=index_dtype(n))
    for side in sides[::-1]:
        index = index[np.argsort(side[index].astype(np.uint16, copy=False), kind="stable")]
    return index


def index_dtype(n: int) -> type[np.signedinteger]:
    """The dtype of indices into ``n`` examples: int32 while they fit, else int64."""
    return np.int32 if n <= np.iinfo(np.int32).max else np.int64


def length_dtype(longest: int) -> type[np.integer]:
    """The smallest dtype holding lengths up to ``longest``: uint16 (WMT14's sentences), int32, else int64."""
    if longest <= np.iinfo(np.uint16).max:
        return np.uint16
    return np.int32 if longest <= np.iinfo(np.int32).max else np.int64


def padded_length(length: int, multiple: int) -> int:
    """``length`` rounded up to a multiple of ``multiple``: batch widths then take few distinct values, so the
    allocator can reuse the blocks of earlier steps instead of holding one set per shape."""
    return -(-length // multiple) * multiple


def check_pad_multiple(multiple: object, name: str = "data.pad_to_multiple") -> None:
    """Raise ``ValueError`` naming ``name`` unless ``multiple`` is a positive int."""
    check_positive(name, multiple)


def check_seed(seed: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
