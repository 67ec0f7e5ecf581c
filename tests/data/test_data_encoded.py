"""Encoded sequences: Ragged, a prepared corpus's ShardRows and pad_batch, against row-by-row references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aiayn.data import PairBatch, Ragged, collate_translation
from aiayn.data.encoded import pad_batch
from aiayn.data.prepared_pairs import ShardRows, _Lines
from aiayn.tokenization import PAD_ID

RNG = np.random.default_rng(0)


def rows(n: int, dtype=np.uint16, longest: int = 12) -> list[np.ndarray]:
    return [RNG.integers(3, 500, size=RNG.integers(0, longest + 1)).astype(dtype) for _ in range(n)]


def padded_row_by_row(seqs, prefix=None, suffix=None, multiple=1) -> tuple[torch.Tensor, torch.Tensor]:
    """Padding as it was: one row at a time, with an optional prefix (BOS) and suffix (EOS)."""
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


@pytest.mark.parametrize("multiple", [1, 8, 16])
def test_pad_batch_equals_padding_row_by_row(multiple) -> None:
    seqs = rows(37) + [np.zeros(0, dtype=np.uint16)]  # an empty row too
    expected = padded_row_by_row(seqs, multiple=multiple)
    for given in (seqs, Ragged.from_arrays(seqs), [s.tolist() for s in seqs]):  # arrays, one Ragged, lists
        ids, lengths = pad_batch(given, multiple=multiple)
        assert ids.dtype == lengths.dtype == torch.long
        assert torch.equal(ids, expected[0]) and torch.equal(lengths, expected[1])
    with pytest.raises(ValueError, match="cannot pad an empty batch"):
        pad_batch([])


@pytest.mark.parametrize("bos, eos, multiple", [(1, 2, 1), (1, 2, 8), (0, 5, 1)])
def test_collate_translation_equals_padding_row_by_row(bos, eos, multiple) -> None:
    """src padded; tgt_in = BOS + y and tgt_out = y + EOS, each padded row by row; masks True at the real positions."""
    src, tgt = rows(30), rows(29) + [np.zeros(0, dtype=np.uint16)]  # an empty target too
    want_src, src_len = padded_row_by_row(src, multiple=multiple)
    want_in, tgt_len = padded_row_by_row(tgt, prefix=bos, multiple=multiple)
    want_out, _ = padded_row_by_row(tgt, suffix=eos, multiple=multiple)
    for given in (list(zip(src, tgt)), PairBatch(Ragged.from_arrays(src), Ragged.from_arrays(tgt))):
        batch = collate_translation(given, bos_id=bos, eos_id=eos, pad_to_multiple=multiple)
        assert torch.equal(batch.src, want_src) and torch.equal(batch.tgt_in, want_in) and torch.equal(batch.tgt_out, want_out)
        assert torch.equal(batch.src_mask, torch.arange(want_src.shape[1]) < src_len[:, None])
        assert torch.equal(batch.tgt_mask, torch.arange(want_in.shape[1]) < tgt_len[:, None])


@pytest.mark.parametrize("extra, multiple", [(0, 1), (1, 1), (1, 8)])
def test_shard_rows_pad_straight_from_the_shards_as_ragged_pads_their_lines(extra, multiple) -> None:
    """Lines of a batch in two shards (batch order != shard order; an empty line; one read past its shard's
    last id while padded; some cut, some with an EOS appended): padded, as lengths and line by line, they are
    what Ragged gives for the same lines."""
    parts = [np.arange(100, 200, dtype=np.uint16), np.arange(500, 540, dtype=np.uint16)]
    lines = np.array([3, 1, 0, 2, 4])  # batch row r is lines[r] of the grouped rows below
    grouped = [(0, 3, 4), (0, 50, 0), (1, 0, 2), (1, 10, 5), (1, 39, 1)]  # (shard, start, length)
    order = lines.argsort()
    plan = _Lines(np.array([g[1] for g in grouped]), np.array([0, 2, 5]), order, order.argsort())
    most = np.array([3, 9, 9, 9, 9])  # batch row 0 (grouped row 3) cut to 3 ids
    side = ShardRows(parts, np.array([g[1] for g in grouped]), np.minimum(np.array([g[2] for g in grouped]), plan.grouped(most)), plan)
    side = side.append(2, np.array([True, False, True, False, False]))
    expected_lines = [parts[g[0]][g[1] : g[1] + g[2]] for g in grouped]
    expected_lines[3] = expected_lines[3][:3]
    expected = [expected_lines[g] for g in lines]
    expected = [np.append(e, 2) if ended else e for e, ended in zip(expected, [True, False, True, False, False])]
    reference = Ragged.from_arrays(expected)
    ids, real = side.padded(extra=extra, multiple=multiple)
    want_ids, want_real = reference.padded(extra=extra, multiple=multiple)
    assert ids.dtype == np.int64 and np.array_equal(ids, want_ids) and np.array_equal(real, want_real)
    assert side.lengths.tolist() == reference.lengths.tolist() == [4, 0, 5, 2, 1]
    assert [side[r].tolist() for r in range(len(side))] == [e.tolist() for e in expected]


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
