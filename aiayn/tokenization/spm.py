"""Marian's tokenizers as they are: ``source.spm`` / ``target.spm`` (SentencePiece) and the shared ``vocab.json``.

As in ``transformers.MarianTokenizer``: SentencePiece cuts the text into pieces, ``vocab.json`` maps
each piece to the model's id (``<unk>`` for a piece it lacks); decoding maps ids back to pieces and
lets SentencePiece join them. The source side encodes, the target side decodes.

Saved inside a model directory as ``spm_tokenizer.json``: the SentencePiece model (base64), the
vocabulary and the special ids, one file.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from aiayn.tokenization.base import check_ids, check_text, resolve_file
from aiayn.tokenization.special import ROLES, SpecialIds, decoder_start_id
from aiayn.untrusted import MAX_TOKENIZER_BYTES, read_json_file

__all__ = ["SentencePieceTokenizer", "SPM_FORMAT", "SPM_FILE", "read_marian_tokenizers"]

SPM_FORMAT = "aiayn-sentencepiece"
SPM_FILE = "spm_tokenizer.json"


class SentencePieceTokenizer:
    """A SentencePiece model plus a piece -> id vocabulary, with the model's special ids."""

    def __init__(self, model_proto: bytes, vocab: Mapping[str, int], special_ids: SpecialIds, *, source: str = "spm") -> None:
        try:
            import sentencepiece
        except ImportError as e:  # an optional dependency: only Marian models need it
            raise ImportError("Marian tokenizers (source.spm) need sentencepiece: pip install sentencepiece") from e
        self._processor = sentencepiece.SentencePieceProcessor(model_proto=model_proto)
        self._proto, self._vocab, self._specials, self.source = model_proto, dict(vocab), special_ids, source
        self._pieces: dict[int, str] = {i: p for p, i in self._vocab.items()}
        self._size = max(self._pieces) + 1 if self._pieces else 0
        for role, value in special_ids.to_dict().items():
            if value is not None and value not in self._pieces:
                raise ValueError(f"{source}: the {role} token id {value} is not in the vocabulary")
        self._skip = set(special_ids.ids())

    @property
    def special_ids(self) -> SpecialIds:
        return self._specials

    @property
    def vocab_size(self) -> int:
        return self._size

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        unk = self._specials.need("unk", "a SentencePiece vocabulary")
        ids = [self._vocab.get(p, unk) for p in self._processor.encode(check_text(text), out_type=str)]
        if add_bos:
            ids = [self._specials.need("bos", "add_bos=True"), *ids]
        if add_eos:
            ids = [*ids, self._specials.need("eos", "add_eos=True")]
        return ids

    def encode_batch(self, texts: Sequence[str], add_bos: bool = False, add_eos: bool = False) -> list[list[int]]:
        return [self.encode(check_text(t, f"texts[{i}]"), add_bos, add_eos) for i, t in enumerate(texts)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` with every special token dropped; as MarianTokenizer, a word-start mark (``▁``) that
        SentencePiece leaves (a piece of the other side's model) is a space, and the ends are stripped."""
        pieces = [self._pieces[i] for i in check_ids(ids, self._size) if i not in self._skip and i in self._pieces]
        return self._processor.decode_pieces(pieces).replace("\u2581", " ").strip()

    def id_to_token(self, id: int) -> str | None:
        return self._pieces.get(id)

    def token_to_id(self, token: str) -> int | None:
        return self._vocab.get(token)

    def save(self, path: str | Path) -> Path:
        file = resolve_file(path, SPM_FILE)
        file.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "format": SPM_FORMAT, "special_ids": self._specials.to_dict(), "vocab": self._vocab,
            "model": base64.b64encode(self._proto).decode("ascii"),
        }
        file.write_text(json.dumps(data, ensure_ascii=False) + "\n", encoding="utf-8")
        return file

    @classmethod
    def load(cls, path: str | Path) -> SentencePieceTokenizer:
        file = resolve_file(path, SPM_FILE)
        return cls.from_dict(read_json_file(file, what="tokenizer file", max_bytes=MAX_TOKENIZER_BYTES), str(file))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str) -> SentencePieceTokenizer:
        if data.get("format") != SPM_FORMAT or not isinstance(data.get("vocab"), dict) or not isinstance(data.get("model"), str):
            raise ValueError(f"{source}: not an {SPM_FORMAT} file (needs 'format', 'vocab' and 'model')")
        specials = data.get("special_ids")
        if not isinstance(specials, dict) or set(specials) != set(ROLES):
            raise ValueError(f"{source}: special_ids must name exactly the roles {', '.join(ROLES)}, got {specials!r}")
        return cls(base64.b64decode(data["model"]), data["vocab"], SpecialIds(**specials), source=source)

    def __repr__(self) -> str:
        return f"SentencePieceTokenizer(vocab_size={self.vocab_size}, source={self.source!r})"


def read_marian_tokenizers(directory: str | Path) -> tuple[SentencePieceTokenizer, SentencePieceTokenizer]:
    """The (source, target) tokenizers of a Marian directory: ``source.spm``, ``target.spm``, ``vocab.json``.

    Special tokens come from ``tokenizer_config.json`` (defaults ``</s>``, ``<unk>``, ``<pad>``, as
    in MarianTokenizer); decoding starts from ``config.json``'s ``decoder_start_token_id`` (the pad
    token in every opus-mt model). Raises ``FileNotFoundError`` naming a missing file, ``ValueError``
    for a special token the vocabulary lacks.
    """
    directory = Path(directory)
    for name in ("source.spm", "target.spm", "vocab.json"):
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory} has no {name}: a Marian tokenizer needs source.spm, target.spm and vocab.json")
    vocab = read_json_file(directory / "vocab.json", what="vocab.json", max_bytes=MAX_TOKENIZER_BYTES, expect=dict)
    settings = _json(directory / "tokenizer_config.json")
    config = _json(directory / "config.json")
    ids: dict[str, int | None] = dict.fromkeys(ROLES)
    for role, default in (("eos", "</s>"), ("unk", "<unk>"), ("pad", "<pad>")):
        token = settings.get(f"{role}_token", default)
        token = token.get("content") if isinstance(token, dict) else token
        if token not in vocab:
            raise ValueError(f"{directory / 'vocab.json'}: the {role} token {token!r} is not in the vocabulary")
        ids[role] = int(vocab[token])
    ids["bos"] = decoder_start_id(config, ids["pad"])
    specials = SpecialIds(**ids)
    src = SentencePieceTokenizer((directory / "source.spm").read_bytes(), vocab, specials, source=str(directory / "source.spm"))
    tgt = SentencePieceTokenizer((directory / "target.spm").read_bytes(), vocab, specials, source=str(directory / "target.spm"))
    return src, tgt


def _json(file: Path) -> dict[str, Any]:
    if not file.is_file():
        return {}
    data = read_json_file(file, what=file.name)  # bounded: size, depth, a regular file
    return data if isinstance(data, dict) else {}
