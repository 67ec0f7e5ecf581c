from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer

from aiayn.tokenization import BOS_ID, EOS_ID, MASK_ID, PAD_ID, SPECIAL_TOKENS, BPETokenizer, Tokenizer

CORPUS = [
    "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
    "Two young, White males are outside near many bushes.",
    "Ein Mann in grün hält eine Gitarre, während der andere Mann sein Hemd ansieht.",
    "A man in green holds a guitar while the other man observes his shirt.",
    "Ein kleines Mädchen klettert in ein Spielhaus aus Holz.\u00a0",
    "Über den Fluss: „Schön!“ – sagte sie. ",
] * 20


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    return BPETokenizer.train(CORPUS, vocab_size=400)


@settings(max_examples=150, deadline=None)
@given(text=st.text())
def test_round_trip_any_text(bpe: BPETokenizer, text: str) -> None:
    assert bpe.decode(bpe.encode(text)) == text


@settings(max_examples=50, deadline=None)
@given(texts=st.lists(st.text(), max_size=5))
def test_encode_batch_matches_encode(bpe: BPETokenizer, texts: list[str]) -> None:
    assert bpe.encode_batch(texts, add_eos=True) == [bpe.encode(t, add_eos=True) for t in texts]


def test_round_trip_keeps_spacing_umlauts_and_case(bpe: BPETokenizer) -> None:
    for line in [*CORPUS[:6], "  doppelte  Leerzeichen\tund Tab ", "\u00a0Ö\u00a0", "<pad><mask> literal"]:
        assert bpe.decode(bpe.encode(line)) == line


def test_specials_fixed_and_dropped(bpe: BPETokenizer) -> None:
    assert isinstance(bpe, Tokenizer)
    assert [bpe.id_to_token(i) for i in range(len(SPECIAL_TOKENS))] == list(SPECIAL_TOKENS)
    assert bpe.token_to_id("<mask>") == MASK_ID
    ids = bpe.encode("Ein Mann", add_bos=True, add_eos=True)
    assert ids[0] == BOS_ID and ids[-1] == EOS_ID
    assert all(i >= len(SPECIAL_TOKENS) for i in ids[1:-1])
    assert bpe.decode([PAD_ID, MASK_ID, *ids, PAD_ID]) == "Ein Mann"
    assert MASK_ID not in bpe.encode("<mask>")


def test_vocab_size(bpe: BPETokenizer) -> None:
    assert bpe.vocab_size <= 400
    assert max(max(bpe.encode(t)) for t in CORPUS) < bpe.vocab_size
    with pytest.raises(ValueError, match="vocab_size must be >= 263"):
        BPETokenizer.train(CORPUS, vocab_size=100)
    with pytest.raises(ValueError, match="out of range"):
        bpe.decode([bpe.vocab_size])


def test_save_writes_a_tokenizer_json_that_tokenizers_reads(bpe: BPETokenizer, tmp_path) -> None:
    file = bpe.save(tmp_path)
    assert file.name == "tokenizer.json"
    raw = HFTokenizer.from_file(str(file))
    text = CORPUS[2]
    assert raw.encode(text, add_special_tokens=False).ids == bpe.encode(text)
    loaded = BPETokenizer.load(tmp_path)
    assert loaded.encode(text) == bpe.encode(text)
    assert loaded.decode(loaded.encode("<pad> x")) == "<pad> x"
    added = json.loads(file.read_text())["added_tokens"]
    assert [(t["id"], t["content"]) for t in added] == list(enumerate(SPECIAL_TOKENS))


def test_lone_surrogate_is_a_clear_error(bpe: BPETokenizer) -> None:
    with pytest.raises(ValueError, match="lone surrogate '\\\\udcff' at character 2"):
        bpe.encode("ab\udcff")
    with pytest.raises(ValueError, match="text 1 has a lone surrogate"):
        bpe.encode_batch(["ok", "x\ud800"])


def test_rejects_tokenizer_with_other_special_ids() -> None:
    from tokenizers import models

    raw = HFTokenizer(models.BPE())
    raw.add_special_tokens(["<bos>", "<pad>"])
    with pytest.raises(ValueError, match="'<pad>' must have id 0, got 1"):
        BPETokenizer(raw)
