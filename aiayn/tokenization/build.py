"""Train a tokenizer by kind, and a source/target pair that is shared (the paper's choice) or separate."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from aiayn.tokenization.base import Tokenizer
from aiayn.tokenization.bpe import BPETokenizer
from aiayn.tokenization.char import CharTokenizer

__all__ = ["TOKENIZER_KINDS", "train_tokenizer", "train_tokenizer_pair"]

TOKENIZER_KINDS = ("bpe", "char")


def train_tokenizer(kind: Literal["bpe", "char"], texts: Sequence[str], vocab_size: int | None) -> Tokenizer:
    """``kind="bpe"``: byte-level BPE with ``vocab_size`` ids; ``"char"``: characters, ``vocab_size`` caps
    the vocabulary (``None``: every character seen)."""
    if kind == "bpe":
        if vocab_size is None:
            raise ValueError("vocab_size is required for kind='bpe', got None")
        return BPETokenizer.train(texts, vocab_size, length=len(texts))
    if kind == "char":
        return CharTokenizer.train(texts, vocab_size)
    raise ValueError(f"kind must be one of {TOKENIZER_KINDS}, got {kind!r}")


def train_tokenizer_pair(
    kind: Literal["bpe", "char"],
    src_texts: Sequence[str],
    tgt_texts: Sequence[str],
    vocab_size: int | None,
    *,
    shared: bool = True,
) -> tuple[Tokenizer, Tokenizer]:
    """Source and target tokenizers; ``shared=True`` trains one on both sides and returns it twice
    (section 5.1 of the paper: a shared source-target vocabulary of about 37000 tokens)."""
    if shared:
        tok = train_tokenizer(kind, [*src_texts, *tgt_texts], vocab_size)
        return tok, tok
    return train_tokenizer(kind, src_texts, vocab_size), train_tokenizer(kind, tgt_texts, vocab_size)
