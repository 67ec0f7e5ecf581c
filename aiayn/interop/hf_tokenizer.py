"""The tokenizer(s) of a Hugging Face model directory, as they are.

``tokenizer.json`` in aiayn's own layout (``<pad> <bos> <eos> <unk> <cls> <sep> <mask>`` at ids 0..6,
what aiayn exports) comes back as our :class:`~aiayn.tokenization.BPETokenizer`; any other
``tokenizer.json`` (WordPiece, byte-level BPE, Unigram) as a
:class:`~aiayn.tokenization.pretrained.PretrainedTokenizer` with the model's own special ids;
Marian's ``source.spm`` / ``target.spm`` + ``vocab.json`` as a pair of
:class:`~aiayn.tokenization.spm.SentencePieceTokenizer`.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from aiayn.interop.hf_dir import write_hf_tokenizer
from aiayn.tokenization.base import Tokenizer
from aiayn.tokenization.bpe import BPETokenizer
from aiayn.tokenization.compat import check_tokenizer_fits
from aiayn.tokenization.pretrained import PretrainedTokenizer
from aiayn.tokenization.spm import read_marian_tokenizers

__all__ = ["check_fits", "read_hf_tokenizers", "write_tokenizer"]


def read_hf_tokenizers(path: str | Path) -> tuple[Tokenizer | None, Tokenizer | None, str | None]:
    """``(source, target, None)`` (the same object twice when shared), or ``(None, None, why not)``
    when the directory holds no tokenizer.

    Raises ``ValueError`` naming the file for a tokenizer.json that ``tokenizers`` cannot read or whose
    special tokens are missing or ambiguous, ``FileNotFoundError`` for a Marian directory missing one
    of its three files.
    """
    directory = Path(path)
    file = directory / "tokenizer.json"
    if file.is_file():
        try:
            ours: Tokenizer = BPETokenizer(HFTokenizer.from_file(str(file)))
            return ours, ours, None
        except Exception:  # noqa: BLE001 -- not in our layout (or unreadable: from_hf_dir says which)
            pass
        tokenizer = PretrainedTokenizer.from_hf_dir(directory)
        return tokenizer, tokenizer, None
    if (directory / "source.spm").is_file() or (directory / "target.spm").is_file():
        src, tgt = read_marian_tokenizers(directory)
        return src, tgt, None
    return None, None, f"{directory} has no tokenizer.json (nor Marian's source.spm / target.spm)"


def write_tokenizer(path: str | Path, tokenizer: Tokenizer) -> str | None:
    """Write the tokenizer as transformers reads it; returns why not, or ``None``.

    A pretrained tokenizer goes back as its own ``tokenizer.json`` with a ``tokenizer_config.json``
    naming its special tokens; ours as :func:`~aiayn.interop.hf_dir.write_hf_tokenizer` writes it.
    """
    if not isinstance(tokenizer, PretrainedTokenizer):
        return write_hf_tokenizer(path, tokenizer)
    path = Path(path)
    tokenizer.backend.save(str(path / "tokenizer.json"))
    names = {
        f"{role}_token": tokenizer.id_to_token(value)
        for role, value in tokenizer.special_ids.to_dict().items() if value is not None
    }
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **names}
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return None


def check_fits(tokenizer: Tokenizer, vocab_size: int, name: str = "vocab_size") -> None:
    """:func:`check_tokenizer_fits`, with the tokenizer's file in the message."""
    try:
        check_tokenizer_fits(tokenizer, vocab_size, name)
    except ValueError as e:
        source = getattr(tokenizer, "source", None)
        raise ValueError(f"{source}: {e}" if source else str(e)) from None
