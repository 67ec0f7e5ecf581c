"""Special tokens and their fixed ids, shared by every tokenizer and model of the library.

The ids are part of the checkpoint format: a model's ``pad_id`` is ``PAD_ID`` unless its config says
otherwise, and every tokenizer puts these tokens first, in this order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PAD, BOS, EOS, UNK, CLS, SEP, MASK = "<pad>", "<bos>", "<eos>", "<unk>", "<cls>", "<sep>", "<mask>"

SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK, CLS, SEP, MASK)
PAD_ID, BOS_ID, EOS_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(len(SPECIAL_TOKENS))


@dataclass(frozen=True)
class SpecialIds:
    """The ids a tokenizer gives its special tokens (``None``: it has no such token).

    Our tokenizers use the fixed ids above; a pretrained one (BERT's ``[CLS]`` = 101, GPT-2's
    ``<|endoftext|>`` = 50256, Marian's ``</s>`` = 0) brings its own, read from its files.
    """

    pad: int | None = PAD_ID
    bos: int | None = BOS_ID
    eos: int | None = EOS_ID
    unk: int | None = UNK_ID
    cls: int | None = CLS_ID
    sep: int | None = SEP_ID
    mask: int | None = MASK_ID

    def ids(self) -> list[int]:
        """Every special id, sorted, once each."""
        return sorted({i for i in dataclasses.astuple(self) if i is not None})

    def need(self, role: str, why: str) -> int:
        """The id of ``role`` (``"mask"``, ``"cls"``, ...); ``ValueError`` saying ``why`` it is needed when there is none."""
        value = getattr(self, role)
        if value is None:
            raise ValueError(f"the tokenizer has no {role} token, but {why} needs one")
        return int(value)

    def to_dict(self) -> dict[str, int | None]:
        return dataclasses.asdict(self)


DEFAULT_SPECIAL_IDS = SpecialIds()
ROLES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(SpecialIds))


def special_ids(tokenizer: object) -> SpecialIds:
    """The special ids of ``tokenizer``: its own (``tokenizer.special_ids``) or the library's fixed ones."""
    specials = getattr(tokenizer, "special_ids", None)
    return specials if isinstance(specials, SpecialIds) else DEFAULT_SPECIAL_IDS


def sentence_ids(tokenizer: object) -> tuple[int, int, int]:
    """``(cls, sep, pad)`` of ``tokenizer``: an encoder-only input is ``[CLS] text [SEP]`` padded with pad.

    A tokenizer without ``[CLS]`` / ``[SEP]`` (RoBERTa names them ``<s>`` / ``</s>``) uses BOS / EOS;
    one without a pad token pads with 0 (the padding mask, not the id, hides it).
    """
    specials = special_ids(tokenizer)
    cls = specials.cls if specials.cls is not None else specials.bos
    sep = specials.sep if specials.sep is not None else specials.eos
    if cls is None or sep is None:
        source = getattr(tokenizer, "source", "the tokenizer")
        raise ValueError(f"{source}: has no [CLS]/[SEP] (nor BOS/EOS) token: an encoder-only input is [CLS] text [SEP]")
    return cls, sep, specials.pad if specials.pad is not None else 0


def decoder_start_id(hf_config: Mapping[str, object], default: int | None) -> int | None:
    """An imported encoder-decoder's first decoder input: ``config.json``'s ``decoder_start_token_id``
    (Marian and T5: the pad, BART: ``</s>``), else ``default``.

    The target tokenizer carries it as its ``bos`` id, the one every decoding path starts from.
    """
    start = hf_config.get("decoder_start_token_id")
    return start if isinstance(start, int) and not isinstance(start, bool) else default


def encode_sources(tokenizer: object, texts: Sequence[str]) -> list[list[int]]:
    """Encoder-decoder sources, in training and in decoding: a pretrained tokenizer's as Hugging Face
    encodes them (its template's special tokens: BART ``<s> x </s>``), else the text then EOS
    (fairseq and Marian both train so; no EOS when the tokenizer has none)."""
    own = getattr(tokenizer, "encode_with_template", None)
    if callable(own):
        return list(own(texts))
    return tokenizer.encode_batch(texts, add_eos=special_ids(tokenizer).eos is not None)  # type: ignore[attr-defined]
