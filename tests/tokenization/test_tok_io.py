from __future__ import annotations

import pytest

from aiayn.tokenization import (
    BPETokenizer,
    CharTokenizer,
    check_tokenizer_fits,
    load_tokenizer,
    load_tokenizer_pair,
    save_tokenizer_pair,
    train_tokenizer,
    train_tokenizer_pair,
)

SRC = ["Ein Hund läuft über die Wiese.", "Zwei Kinder spielen."] * 10
TGT = ["A dog runs across the meadow.", "Two children play."] * 10


@pytest.mark.parametrize("kind", ["bpe", "char"])
def test_load_tokenizer_dispatches_by_content(kind: str, tmp_path) -> None:
    tok = train_tokenizer(kind, SRC, 300)  # type: ignore[arg-type]
    file = tok.save(tmp_path / "any_name.json")
    tok.save(tmp_path / "ckpt")
    for path in (file, tmp_path / "ckpt"):
        loaded = load_tokenizer(path)
        assert type(loaded) is type(tok)
        assert loaded.encode(SRC[0]) == tok.encode(SRC[0])


def test_load_tokenizer_errors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="found neither"):
        load_tokenizer(tmp_path)
    (tmp_path / "x.json").write_text('{"hello": 1}')
    with pytest.raises(ValueError, match="not a tokenizer file"):
        load_tokenizer(tmp_path / "x.json")
    (tmp_path / "y.json").write_text("not json")
    with pytest.raises(ValueError, match="invalid JSON"):
        load_tokenizer(tmp_path / "y.json")
    CharTokenizer.train(SRC).save(tmp_path)
    BPETokenizer.train(SRC, 300).save(tmp_path)
    with pytest.raises(FileNotFoundError, match="found both"):
        load_tokenizer(tmp_path)


@pytest.mark.parametrize("shared", [True, False])
def test_pairs_shared_or_separate(shared: bool, tmp_path) -> None:
    src, tgt = train_tokenizer_pair("bpe", SRC, TGT, 300, shared=shared)
    assert (src is tgt) == shared
    files = save_tokenizer_pair(tmp_path, src, tgt)
    assert [f.name for f in files] == (["tokenizer.json"] if shared else ["src_tokenizer.json", "tgt_tokenizer.json"])
    src2, tgt2 = load_tokenizer_pair(tmp_path)
    assert (src2 is tgt2) == shared
    assert src2.encode(SRC[0]) == src.encode(SRC[0]) and tgt2.encode(TGT[0]) == tgt.encode(TGT[0])


def test_train_tokenizer_bad_kind() -> None:
    with pytest.raises(ValueError, match="kind must be one of"):
        train_tokenizer("wordpiece", SRC, 300)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="vocab_size is required"):
        train_tokenizer("bpe", SRC, None)


def test_check_tokenizer_fits() -> None:
    tok = CharTokenizer.train(["abc"])  # 10 ids
    check_tokenizer_fits(tok, 10)
    check_tokenizer_fits(tok, 512)
    with pytest.raises(ValueError, match=r"10 ids \(0..9\) but the model's src_vocab_size is 9"):
        check_tokenizer_fits(tok, 9, name="src_vocab_size")
    with pytest.raises(TypeError, match="vocab_size must be an int"):
        check_tokenizer_fits(tok, 9.0)  # type: ignore[arg-type]
