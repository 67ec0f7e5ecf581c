"""Subword BPE on Hugging Face ``tokenizers``: byte-level, so ``decode(encode(s)) == s`` for any string.

Byte-level pre-tokenization (GPT-2 style, no added prefix space) keeps every byte, so no-break
spaces, tabs, trailing whitespace, umlauts and capitals all survive and nothing maps to ``<unk>``.
Saved in the ``tokenizer.json`` format that ``tokenizers.Tokenizer.from_file`` reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from aiayn.tokenization.base import N_SPECIAL, check_ids, check_text, resolve_file, with_bos_eos
from aiayn.tokenization.special import SPECIAL_TOKENS

__all__ = ["BPETokenizer", "BPE_FILE", "MIN_BPE_VOCAB"]

BPE_FILE = "tokenizer.json"
MIN_BPE_VOCAB = N_SPECIAL + 256  # the specials and the 256 byte symbols


class BPETokenizer:
    """Wraps a ``tokenizers.Tokenizer`` whose special tokens sit at the library's fixed ids."""

    def __init__(self, backend: HFTokenizer) -> None:
        for i, tok in enumerate(SPECIAL_TOKENS):
            got = backend.token_to_id(tok)
            if got != i:
                raise ValueError(f"special token {tok!r} must have id {i}, got {got}")
        # Literal "<pad>" etc. in user text is ordinary text, so every string round-trips.
        backend.encode_special_tokens = True
        self._backend = backend

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        vocab_size: int = 8000,
        *,
        min_frequency: int = 2,
        length: int | None = None,
    ) -> BPETokenizer:
        """Train a byte-level BPE with ``vocab_size`` ids (specials included) on ``texts``.

        ``length`` (number of texts) only drives progress accounting. The result may have fewer
        than ``vocab_size`` ids when the corpus runs out of merges.
        """
        if vocab_size < MIN_BPE_VOCAB:
            raise ValueError(
                f"vocab_size must be >= {MIN_BPE_VOCAB} (7 specials + 256 bytes) for byte-level BPE, got {vocab_size}"
            )
        if min_frequency < 1:
            raise ValueError(f"min_frequency must be >= 1, got {min_frequency}")
        backend = HFTokenizer(models.BPE())
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        backend.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(SPECIAL_TOKENS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        backend.train_from_iterator(_checked(texts), trainer=trainer, length=length)
        return cls(backend)

    @property
    def backend(self) -> HFTokenizer:
        return self._backend

    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        try:
            ids = self._backend.encode(check_text(text), add_special_tokens=False).ids
        except TypeError:
            _raise_if_not_utf8([text])
            raise
        return with_bos_eos(ids, add_bos, add_eos)

    def encode_batch(self, texts: Sequence[str], add_bos: bool = False, add_eos: bool = False) -> list[list[int]]:
        texts = [check_text(t, f"texts[{i}]") for i, t in enumerate(texts)]
        try:
            encodings = self._backend.encode_batch(texts, add_special_tokens=False)
        except TypeError:
            _raise_if_not_utf8(texts)
            raise
        return [with_bos_eos(e.ids, add_bos, add_eos) for e in encodings]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` with every special token dropped."""
        return self._backend.decode(check_ids(ids, self.vocab_size), skip_special_tokens=True)

    def id_to_token(self, id: int) -> str | None:
        return self._backend.id_to_token(id)

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def save(self, path: str | Path) -> Path:
        """Write ``tokenizer.json`` to ``path`` (a ``.json`` file, or a directory: ``<dir>/tokenizer.json``)."""
        file = resolve_file(path, BPE_FILE)
        file.parent.mkdir(parents=True, exist_ok=True)
        self._backend.save(str(file))
        return file

    @classmethod
    def load(cls, path: str | Path) -> BPETokenizer:
        file = resolve_file(path, BPE_FILE)
        return cls(HFTokenizer.from_file(str(file)))

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size})"


def _raise_if_not_utf8(texts: Sequence[str]) -> None:
    # `tokenizers` rejects lone surrogates (from e.g. errors="surrogateescape") with an opaque TypeError.
    for i, text in enumerate(texts):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(
                f"text {i} has a lone surrogate {text[e.start]!r} at character {e.start}: not encodable as UTF-8"
            ) from None


def _checked(texts: Iterable[str]) -> Iterable[str]:
    for i, text in enumerate(texts):
        yield check_text(text, f"texts[{i}]")
