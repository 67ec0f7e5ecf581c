"""The tokenizer protocol every tokenizer of the library meets, and the checks they share.

Ids ``0..6`` are always the special tokens of :mod:`aiayn.tokenization.special`; ``decode`` drops
all of them (pad, bos, eos, unk, cls, sep, mask).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from aiayn.tokenization.special import BOS_ID, EOS_ID, SPECIAL_TOKENS

__all__ = ["Tokenizer", "N_SPECIAL", "with_bos_eos", "check_ids", "check_text", "resolve_file", "same_vocabulary"]

N_SPECIAL = len(SPECIAL_TOKENS)


@runtime_checkable
class Tokenizer(Protocol):
    """What models, data sets and decoders need from a tokenizer."""

    @property
    def vocab_size(self) -> int:
        """Number of ids (largest id + 1), specials included."""
        ...

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]: ...

    def encode_batch(
        self, texts: Sequence[str], add_bos: bool = False, add_eos: bool = False
    ) -> list[list[int]]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def id_to_token(self, id: int) -> str | None: ...

    def token_to_id(self, token: str) -> int | None: ...

    def save(self, path: str | Path) -> Path: ...

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer: ...


def with_bos_eos(ids: list[int], add_bos: bool, add_eos: bool) -> list[int]:
    if add_bos:
        ids = [BOS_ID, *ids]
    if add_eos:
        ids = [*ids, EOS_ID]
    return ids


def same_vocabulary(a: Tokenizer | None, b: Tokenizer | None) -> bool:
    """Whether two tokenizers map the same ids to the same tokens (ensemble members, speculative draft models)."""
    def tokens(t: Tokenizer | None) -> list[str | None] | None:
        return None if t is None else [t.id_to_token(i) for i in range(t.vocab_size)]

    return tokens(a) == tokens(b)


def check_text(text: object, name: str = "text") -> str:
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str, got {type(text).__name__}")
    return text


def check_ids(ids: Iterable[int], vocab_size: int) -> list[int]:
    """Return ``ids`` as a list of ints, raising ``ValueError`` for an id outside ``[0, vocab_size)`` and
    ``TypeError`` for one that is not an integer (a float such as 2.5 or inf, a string)."""
    out = []
    for i in ids:
        try:
            out.append(operator.index(i))  # ints, numpy and 0-d torch integers; never a float truncated
        except TypeError:
            raise TypeError(f"token ids must be integers, got {i!r} ({type(i).__name__})") from None
    for i in out:
        if not 0 <= i < vocab_size:
            raise ValueError(f"token id {i} is out of range for a vocabulary of {vocab_size} ids (0..{vocab_size - 1})")
    return out


def resolve_file(path: str | Path, default_name: str) -> Path:
    """``path`` itself if it names a ``.json`` file, else ``path / default_name`` (a directory)."""
    path = Path(path)
    if path.suffix == ".json" and not path.is_dir():
        return path
    return path / default_name
