from __future__ import annotations

import logging

import pytest
import torch

from aiayn.data import DataError, ParallelText, TranslationDataset, collate_translation
from aiayn.tokenization import BOS_ID, EOS_ID, PAD_ID, CharTokenizer

PAIRS = ParallelText(["abc", "a", "abcdefgh", "", "abcd"], ["xy", "xyzxyz", "x", "z", "xyzxyzxyzxyz"])


@pytest.fixture(scope="module")
def tok() -> CharTokenizer:
    return CharTokenizer.train(PAIRS.src + PAIRS.tgt)


def test_encode_lengths_and_items(tok: CharTokenizer) -> None:
    ds = TranslationDataset.encode(PAIRS, tok, tok)
    assert len(ds) == 5 and ds.n_dropped == 0 and ds.n_truncated == 0
    assert ds.src_lengths.tolist() == [4, 2, 9, 1, 5]  # + EOS
    assert ds.tgt_lengths.tolist() == [3, 7, 2, 2, 13]  # + BOS (or EOS)
    src, tgt = ds[0]
    assert src.tolist() == tok.encode("abc", add_eos=True) and tgt.tolist() == tok.encode("xy")
    no_eos = TranslationDataset.encode(PAIRS, tok, tok, src_eos=False)
    assert no_eos.src_lengths.tolist() == [3, 1, 8, 0, 4]


def test_too_long_error_drop_truncate(tok: CharTokenizer, caplog) -> None:
    with pytest.raises(DataError, match=r"3 of 5 sentence pairs are longer than max_len=6 .* too_long='drop'"):
        TranslationDataset.encode(PAIRS, tok, tok, max_len=6)
    with caplog.at_level(logging.INFO, logger="aiayn.data.encoded"):
        dropped = TranslationDataset.encode(PAIRS, tok, tok, max_len=6, too_long="drop")
    assert "dropped 3 of 5 sentence pairs longer than max_len=6" in caplog.text
    assert len(dropped) == 2 and dropped.n_dropped == 3
    assert tok.decode(dropped[0][0]) == "abc" and tok.decode(dropped[1][0]) == ""
    cut = TranslationDataset.encode(PAIRS, tok, tok, max_len=6, too_long="truncate")
    assert len(cut) == 5 and cut.n_truncated == 3
    assert max(cut.src_lengths) <= 6 and max(cut.tgt_lengths) <= 6
    assert cut[2][0].tolist() == tok.encode("abcde", add_eos=True)
    assert cut[4][1].tolist() == tok.encode("xyzxy")


def test_empty_after_filtering_and_empty_input(tok: CharTokenizer) -> None:
    long = ParallelText(["abcd"] * 5, ["xyz"] * 5)
    with pytest.raises(DataError, match="all 5 sentence pairs are longer than max_len=3 tokens and were dropped"):
        TranslationDataset.encode(long, tok, tok, max_len=3, too_long="drop")
    with pytest.raises(DataError, match="no sentence pairs"):
        TranslationDataset.encode(ParallelText([], []), tok, tok)
    with pytest.raises(ValueError, match="too_long must be one of"):
        TranslationDataset.encode(PAIRS, tok, tok, max_len=6, too_long="cut")  # type: ignore[arg-type]


def test_collate_builds_shifted_targets_and_exact_masks(tok: CharTokenizer) -> None:
    ds = TranslationDataset.encode(PAIRS, tok, tok)
    batch = collate_translation([ds[i] for i in range(len(ds))])
    B = len(ds)
    assert batch.src.shape == (B, 9) and batch.tgt_in.shape == (B, 13) == batch.tgt_out.shape
    for b in range(B):
        src, y = ds[b]
        S, T = len(src), len(y) + 1
        assert batch.src[b, :S].tolist() == src.tolist()
        assert batch.tgt_in[b, :T].tolist() == [BOS_ID, *y.tolist()]
        assert batch.tgt_out[b, :T].tolist() == [*y.tolist(), EOS_ID]
        assert batch.src_mask[b].tolist() == [True] * S + [False] * (9 - S)
        assert batch.tgt_mask[b].tolist() == [True] * T + [False] * (13 - T)
    # The masks mark exactly the padding.
    assert torch.equal(batch.src == PAD_ID, ~batch.src_mask)
    assert torch.equal(batch.tgt_in == PAD_ID, ~batch.tgt_mask)
    assert torch.equal(batch.tgt_out == PAD_ID, ~batch.tgt_mask)
    assert batch.n_tgt_tokens == int(ds.tgt_lengths.sum()) and batch.n_src_tokens == int(ds.src_lengths.sum())
