"""Character-level tokenizer: one id per Unicode code point, exact round trip for known characters.

Saved as a small JSON file (``char_tokenizer.json``) holding the special tokens with their fixed ids
and the characters in id order. Characters not in the vocabulary encode to ``UNK_ID``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from aiayn.tokenization.base import N_SPECIAL, check_ids, check_text, resolve_file, with_bos_eos
from aiayn.tokenization.special import SPECIAL_TOKENS, UNK_ID
from aiayn.untrusted import MAX_TOKENIZER_BYTES, read_json_file

__all__ = ["CharTokenizer", "CHAR_FORMAT", "CHAR_FILE"]

CHAR_FORMAT = "aiayn-char"
CHAR_FILE = "char_tokenizer.json"
_VERSION = 1


class CharTokenizer:
    """Maps each character to an id; ids ``0..6`` are the special tokens, characters follow."""

    def __init__(self, chars: Sequence[str]) -> None:
        seen: set[str] = set()
        for c in chars:
            if not isinstance(c, str) or len(c) != 1:
                raise ValueError(f"chars must be single characters, got {c!r}")
            if c in seen:
                raise ValueError(f"chars must be unique, got {c!r} twice")
            seen.add(c)
        self._chars = list(chars)
        self._to_id = {c: i + N_SPECIAL for i, c in enumerate(self._chars)}

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int | None = None) -> CharTokenizer:
        """Vocabulary of the characters in ``texts``; with ``vocab_size`` (specials included) keep the
        most frequent ones, ties broken by code point."""
        if vocab_size is not None and vocab_size <= N_SPECIAL:
            raise ValueError(f"vocab_size must be > {N_SPECIAL} (the special tokens), got {vocab_size}")
        counts: Counter[str] = Counter()
        for i, text in enumerate(texts):
            counts.update(check_text(text, f"texts[{i}]"))
        if not counts:
            raise ValueError("texts has no characters: cannot train a character tokenizer on empty text")
        chars = sorted(counts, key=lambda c: (-counts[c], c))
        if vocab_size is not None:
            chars = chars[: vocab_size - N_SPECIAL]
        return cls(sorted(chars))

    @property
    def vocab_size(self) -> int:
        return N_SPECIAL + len(self._chars)

    @property
    def chars(self) -> list[str]:
        return list(self._chars)

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        to_id = self._to_id
        ids = [to_id.get(c, UNK_ID) for c in check_text(text)]
        return with_bos_eos(ids, add_bos, add_eos)

    def encode_batch(self, texts: Sequence[str], add_bos: bool = False, add_eos: bool = False) -> list[list[int]]:
        return [self.encode(t, add_bos, add_eos) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` with every special token dropped."""
        chars = self._chars
        return "".join(chars[i - N_SPECIAL] for i in check_ids(ids, self.vocab_size) if i >= N_SPECIAL)

    def id_to_token(self, id: int) -> str | None:
        if 0 <= id < N_SPECIAL:
            return SPECIAL_TOKENS[id]
        if N_SPECIAL <= id < self.vocab_size:
            return self._chars[id - N_SPECIAL]
        return None

    def token_to_id(self, token: str) -> int | None:
        if token in SPECIAL_TOKENS:
            return SPECIAL_TOKENS.index(token)
        return self._to_id.get(token)

    def to_dict(self) -> dict:
        return {
            "format": CHAR_FORMAT,
            "version": _VERSION,
            "special_tokens": {tok: i for i, tok in enumerate(SPECIAL_TOKENS)},
            "chars": self._chars,
        }

    @classmethod
    def from_dict(cls, data: dict, source: str = "<dict>") -> CharTokenizer:
        if data.get("format") != CHAR_FORMAT:
            raise ValueError(f"{source}: format must be {CHAR_FORMAT!r}, got {data.get('format')!r}")
        if data.get("version") != _VERSION:
            raise ValueError(f"{source}: version must be {_VERSION}, got {data.get('version')!r}")
        expected = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
        if data.get("special_tokens") != expected:
            raise ValueError(f"{source}: special_tokens must be {expected}, got {data.get('special_tokens')!r}")
        chars = data.get("chars")
        if not isinstance(chars, list):
            raise ValueError(f"{source}: 'chars' must be a list of single characters, got {chars!r:.80}")
        try:
            return cls(chars)
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None

    def save(self, path: str | Path) -> Path:
        """Write the JSON file to ``path`` (a ``.json`` file, or a directory: ``<dir>/char_tokenizer.json``)."""
        file = resolve_file(path, CHAR_FILE)
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(json.dumps(self.to_dict(), ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        return file

    @classmethod
    def load(cls, path: str | Path) -> CharTokenizer:
        file = resolve_file(path, CHAR_FILE)
        return cls.from_dict(read_json_file(file, what="tokenizer file", max_bytes=MAX_TOKENIZER_BYTES, expect=dict), str(file))

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"
