from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiayn.data import FixedSizeBatchSampler, TokenBudgetBatchSampler

lengths_st = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40)), min_size=1, max_size=200)


@settings(max_examples=100, deadline=None)
@given(lengths=lengths_st, extra=st.integers(0, 400), seed=st.integers(0, 2**31), epoch=st.integers(0, 5),
       shuffle=st.booleans(), max_sentences=st.one_of(st.none(), st.integers(1, 20)))
def test_token_budget_invariants(lengths, extra, seed, epoch, shuffle, max_sentences) -> None:
    src, tgt = np.array(lengths).T
    budget = max(src.max(), tgt.max()) + extra
    sampler = TokenBudgetBatchSampler([src, tgt], budget, seed=seed, shuffle=shuffle, max_sentences=max_sentences)
    batches = sampler.batches(epoch)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths)))  # each example exactly once
    for b in batches:
        assert b, "no empty batch"
        assert len(b) * src[b].max() <= budget and len(b) * tgt[b].max() <= budget  # padded size
        assert max_sentences is None or len(b) <= max_sentences
    again = TokenBudgetBatchSampler([src, tgt], budget, seed=seed, shuffle=shuffle, max_sentences=max_sentences)
    assert again.batches(epoch) == batches  # same seed and epoch, same batches


def test_batches_are_length_bucketed_and_epochs_differ() -> None:
    rng = np.random.default_rng(0)
    src = rng.integers(1, 60, size=2000)
    tgt = src + rng.integers(0, 5, size=2000)
    sampler = TokenBudgetBatchSampler([src, tgt], 600, seed=3)
    e0, e1 = sampler.batches(0), sampler.batches(1)
    assert e0 != e1
    assert TokenBudgetBatchSampler([src, tgt], 600, seed=4).batches(0) != e0
    # Bucketing: padding is a small share of the padded batch.
    real = sum(int(src[b].sum()) for b in e0)
    padded = sum(len(b) * int(src[b].max()) for b in e0)
    assert real / padded > 0.9
    # Torch batch-sampler protocol.
    sampler.set_epoch(1)
    assert list(sampler) == e1 and len(sampler) == len(e1)


def test_no_shuffle_is_sorted_and_fixed() -> None:
    sampler = TokenBudgetBatchSampler([[3, 1, 2, 1]], 4, shuffle=False)
    assert sampler.batches(0) == sampler.batches(7) == [[1, 3], [2], [0]]


def test_example_over_budget_and_bad_arguments() -> None:
    with pytest.raises(ValueError, match="example 1 takes 30 positions on side 1, more than max_tokens=20"):
        TokenBudgetBatchSampler([[5, 5], [5, 30]], 20)
    with pytest.raises(ValueError, match=r"lengths\[1\] must be 1-D with 2 entries"):
        TokenBudgetBatchSampler([[5, 5], [5]], 20)
    with pytest.raises(ValueError, match="lengths is empty"):
        TokenBudgetBatchSampler([[]], 20)
    with pytest.raises(ValueError, match="seed must be an int >= 0, got -1"):
        TokenBudgetBatchSampler([[5]], 20, seed=-1)
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        TokenBudgetBatchSampler([[5]], 20).batches(-1)


@pytest.mark.parametrize("drop_last", [False, True])
def test_fixed_size_sampler(drop_last: bool) -> None:
    sampler = FixedSizeBatchSampler(10, 4, seed=1, drop_last=drop_last)
    batches = sampler.batches(0)
    assert [len(b) for b in batches] == ([4, 4] if drop_last else [4, 4, 2])
    flat = [i for b in batches for i in b]
    assert len(set(flat)) == len(flat) and (drop_last or sorted(flat) == list(range(10)))
    assert sampler.batches(0) == FixedSizeBatchSampler(10, 4, seed=1, drop_last=drop_last).batches(0)
    assert sampler.batches(1) != batches
    assert FixedSizeBatchSampler(5, 2, shuffle=False).batches(3) == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        FixedSizeBatchSampler(5, 0)
