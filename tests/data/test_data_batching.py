from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiayn.data import Batches, FixedSizeBatchSampler, TokenBudgetBatchSampler

lengths_st = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40)), min_size=1, max_size=200)


@settings(max_examples=100, deadline=None)
@given(lengths=lengths_st, extra=st.integers(0, 400), seed=st.integers(0, 2**31), epoch=st.integers(0, 5),
       shuffle=st.booleans(), max_sentences=st.one_of(st.none(), st.integers(1, 20)))
def test_token_budget_invariants(lengths, extra, seed, epoch, shuffle, max_sentences) -> None:
    src, tgt = np.array(lengths).T
    budget = max(src.max(), tgt.max()) + extra
    sampler = TokenBudgetBatchSampler([src, tgt], budget, seed=seed, shuffle=shuffle, max_sentences=max_sentences)
    batches = sampler.batches(epoch)
    flat = [i for b in batches.tolist() for i in b]
    assert sorted(flat) == list(range(len(lengths)))  # each example exactly once
    for b in batches:
        assert len(b), "no empty batch"
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
    assert e0 != e1 and e0.tolist() != e1.tolist()
    assert TokenBudgetBatchSampler([src, tgt], 600, seed=4).batches(0) != e0
    # Bucketing: padding is a small share of the padded batch.
    real = sum(int(src[b].sum()) for b in e0)
    padded = sum(len(b) * int(src[b].max()) for b in e0)
    assert real / padded > 0.9
    # Torch batch-sampler protocol.
    sampler.set_epoch(1)
    assert [b.tolist() for b in sampler] == e1.tolist() and len(sampler) == len(e1)


def test_no_shuffle_is_sorted_and_fixed() -> None:
    sampler = TokenBudgetBatchSampler([[3, 1, 2, 1]], 4, shuffle=False)
    assert sampler.batches(0) == sampler.batches(7) and sampler.batches(7).tolist() == [[1, 3], [2], [0]]


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
    flat = [i for b in batches.tolist() for i in b]
    assert len(set(flat)) == len(flat) and (drop_last or sorted(flat) == list(range(10)))
    assert sampler.batches(0) == FixedSizeBatchSampler(10, 4, seed=1, drop_last=drop_last).batches(0)
    assert sampler.batches(1) != batches
    assert FixedSizeBatchSampler(5, 2, shuffle=False).batches(3).tolist() == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        FixedSizeBatchSampler(5, 0)


def test_plans_are_the_batches_the_list_based_plans_gave() -> None:
    """Fixed examples, their batches written down from the plans of lists of Python ints that Batches replaced:
    the same indices in the same order for the same seed and epoch."""
    src = [5, 3, 9, 2, 7, 7, 4, 1, 8, 6, 3, 5]
    tgt = [4, 6, 8, 3, 7, 5, 5, 2, 9, 6, 2, 4]
    sampler = TokenBudgetBatchSampler([src, tgt], 20, seed=3)
    assert sampler.batches(0).tolist() == [[7, 3, 10], [8, 2], [5, 4], [0, 9], [1, 6, 11]]
    assert sampler.batches(1).tolist() == [[11, 9], [1, 6, 0], [8, 2], [7, 3, 10], [5, 4]]
    padded = TokenBudgetBatchSampler([src, tgt], 20, seed=3, pad_to_multiple=4, max_sentences=3)
    assert padded.batches(2).tolist() == [[2], [0, 11], [1, 6], [9, 5], [8], [7, 3, 10], [4]]
    # Compact lengths (uint16) are used as they are, not copied, and give the same batches.
    compact = [np.array(src, dtype=np.uint16), np.array(tgt, dtype=np.uint16)]
    sampler = TokenBudgetBatchSampler(compact, 20, seed=3)
    assert sampler.lengths[0] is compact[0] and sampler.batches(1).tolist() == [[11, 9], [1, 6, 0], [8, 2], [7, 3, 10], [5, 4]]
    assert FixedSizeBatchSampler(10, 4, seed=1).batches(0).tolist() == [[8, 4, 7, 0], [1, 2, 5, 9], [6, 3]]


def test_batches_are_one_compact_array_and_slices_share_it() -> None:
    batches = TokenBudgetBatchSampler([np.arange(1, 1001) % 50 + 1], 100, seed=0).batches(0)
    assert batches.order.dtype == np.int32 and len(batches.order) == 1000
    every_third = batches[1::3]
    assert every_third.order is batches.order
    assert every_third.tolist() == batches.tolist()[1::3] and len(every_third) == len(batches.tolist()[1::3])
    assert batches[-1].tolist() == batches.tolist()[-1] and batches[2:] != batches
    assert Batches.split(np.arange(5), 2).tolist() == [[0, 1], [2, 3], [4]]
    assert Batches.split(np.arange(5), 2, stop=4) == Batches.split(np.arange(4), 2)
    with pytest.raises(ValueError, match="order must be 1-D"):
        Batches(np.zeros((2, 2)), np.zeros(1), np.zeros(1))
