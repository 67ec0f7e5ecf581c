"""Fuzzing the tokenizers' encode and decode: any Unicode (empty strings, lone surrogates, controls).

Documented errors: ``ValueError`` (text that is not UTF-8 encodable, an id out of range) and
``TypeError`` (not a string, not ints). Anything else is a failure. What encodes must decode back.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiayn.tokenization import BPETokenizer, CharTokenizer

pytestmark = pytest.mark.reliability

CORPUS = ["hello world", "Grüße, 世界! <pad> </s>", "tab\there\nnew line", "emoji 🙂 and é"]
CHAR = CharTokenizer.train(CORPUS)
BPE = BPETokenizer.train(CORPUS * 5, vocab_size=300, min_frequency=1)
ERRORS = (ValueError, TypeError)
any_text = st.text(alphabet=st.characters(codec=None, categories=None), max_size=40)  # surrogates included


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


@settings(max_examples=300, deadline=None)
@given(text=any_text, bos=st.booleans(), eos=st.booleans())
def test_bpe_encode_decode_any_text(text, bos, eos):
    try:
        ids = BPE.encode(text, add_bos=bos, add_eos=eos)
    except ERRORS:
        assert not _encodable(text)  # only a lone surrogate may be refused
        return
    assert BPE.decode(ids) == text  # byte-level BPE: every encodable string round-trips


@settings(max_examples=300, deadline=None)
@given(text=any_text)
def test_char_encode_decode_any_text(text):
    try:
        ids = CHAR.encode(text)
    except ERRORS:
        assert not _encodable(text)
        return
    known = "".join(c for c in text if CHAR.token_to_id(c) is not None)
    assert CHAR.decode(ids) == known  # unknown characters become <unk>, which decode drops
    assert len(ids) == len(text)


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.one_of(st.integers(-5, 400), st.floats(allow_nan=True), st.text(max_size=2), st.none()), max_size=8))
def test_decode_any_ids(ids):
    for tokenizer in (CHAR, BPE):
        try:
            out = tokenizer.decode(ids)
        except ERRORS:
            continue
        assert isinstance(out, str)


@settings(max_examples=100, deadline=None)
@given(texts=st.lists(any_text, max_size=4))
def test_bpe_encode_batch_matches_encode(texts):
    try:
        batch = BPE.encode_batch(texts)
    except ERRORS:
        assert not all(_encodable(t) for t in texts)
        return
    assert batch == [BPE.encode(t) for t in texts]
