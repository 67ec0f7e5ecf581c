"""The shared Multi30k BPE: trained in time, and exact on every line of every split."""

from __future__ import annotations

import time

import pytest

from aiayn.data import load_multi30k
from aiayn.tokenization import UNK_ID, BPETokenizer

pytestmark = pytest.mark.data


@pytest.fixture(scope="module")
def multi30k(shared_data):
    return {split: load_multi30k(split, data_dir=shared_data, download=False) for split in ("train", "val", "test2016")}


@pytest.fixture(scope="module")
def shared_bpe(multi30k) -> tuple[BPETokenizer, float]:
    train = multi30k["train"]
    start = time.perf_counter()
    tok = BPETokenizer.train([*train.src, *train.tgt], vocab_size=8000, length=2 * len(train))
    return tok, time.perf_counter() - start


def test_training_a_shared_8k_bpe_takes_under_30_seconds(shared_bpe) -> None:
    tok, seconds = shared_bpe
    assert tok.vocab_size == 8000
    assert seconds < 30, f"training took {seconds:.1f} s"


def test_round_trip_on_every_line(multi30k, shared_bpe) -> None:
    tok, _ = shared_bpe
    for split, pairs in multi30k.items():
        for side, lines in (("de", pairs.src), ("en", pairs.tgt)):
            ids = tok.encode_batch(lines)
            assert not any(UNK_ID in row for row in ids)  # byte-level: nothing maps to unk
            decoded = [tok.decode(row) for row in ids]
            bad = [(n + 1, line) for n, (line, back) in enumerate(zip(lines, decoded)) if line != back]
            assert not bad, f"{split}.{side}: {len(bad)} lines differ, first {bad[0]!r}"
    nbsp = [line for line in multi30k["train"].src if "\u00a0" in line or line != line.rstrip()]
    assert nbsp and all(tok.decode(tok.encode(line)) == line for line in nbsp)
