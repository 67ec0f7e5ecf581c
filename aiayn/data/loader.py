"""A resumable batch iterator over a data set, a batch plan and a collate function.

It runs a ``torch.utils.data.DataLoader`` (so workers work) and counts the batches it has handed
to the caller, not the ones workers prefetched, so ``state_dict()`` taken after ``k`` batches
resumes exactly at batch ``k + 1`` of the same epoch. Collate functions get a NumPy generator
seeded by ``(seed, epoch, position, rank)``, so random choices (MLM masking) are reproducible
in any worker and after a resume.

A batch is fetched whole (:func:`fetch`): a data set with ``__getitems__`` (torch's batched protocol)
reads all its examples at once, as the prepared shards do, any other one item by item.
"""

from __future__ import annotations

from typing import Any, Callable, Generic, Iterable, Iterator, NamedTuple, TypeVar

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from aiayn.data.batching import Batches, BatchPlan

__all__ = ["ResumableLoader", "fetch"]

BatchT = TypeVar("BatchT")
_STATE_VERSION = 1


class ResumableLoader(Generic[BatchT]):
    """Iterate batches epoch by epoch, resumable mid-epoch through ``state_dict``/``load_state_dict``.

    ``for batch in loader`` yields the rest of the current epoch and then moves to the next one.
    ``collate(examples, rng)`` builds a batch from what :func:`fetch` gives; ``collate_rng=False`` says
    that it draws nothing, so it gets ``rng=None`` and no generator is seeded for each batch (tens of
    microseconds a batch). With ``world_size > 1`` rank ``r`` takes batches ``r, r + world_size, ...`` of
    each epoch, cut to the same count on every rank.
    """

    def __init__(
        self,
        dataset: Dataset,
        plan: BatchPlan,
        collate: Callable[[Any, np.random.Generator | None], BatchT],
        *,
        collate_rng: bool = True,
        num_workers: int = 0,
        pin_memory: bool = False,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        self.dataset, self.plan, self.collate, self.collate_rng = dataset, plan, collate, collate_rng
        self.num_workers, self.pin_memory, self.rank, self.world_size = num_workers, pin_memory, rank, world_size
        self.epoch = 0
        self.position = 0  # batches of this epoch already handed out

    def epoch_batches(self, epoch: int) -> Batches:
        """This rank's batches (arrays of example indices) of ``epoch``."""
        batches = self.plan.batches(epoch)
        per_rank = len(batches) // self.world_size
        if per_rank == 0:
            raise ValueError(f"an epoch has {len(batches)} batches, fewer than world_size={self.world_size}")
        return batches[self.rank :: self.world_size][:per_rank]

    def __len__(self) -> int:
        return len(self.epoch_batches(self.epoch))

    def __iter__(self) -> Iterator[BatchT]:
        batches = self.epoch_batches(self.epoch)
        if self.position >= len(batches):  # resumed right after the last batch of an epoch
            self.epoch, self.position = self.epoch + 1, 0
            batches = self.epoch_batches(self.epoch)
        epoch, start = self.epoch, self.position
        # One key a batch (a view of the plan), made as the DataLoader asks for it. torch types a batch sampler's
        # items as lists of indices, but its fetcher hands whatever they are to __getitems__ (_Keyed's).
        keys = (_Key(epoch, pos, batch) for pos, batch in enumerate(batches[start:], start))
        dataset, collate = _Keyed(self.dataset), _KeyedCollate(self.collate, self.plan.seed if self.collate_rng else None, self.rank)
        loader: Iterable[BatchT]
        if self.num_workers == 0 and not self.pin_memory:
            # In this process, what a DataLoader would do without its machinery (a profiler range and a fetcher
            # a batch: ~10% of a WMT14 micro-batch's time in the loader)
            loader = (collate(dataset.__getitems__(key)) for key in keys)
        else:
            loader = DataLoader(
                dataset,
                batch_sampler=keys,  # type: ignore[arg-type]
                collate_fn=collate,  # type: ignore[arg-type]
                num_workers=self.num_workers,
                pin_memory=self.pin_memory,
                # Its own generator: a DataLoader otherwise draws a worker seed from the global RNG each time
                # it starts an epoch, which would shift dropout masks after a resume.
                generator=torch.Generator().manual_seed(self.plan.seed * 1_000_003 + epoch),
            )
        for batch in loader:
            self.position += 1
            yield batch
        self.epoch, self.position = epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        """Plain JSON-serialisable position: where the next batch comes from."""
        return {
            "version": _STATE_VERSION,
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.plan.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "n_examples": len(self.dataset),  # type: ignore[arg-type]
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume at ``state``. Raises ``ValueError`` when it was saved for another seed, data set size
        or sharding, since the batches would then differ."""
        expected = self.state_dict()
        missing = sorted(set(expected) - set(state))
        if missing:
            raise ValueError(f"loader state is missing keys {missing}; got keys {sorted(state)}")
        for key in ("version", "seed", "rank", "world_size", "n_examples"):
            if state[key] != expected[key]:
                raise ValueError(f"loader state has {key}={state[key]!r} but this loader has {key}={expected[key]!r}")
        for key in ("epoch", "position"):
            if isinstance(state[key], bool) or not isinstance(state[key], int) or state[key] < 0:
                raise ValueError(f"loader state {key} must be an int >= 0, got {state[key]!r}")
        self.epoch, self.position = state["epoch"], state["position"]


def fetch(dataset: Dataset, indices: np.ndarray) -> Any:
    """The examples ``indices`` (a 1-D integer array) of ``dataset``, for a collate function: what its
    ``__getitems__`` returns when it has one (the whole batch in a few array operations, e.g. a
    :class:`~aiayn.data.translation.PairBatch`), else the list of its items (indices as Python ints)."""
    getitems = getattr(dataset, "__getitems__", None)
    if getitems is not None:
        return getitems(indices)
    return [dataset[i] for i in indices.tolist()]


class _Key(NamedTuple):
    """What the DataLoader's batch sampler yields: a whole batch, and where it sits in the run."""

    epoch: int
    position: int
    indices: np.ndarray


class _Keyed(Dataset):
    """Dataset read a batch at a time by ``_Key``: torch's fetcher passes the key to ``__getitems__``
    as it is, and the examples go on with their key to the collate."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __getitems__(self, key: _Key) -> tuple[_Key, Any]:
        return key, fetch(self.dataset, key.indices)

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]


class _KeyedCollate:
    """The collate with its generator, seeded by ``(seed, epoch, position, rank)``; ``seed=None``: no generator."""

    def __init__(self, collate: Callable[[Any, np.random.Generator | None], Any], seed: int | None, rank: int) -> None:
        self.collate, self.seed, self.rank = collate, seed, rank

    def __call__(self, keyed: tuple[_Key, Any]) -> Any:
        key, examples = keyed
        rng = None if self.seed is None else np.random.default_rng([self.seed, key.epoch, key.position, self.rank])
        return self.collate(examples, rng)
