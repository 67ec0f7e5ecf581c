from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiayn.tokenization import (
    BOS_ID,
    EOS_ID,
    N_SPECIAL,
    PAD_ID,
    SPECIAL_TOKENS,
    UNK_ID,
    CharTokenizer,
    Tokenizer,
)


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_round_trip_on_its_own_text(text: str) -> None:
    if not text:
        return
    tok = CharTokenizer.train([text])
    ids = tok.encode(text)
    assert len(ids) == len(text)
    assert all(i >= N_SPECIAL for i in ids)
    assert tok.decode(ids) == text


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1), st.text())
def test_unknown_characters_become_unk_and_decode_drops_them(corpus: str, text: str) -> None:
    tok = CharTokenizer.train([corpus])
    ids = tok.encode(text)
    known = set(corpus)
    assert [i == UNK_ID for i in ids] == [c not in known for c in text]
    assert tok.decode(ids) == "".join(c for c in text if c in known)


def test_specials_have_fixed_ids_and_decode_drops_them() -> None:
    tok = CharTokenizer.train(["Grüße, Zürich!"])
    assert isinstance(tok, Tokenizer)
    for i, name in enumerate(SPECIAL_TOKENS):
        assert tok.id_to_token(i) == name
        assert tok.token_to_id(name) == i
    ids = tok.encode("Grüße", add_bos=True, add_eos=True)
    assert ids[0] == BOS_ID and ids[-1] == EOS_ID
    assert tok.decode([PAD_ID, *ids, PAD_ID, UNK_ID]) == "Grüße"


def test_literal_special_token_text_is_ordinary_characters() -> None:
    tok = CharTokenizer.train(["<pad> <mask>"])
    assert tok.decode(tok.encode("<mask> <pad>")) == "<mask> <pad>"


def test_vocab_size_keeps_most_frequent_characters() -> None:
    tok = CharTokenizer.train(["aaaabbbcc d"], vocab_size=N_SPECIAL + 2)
    assert tok.vocab_size == N_SPECIAL + 2
    assert tok.chars == ["a", "b"]
    assert tok.encode("abc") == [tok.token_to_id("a"), tok.token_to_id("b"), UNK_ID]


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="vocab_size must be > 7"):
        CharTokenizer.train(["abc"], vocab_size=7)
    with pytest.raises(ValueError, match="empty"):
        CharTokenizer.train(["", ""])
    with pytest.raises(TypeError, match=r"texts\[1\] must be a str"):
        CharTokenizer.train(["a", 3])  # type: ignore[list-item]
    tok = CharTokenizer.train(["abc"])
    with pytest.raises(ValueError, match="token id 10 is out of range for a vocabulary of 10"):
        tok.decode([7, 10])
    with pytest.raises(ValueError, match="unique"):
        CharTokenizer(["a", "a"])


def test_save_and_load(tmp_path) -> None:
    tok = CharTokenizer.train(["Ein Mann\u00a0läuft.\n\tZwei Frauen."])
    file = tok.save(tmp_path)
    assert file.name == "char_tokenizer.json"
    data = json.loads(file.read_text(encoding="utf-8"))
    assert data["special_tokens"] == {name: i for i, name in enumerate(SPECIAL_TOKENS)}
    for loaded in (CharTokenizer.load(tmp_path), CharTokenizer.load(file)):
        assert loaded.chars == tok.chars
        assert loaded.encode("Mann läuft") == tok.encode("Mann läuft")
    other = tok.save(tmp_path / "x" / "mine.json")
    assert CharTokenizer.load(other).chars == tok.chars


def test_load_rejects_changed_special_ids(tmp_path) -> None:
    tok = CharTokenizer.train(["abc"])
    data = tok.to_dict()
    data["special_tokens"] = {"<pad>": 1, "<bos>": 0}
    (tmp_path / "t.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="special_tokens must be"):
        CharTokenizer.load(tmp_path / "t.json")
