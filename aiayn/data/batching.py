"""Batch plans: which example indices form each batch of an epoch, deterministic per (seed, epoch).

A plan is any object with a ``seed`` and ``batches(epoch) -> list[list[int]]``. Plans are also
``torch.utils.data`` batch samplers (``set_epoch`` + ``__iter__``), but resuming mid-epoch goes
through :class:`aiayn.data.loader.ResumableLoader`, which counts the batches actually consumed.
"""

from __future__ import annotations

from typing import Iterator, Protocol, Sequence

import numpy as np

from aiayn.validation import check_positive

__all__ = ["BatchPlan", "EpochSampler", "TokenBudgetBatchSampler", "FixedSizeBatchSampler", "check_seed", "padded_length"]


class BatchPlan(Protocol):
    seed: int

    def batches(self, epoch: int) -> list[list[int]]: ...


class EpochSampler:
    """``set_epoch``/``__iter__``/``__len__`` on top of ``batches(epoch)``, with the last epoch cached."""

    seed: int
    epoch: int = 0
    _cache: tuple[int, list[list[int]]] | None = None

    def _plan(self, epoch: int) -> list[list[int]]:
        raise NotImplementedError

    def batches(self, epoch: int) -> list[list[int]]:
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if self._cache is None or self._cache[0] != epoch:
            self._cache = (epoch, self._plan(epoch))
        return self._cache[1]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches(self.epoch))

    def __len__(self) -> int:
        return len(self.batches(self.epoch))


class TokenBudgetBatchSampler(EpochSampler):
    """Length-bucketed batches under a token budget (paper section 5.1: ~25000 source and 25000 target tokens).

    ``lengths`` holds one array per side (e.g. ``[dataset.src_lengths, dataset.tgt_lengths]``), each
    the number of positions an example takes in the batch tensor. A batch of ``n`` examples is
    within budget when ``n * max(length) <= max_tokens`` on every side (the padded size), the longest
    length rounded up to ``pad_to_multiple`` (:func:`padded_length`: the width the collate pads to).
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
        sides = [np.asarray(side, dtype=np.int64) for side in lengths]
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
        self.lengths = np.stack(sides)  # (sides, N)
        self.max_tokens, self.shuffle, self.seed, self.max_sentences = max_tokens, shuffle, seed, max_sentences
        self.pad_to_multiple = pad_to_multiple
        self.epoch, self._cache = 0, None

    def _plan(self, epoch: int) -> list[list[int]]:
        rng = np.random.default_rng([self.seed, epoch])
        n = self.lengths.shape[1]
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        order = order[_stable_length_order(self.lengths[:, order])]
        batches = self._pack(order)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def _pack(self, order: np.ndarray) -> list[list[int]]:
        """Greedy packing in ``order``: a batch takes the next example while ``n * padded(longest) <= max_tokens``.

        The padded size of a batch depends only on its longest example over all sides, so each example
        counts as that one width, and each batch's end is found with NumPy over a window of the widths
        (no Python loop over the examples: 4.5M pairs are planned in about a second).
        """
        budget, cap, multiple = self.max_tokens, self.max_sentences or len(order), self.pad_to_multiple
        widths = self.lengths[:, order].max(axis=0)  # (N,) in packing order
        batches: list[list[int]] = []
        start, n = 0, len(order)
        while start < n:
            # k examples need k * padded(their longest) <= budget, and their longest is at least this one's
            window = max(1, min(cap, budget // padded_length(int(widths[start]), multiple), n - start))
            longest = np.maximum.accumulate(widths[start : start + window])
            sizes = np.arange(1, window + 1) * (-(-longest // multiple) * multiple)
            k = max(1, int(np.count_nonzero(sizes <= budget)))  # sizes only grow: the fitting ones are a prefix
            batches.append(order[start : start + k].tolist())
            start += k
        return batches


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

    def _plan(self, epoch: int) -> list[list[int]]:
        order = np.random.default_rng([self.seed, epoch]).permutation(self.n) if self.shuffle else np.arange(self.n)
        stop = self.n - self.n % self.batch_size if self.drop_last else self.n
        return [order[i : i + self.batch_size].tolist() for i in range(0, stop, self.batch_size)]


def _stable_length_order(lengths: np.ndarray) -> np.ndarray:
    """The permutation sorting ``(sides, N)`` lengths by side 0, then side 1, ..., equal ones keeping their order:
    ``np.lexsort(lengths[::-1])``, as radix sorts (one stable sort per side, from the last) when lengths fit 16 bits."""
    if lengths.size == 0 or lengths.min() < 0 or lengths.max() >= 1 << 16:
        return np.lexsort(lengths[::-1])
    index = np.arange(lengths.shape[1])
    for side in lengths[::-1]:
        index = index[np.argsort(side[index].astype(np.uint16), kind="stable")]
    return index


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
