"""Encoded sequences: Ragged's batch operations and pad_batch, against row-by-row references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aiayn.data import PairBatch, Ragged, collate_translation
from aiayn.data.encoded import pad_batch, take_grouped
from aiayn.tokenization import PAD_ID

RNG = np.random.default_rng(0)


def rows(n: int, dtype=np.uint16, longest: int = 12) -> list[np.ndarray]:
    return [RNG.integers(3, 500, size=RNG.integers(0, longest + 1)).astype(dtype) for _ in range(n)]


def padded_row_by_row(seqs, prefix=None, suffix=None, multiple=1) -> tuple[torch.Tensor, torch.Tensor]:
    """pad_batch as it was: one row at a time."""
    start = 0 if prefix is None else 1
    lengths = np.array([len(s) + start + (suffix is not None) for s in seqs], dtype=np.int64)
    out = np.full((len(seqs), -(-int(lengths.max()) // multiple) * multiple), PAD_ID, dtype=np.int64)
    for b, s in enumerate(seqs):
        if prefix is not None:
            out[b, 0] = prefix
        out[b, start : start + len(s)] = s
        if suffix is not None:
            out[b, start + len(s)] = suffix
    return torch.from_numpy(out), torch.from_numpy(lengths)


@pytest.mark.parametrize("prefix, suffix, multiple", [(None, None, 1), (1, None, 1), (None, 2, 1), (1, 2, 8), (None, None, 16)])
def test_pad_batch_equals_padding_row_by_row(prefix, suffix, multiple) -> None:
    seqs = rows(37) + [np.zeros(0, dtype=np.uint16)]  # an empty row too
    expected = padded_row_by_row(seqs, prefix, suffix, multiple)
    for given in (seqs, Ragged.from_arrays(seqs), [s.tolist() for s in seqs]):  # arrays, one Ragged, lists
        ids, lengths = pad_batch(given, prefix=prefix, suffix=suffix, multiple=multiple)
        assert ids.dtype == lengths.dtype == torch.long
        assert torch.equal(ids, expected[0]) and torch.equal(lengths, expected[1])
    with pytest.raises(ValueError, match="cannot pad an empty batch"):
        pad_batch([])


def test_ragged_gather_take_and_append() -> None:
    parts = [np.arange(100, 200, dtype=np.uint16), np.arange(500, 540, dtype=np.uint16)]
    starts, lengths = np.array([3, 50, 0, 10, 39]), np.array([4, 0, 2, 5, 1])
    one = Ragged.gather(parts[:1], starts[:2], lengths[:2])
    assert [r.tolist() for r in one] == [[103, 104, 105, 106], []] and one.values.dtype == np.uint16
    grouped = Ragged.gather(parts, starts, lengths, bounds=np.array([0, 2, 5]))  # rows 0-1 from part 0, 2-4 from part 1
    assert [r.tolist() for r in grouped] == [[103, 104, 105, 106], [], [500, 501], [510, 511, 512, 513, 514], [539]]
    assert [r.tolist() for r in grouped.take(np.array([4, 0, 2]))] == [[539], [103, 104, 105, 106], [500, 501]]
    ended = grouped.append(2, np.array([True, True, False, False, True]))
    assert [r.tolist() for r in ended] == [[103, 104, 105, 106, 2], [2], [500, 501], [510, 511, 512, 513, 514], [539, 2]]
    assert ended.lengths.tolist() == [5, 1, 2, 5, 2]


def test_take_grouped_reads_each_part_in_one_slice() -> None:
    index = [np.arange(20).reshape(10, 2), 100 + np.arange(20).reshape(10, 2)]
    got = take_grouped(index, np.array([9, 0, 3, 3]), np.array([0, 1, 4]))
    assert got.tolist() == [[18, 19], [100, 101], [106, 107], [106, 107]]
    assert take_grouped(index[:1], np.array([2, 1]), None).tolist() == [[4, 5], [2, 3]]
    with pytest.raises(ValueError, match=r"bounds must have len\(parts\) \+ 1 = 3 entries, got 2"):
        take_grouped(index, np.array([1]), np.array([0, 1]))


def test_collate_takes_a_pair_batch_or_a_list_of_pairs_alike() -> None:
    src, tgt = rows(20), rows(20)
    as_list = collate_translation(list(zip(src, tgt)), pad_to_multiple=4)
    pairs = PairBatch(Ragged.from_arrays(src), Ragged.from_arrays(tgt))
    assert len(pairs) == 20 and [p[1].tolist() for p in pairs] == [t.tolist() for t in tgt]
    assert pairs[-1][0].tolist() == src[-1].tolist()
    as_batch = collate_translation(pairs, pad_to_multiple=4)
    for name in ("src", "tgt_in", "tgt_out", "src_mask", "tgt_mask"):
        assert torch.equal(getattr(as_list, name), getattr(as_batch, name)), name
    with pytest.raises(IndexError, match="pair 20 out of range for a batch of 20"):
        pairs[20]
