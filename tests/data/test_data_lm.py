from __future__ import annotations

import numpy as np
import pytest

from aiayn.data import (
    DataError,
    RandomWindowSampler,
    ResumableLoader,
    SequentialBlockSampler,
    TokenStream,
    collate_lm,
    split_text,
)
from aiayn.tokenization import CharTokenizer


def test_split_text_is_90_10_by_characters() -> None:
    text = "".join(chr(97 + i % 26) for i in range(1001))
    train, val = split_text(text)
    assert (len(train), len(val)) == (900, 101) and train + val == text
    with pytest.raises(ValueError, match=r"train_fraction must be in \(0, 1\), got 1.5"):
        split_text(text, 1.5)


def test_windows_are_shifted_by_one() -> None:
    stream = TokenStream(np.arange(100), block_size=8)
    assert len(stream) == 92
    x, y = stream[10]
    assert x.tolist() == list(range(10, 18)) and y.tolist() == list(range(11, 19))
    with pytest.raises(IndexError):
        stream[92]


def test_random_windows_deterministic_and_in_range() -> None:
    stream = TokenStream(np.arange(1000), block_size=16)
    sampler = RandomWindowSampler(stream, batch_size=4, seed=7)
    assert len(sampler.batches(0)) == 999 // 64
    assert sampler.batches(0) == RandomWindowSampler(stream, batch_size=4, seed=7).batches(0)
    assert sampler.batches(0) != sampler.batches(1)
    starts = np.array(sampler.batches(3).tolist())
    assert starts.min() >= 0 and starts.max() < stream.n_windows
    batch = collate_lm([stream[i] for i in sampler.batches(0)[0]])
    assert batch.input.shape == (4, 16) and (batch.target == batch.input + 1).all()


def test_sequential_blocks_cover_the_stream_in_order() -> None:
    stream = TokenStream(np.arange(50), block_size=8)  # blocks start at 0, 8, ..., 40 (needs 49 < 50)
    sampler = SequentialBlockSampler(stream, batch_size=4)
    assert sampler.batches(0).tolist() == [[0, 8, 16, 24], [32, 40]] and sampler.batches(0) == sampler.batches(5)
    loader = ResumableLoader(stream, sampler, collate_lm)
    inputs = np.concatenate([b.input.flatten().numpy() for b in loader])
    assert inputs.tolist() == list(range(48))


def test_too_short_and_empty() -> None:
    with pytest.raises(DataError, match=r"has 8 tokens, fewer than block_size \+ 1 = 9"):
        TokenStream(np.arange(8), block_size=8)
    tok = CharTokenizer.train(["abc"])
    with pytest.raises(DataError, match="the text is empty"):
        TokenStream.encode("", tok, 4)
    assert TokenStream.encode("abcabc", tok, 4).tokens.tolist() == tok.encode("abcabc")
