"""A pretrained model's own ``tokenizer.json`` (WordPiece, byte-level BPE, Unigram), used as it is.

Hugging Face ``tokenizers`` does the work; the special-token ids come from the files beside it
(``special_tokens_map.json``, ``tokenizer_config.json``, ``config.json``) and, for a role those do
not name, from the tokenizer's own special tokens by their usual spellings (``[CLS]``, ``<s>``,
``<|endoftext|>``). Nothing is re-numbered: the ids are the embedding rows the model was trained with.
For an encoder-decoder, ``bos`` is config.json's ``decoder_start_token_id`` (BART: ``</s>``), the first
decoder input, as Marian's target tokenizer has it; a source is encoded by the tokenizer's own template
(:meth:`PretrainedTokenizer.encode_with_template`: BART ``<s> x </s>``).

Saved inside a model directory as ``hf_tokenizer.json``: the original ``tokenizer.json`` object
verbatim beside the special ids, one file that needs nothing else to load.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from aiayn.tokenization.base import check_ids, check_text, resolve_file
from aiayn.tokenization.special import ROLES, SpecialIds, decoder_start_id
from aiayn.untrusted import MAX_TOKENIZER_BYTES, read_json_file

__all__ = ["PretrainedTokenizer", "PRETRAINED_FORMAT", "PRETRAINED_FILE", "find_special_ids"]

PRETRAINED_FORMAT = "aiayn-hf-tokenizer"
PRETRAINED_FILE = "hf_tokenizer.json"

# The usual spellings of each role among a tokenizer's special tokens (BERT, RoBERTa/BART/Marian, GPT-2, ours).
SPELLINGS: dict[str, tuple[str, ...]] = {
    "pad": ("[PAD]", "<pad>", "<|pad|>"),
    "bos": ("<s>", "<bos>", "<|endoftext|>", "<|begin_of_text|>"),
    "eos": ("</s>", "<eos>", "<|endoftext|>", "<|end_of_text|>"),
    "unk": ("[UNK]", "<unk>", "<|endoftext|>"),
    "cls": ("[CLS]", "<s>", "<cls>"),
    "sep": ("[SEP]", "</s>", "<sep>"),
    "mask": ("[MASK]", "<mask>"),
}
# config.json fields that name an id directly (``decoder_start_token_id`` is the first decoder input).
_CONFIG_IDS = {"pad": "pad_token_id", "bos": "bos_token_id", "eos": "eos_token_id"}


class PretrainedTokenizer:
    """A ``tokenizers.Tokenizer`` with the special ids of the model it came with.

    ``encode`` adds no special tokens by itself (the callers add ``[CLS] ... [SEP]`` or BOS/EOS with
    these ids; ``encode_with_template`` adds the tokenizer's own); ``decode`` drops every special token.
    """

    def __init__(self, backend: HFTokenizer, special_ids: SpecialIds, *, source: str = "tokenizer") -> None:
        size = backend.get_vocab_size(with_added_tokens=True)
        for role, value in special_ids.to_dict().items():
            if value is not None and not 0 <= value < size:
                raise ValueError(f"{source}: the {role} token id {value} is outside the vocabulary of {size} ids")
        # Padding and truncation are the callers' (batching pads with the pad id, data.max_len truncates).
        backend.no_padding()
        backend.no_truncation()
        self._backend, self._specials, self.source = backend, special_ids, source

    @classmethod
    def from_hf_dir(cls, directory: str | Path) -> PretrainedTokenizer:
        """Read ``directory/tokenizer.json`` and its special ids (see :func:`find_special_ids`).

        Raises ``FileNotFoundError`` without a tokenizer.json, ``ValueError`` naming the file for an
        unreadable one or special tokens that are missing or ambiguous.
        """
        directory = Path(directory)
        file = directory / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(f"{directory} has no tokenizer.json")
        try:
            backend = HFTokenizer.from_file(str(file))
        except Exception as e:  # noqa: BLE001 -- tokenizers raises its own exception types
            raise ValueError(f"{file} is not readable by tokenizers: {e}") from None
        maps = [_read_json(directory / name) for name in ("special_tokens_map.json", "tokenizer_config.json")]
        return cls(backend, find_special_ids(backend, maps, _read_json(directory / "config.json"), str(file)), source=str(file))

    @property
    def backend(self) -> HFTokenizer:
        return self._backend

    @property
    def special_ids(self) -> SpecialIds:
        return self._specials

    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        ids = self._backend.encode(check_text(text), add_special_tokens=False).ids
        return self._with_bos_eos(ids, add_bos, add_eos)

    def encode_batch(self, texts: Sequence[str], add_bos: bool = False, add_eos: bool = False) -> list[list[int]]:
        texts = [check_text(t, f"texts[{i}]") for i, t in enumerate(texts)]
        encodings = self._backend.encode_batch(texts, add_special_tokens=False)
        return [self._with_bos_eos(e.ids, add_bos, add_eos) for e in encodings]

    def encode_with_template(self, texts: Sequence[str]) -> list[list[int]]:
        """``texts`` as Hugging Face encodes them (``add_special_tokens=True``): with the special tokens of
        tokenizer.json's post-processor (BART ``<s> x </s>``, BERT ``[CLS] x [SEP]``; none without one)."""
        texts = [check_text(t, f"texts[{i}]") for i, t in enumerate(texts)]
        return [e.ids for e in self._backend.encode_batch(texts, add_special_tokens=True)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` with every special token dropped."""
        return self._backend.decode(check_ids(ids, self.vocab_size), skip_special_tokens=True)

    def id_to_token(self, id: int) -> str | None:
        return self._backend.id_to_token(id)

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def save(self, path: str | Path) -> Path:
        """Write ``hf_tokenizer.json`` (the tokenizer.json object and the special ids) to ``path`` (a file or a directory)."""
        file = resolve_file(path, PRETRAINED_FILE)
        file.parent.mkdir(parents=True, exist_ok=True)
        data = {"format": PRETRAINED_FORMAT, "special_ids": self._specials.to_dict(), "tokenizer": json.loads(self._backend.to_str())}
        file.write_text(json.dumps(data, ensure_ascii=False) + "\n", encoding="utf-8")
        return file

    @classmethod
    def load(cls, path: str | Path) -> PretrainedTokenizer:
        file = resolve_file(path, PRETRAINED_FILE)
        return cls.from_dict(read_json_file(file, what="tokenizer file", max_bytes=MAX_TOKENIZER_BYTES), str(file))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str) -> PretrainedTokenizer:
        if data.get("format") != PRETRAINED_FORMAT or not isinstance(data.get("tokenizer"), dict):
            raise ValueError(f"{source}: not an {PRETRAINED_FORMAT} file (needs 'format' and 'tokenizer')")
        specials = data.get("special_ids")
        if not isinstance(specials, dict) or set(specials) != set(ROLES):
            raise ValueError(f"{source}: special_ids must name exactly the roles {', '.join(ROLES)}, got {specials!r}")
        backend = HFTokenizer.from_str(json.dumps(data["tokenizer"]))
        return cls(backend, SpecialIds(**specials), source=source)

    def _with_bos_eos(self, ids: list[int], add_bos: bool, add_eos: bool) -> list[int]:
        if add_bos:
            ids = [self._specials.need("bos", "add_bos=True"), *ids]
        if add_eos:
            ids = [*ids, self._specials.need("eos", "add_eos=True")]
        return ids

    def __repr__(self) -> str:
        return f"PretrainedTokenizer(vocab_size={self.vocab_size}, source={self.source!r})"


def find_special_ids(
    backend: HFTokenizer, token_maps: Sequence[Mapping[str, Any]], config: Mapping[str, Any], source: str
) -> SpecialIds:
    """Each role's id: the token ``token_maps`` name for it (``pad_token``...), else config.json's
    ``<role>_token_id``, else the one special token of the tokenizer spelled as that role usually is;
    ``bos`` is the decoder start (:func:`~aiayn.tokenization.special.decoder_start_id`) when config.json names one.

    Raises ``ValueError`` naming ``source`` for a named token the vocabulary lacks, a role two
    special tokens could fill, or a tokenizer with no special token at all.
    """
    specials = {t.content for t in backend.get_added_tokens_decoder().values() if t.special}
    found: dict[str, int | None] = {}
    for role in ROLES:
        found[role] = _named(backend, token_maps, role, source)
        if found[role] is None and isinstance(config.get(_CONFIG_IDS.get(role, "")), int):
            found[role] = int(config[_CONFIG_IDS[role]])
        if found[role] is None:
            candidates = [t for t in SPELLINGS[role] if t in specials]
            if len(candidates) > 1:
                raise ValueError(
                    f"{source}: the {role} token is ambiguous: the tokenizer has {' and '.join(candidates)}; "
                    f"name it in special_tokens_map.json (\"{role}_token\": ...)"
                )
            found[role] = backend.token_to_id(candidates[0]) if candidates else None
    found["bos"] = decoder_start_id(config, found["bos"])
    if all(v is None for v in found.values()):
        raise ValueError(
            f"{source}: no special tokens found (none of {', '.join(sorted({t for s in SPELLINGS.values() for t in s}))} "
            "and no special_tokens_map.json / tokenizer_config.json naming them): the model's pad, bos, eos, cls, sep "
            "and mask ids are unknown"
        )
    return SpecialIds(**found)


def _named(backend: HFTokenizer, token_maps: Sequence[Mapping[str, Any]], role: str, source: str) -> int | None:
    for tokens in token_maps:
        value = tokens.get(f"{role}_token")
        if isinstance(value, dict):  # {"content": "[PAD]", "lstrip": false, ...}
            value = value.get("content")
        if isinstance(value, str):
            got = backend.token_to_id(value)
            if got is None:
                raise ValueError(f"{source}: the {role} token {value!r} named beside it is not in its vocabulary")
            return got
    return None


def _read_json(file: Path) -> dict[str, Any]:
    if not file.is_file():
        return {}
    data = read_json_file(file, what=file.name, max_bytes=MAX_TOKENIZER_BYTES)  # bounded: size, depth, a regular file
    return data if isinstance(data, dict) else {}
