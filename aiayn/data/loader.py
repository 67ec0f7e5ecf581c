"""A resumable batch iterator over a data set, a batch plan and a collate function.

It runs a ``torch.utils.data.DataLoader`` (so workers work) and counts the batches it has handed
to the caller, not the ones workers prefetched, so ``state_dict()`` taken after ``k`` batches
resumes exactly at batch ``k + 1`` of the same epoch. Collate functions get a NumPy generator
seeded by ``(seed, epoch, position, rank)``, so random choices (MLM masking) are reproducible
in any worker and after a resume.
"""

from __future__ import annotations

from typing import Any, Callable, Generic, Iterator, Sequence, TypeVar

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from aiayn.data.batching import BatchPlan

__all__ = ["ResumableLoader"]

BatchT = TypeVar("BatchT")
_STATE_VERSION = 1


class ResumableLoader(Generic[BatchT]):
    """Iterate batches epoch by epoch, resumable mid-epoch through ``state_dict``/``load_state_dict``.

    ``for batch in loader`` yields the rest of the current epoch and then moves to the next one.
    ``collate(examples, rng)`` builds a batch. With ``world_size > 1`` rank ``r`` takes batches
    ``r, r + world_size, ...`` of each epoch, cut to the same count on every rank.
    """

    def __init__(
        self,
        dataset: Dataset,
        plan: BatchPlan,
        collate: Callable[[list[Any], np.random.Generator], BatchT],
        *,
        num_workers: int = 0,
        pin_memory: bool = False,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        self.dataset, self.plan, self.collate = dataset, plan, collate
        self.num_workers, self.pin_memory, self.rank, self.world_size = num_workers, pin_memory, rank, world_size
        self.epoch = 0
        self.position = 0  # batches of this epoch already handed out

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches (lists of example indices) of ``epoch``."""
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
        # Made batch by batch as the DataLoader asks: a list of every key of an epoch of 4.5M pairs would take 0.5 GB.
        keyed = ([(epoch, pos, i) for i in batch] for pos, batch in enumerate(batches[start:], start))
        loader = DataLoader(
            _Keyed(self.dataset),
            batch_sampler=keyed,
            collate_fn=_KeyedCollate(self.collate, self.plan.seed, self.rank),
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


class _Keyed(Dataset):
    """Dataset indexed by ``(epoch, position, index)``; passes the key along to the collate."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __getitem__(self, key: tuple[int, int, int]) -> tuple[tuple[int, int, int], Any]:
        return key, self.dataset[key[2]]

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]


class _KeyedCollate:
    def __init__(self, collate: Callable[[list[Any], np.random.Generator], Any], seed: int, rank: int) -> None:
        self.collate, self.seed, self.rank = collate, seed, rank

    def __call__(self, items: Sequence[tuple[tuple[int, int, int], Any]]) -> Any:
        epoch, position, _ = items[0][0]
        rng = np.random.default_rng([self.seed, epoch, position, self.rank])
        return self.collate([example for _, example in items], rng)
