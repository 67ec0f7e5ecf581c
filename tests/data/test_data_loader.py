"""ResumableLoader: exact resume mid-epoch and across epochs, with and without workers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from aiayn.data import (
    FixedSizeBatchSampler,
    MLMCollate,
    ParallelText,
    ResumableLoader,
    SentenceDataset,
    TokenBudgetBatchSampler,
    TranslationDataset,
    collate_translation,
    fetch,
)
from aiayn.tokenization import CharTokenizer


@pytest.fixture(scope="module")
def translation() -> TranslationDataset:
    rng = np.random.default_rng(0)
    src = ["".join(rng.choice(list("abcdefg"), size=rng.integers(1, 20))) for _ in range(300)]
    tgt = ["".join(rng.choice(list("uvwxyz"), size=rng.integers(1, 20))) for _ in range(300)]
    tok = CharTokenizer.train(src + tgt)
    return TranslationDataset.encode(ParallelText(src, tgt), tok, tok)


def _loader(ds: TranslationDataset, **kwargs) -> ResumableLoader:
    plan = TokenBudgetBatchSampler([ds.src_lengths, ds.tgt_lengths], 120, seed=5)
    return ResumableLoader(ds, plan, collate_translation, **kwargs)


def _key(batch) -> tuple:
    return tuple(tuple(t.flatten().tolist()) for t in (batch.src, batch.tgt_in))


def _take(loader: ResumableLoader, n: int) -> list:
    out = []
    while len(out) < n:
        for batch in loader:
            out.append(_key(batch))
            if len(out) == n:
                break
    return out


def test_epoch_sees_every_example_once(translation: TranslationDataset) -> None:
    loader = _loader(translation)
    n = len(loader)
    seen = sum(b.src.shape[0] for b in loader)
    assert seen == len(translation)
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["position"] == 0
    assert n > 3


@pytest.mark.parametrize("stop", [1, 7, "epoch_end", "epoch_end+3"])
def test_resume_continues_exactly(translation: TranslationDataset, stop) -> None:
    n = len(_loader(translation))
    stop = {"epoch_end": n, "epoch_end+3": n + 3}.get(stop, stop)
    total = 2 * n + 5
    uninterrupted = _take(_loader(translation), total)
    first = _loader(translation)
    head = _take(first, stop)
    state = json.loads(json.dumps(first.state_dict()))  # plain JSON, no pickle
    resumed = _loader(translation)
    resumed.load_state_dict(state)
    assert head + _take(resumed, total - stop) == uninterrupted


def test_workers_give_the_same_batches(translation: TranslationDataset) -> None:
    plain = _take(_loader(translation), 12)
    workers = _loader(translation, num_workers=2)
    assert _take(workers, 12) == plain
    # Resume with workers: the state counts consumed batches, not prefetched ones.
    state = workers.state_dict()
    resumed = _loader(translation, num_workers=2)
    resumed.load_state_dict(state)
    assert _take(resumed, 3) == _take(_loader(translation), 15)[12:]


def test_random_collate_is_reproducible_after_resume() -> None:
    tok = CharTokenizer.train(["abcdefghij"])
    ds = SentenceDataset.encode(["abcdefghij" * 3] * 64, tok)
    make = lambda: ResumableLoader(ds, FixedSizeBatchSampler(len(ds), 8, seed=2), MLMCollate(tok.vocab_size))  # noqa: E731
    full = [b.input.clone() for _, b in zip(range(10), _cycle(make()))]
    first = make()
    _ = [b for _, b in zip(range(4), _cycle(first))]
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    rest = [b.input.clone() for _, b in zip(range(6), _cycle(resumed))]
    assert all(torch.equal(a, b) for a, b in zip(full[4:], rest))
    assert not torch.equal(full[0], full[8])  # epoch 1 re-masks batch 0's sentences differently


def _cycle(loader: ResumableLoader):
    while True:
        yield from loader


def test_sharding_splits_each_epoch(translation: TranslationDataset) -> None:
    plan = TokenBudgetBatchSampler([translation.src_lengths, translation.tgt_lengths], 120, seed=5)
    shards = [ResumableLoader(translation, plan, collate_translation, rank=r, world_size=3) for r in range(3)]
    per_rank = [s.epoch_batches(0) for s in shards]
    assert len({len(b) for b in per_rank}) == 1
    flat = [i for batches in per_rank for b in batches for i in b]
    assert len(flat) == len(set(flat))
    assert len(per_rank[0]) == len(plan.batches(0)) // 3


def test_load_state_dict_rejects_a_different_setup(translation: TranslationDataset) -> None:
    state = _loader(translation).state_dict()
    other = ResumableLoader(
        translation, TokenBudgetBatchSampler([translation.src_lengths, translation.tgt_lengths], 120, seed=6),
        collate_translation,
    )
    with pytest.raises(ValueError, match="loader state has seed=5 but this loader has seed=6"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match=r"missing keys \['epoch'"):
        _loader(translation).load_state_dict({k: v for k, v in state.items() if k != "epoch"})
    with pytest.raises(ValueError, match="position must be an int >= 0, got -1"):
        _loader(translation).load_state_dict({**state, "position": -1})


def test_a_collate_that_draws_nothing_gets_no_generator(translation: TranslationDataset) -> None:
    given = []

    def collate(examples, rng):
        given.append(rng)
        return collate_translation(examples)

    plan = TokenBudgetBatchSampler([translation.src_lengths, translation.tgt_lengths], 120, seed=5)
    loader = ResumableLoader(translation, plan, collate, collate_rng=False)
    assert _take(loader, 5) == _take(_loader(translation), 5) and given == [None] * 5


class _Whole(torch.utils.data.Dataset):
    """Reads a batch whole (module level: a worker unpickles it)."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> int:
        raise AssertionError("read item by item")

    def __getitems__(self, indices: np.ndarray) -> list[int]:
        return (indices * 10).tolist()


class _ByItem(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> tuple[type, int]:
        return type(i), i


def _as_is(examples, rng):
    return examples


def test_fetch_reads_a_batch_whole_when_the_data_set_can() -> None:
    assert fetch(_Whole(), np.array([3, 1], dtype=np.int32)) == [30, 10]
    assert fetch(_ByItem(), np.array([3, 1], dtype=np.int32)) == [(int, 3), (int, 1)]  # Python ints, as the lists of old plans gave
    loader = ResumableLoader(_Whole(), FixedSizeBatchSampler(10, 4, shuffle=False), _as_is, num_workers=1)
    assert list(loader) == [[0, 10, 20, 30], [40, 50, 60, 70], [80, 90]]  # in a worker too
