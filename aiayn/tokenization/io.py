"""Load a saved tokenizer by looking at what the file holds; save and load source/target pairs.

A checkpoint directory holds either one shared tokenizer (``tokenizer.json`` for BPE,
``char_tokenizer.json`` for characters) or a pair named ``src_<name>`` and ``tgt_<name>``.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from aiayn.tokenization.base import Tokenizer
from aiayn.tokenization.bpe import BPE_FILE, BPETokenizer
from aiayn.tokenization.char import CHAR_FILE, CHAR_FORMAT, CharTokenizer
from aiayn.tokenization.pretrained import PRETRAINED_FILE, PRETRAINED_FORMAT, PretrainedTokenizer
from aiayn.tokenization.spm import SPM_FILE, SPM_FORMAT, SentencePieceTokenizer
from aiayn.untrusted import MAX_TOKENIZER_BYTES, parse_json, read_untrusted_bytes

__all__ = ["load_tokenizer", "save_tokenizer_pair", "load_tokenizer_pair", "default_file_name"]

_NAMES = (BPE_FILE, CHAR_FILE, PRETRAINED_FILE, SPM_FILE)


def default_file_name(tokenizer: Tokenizer) -> str:
    if isinstance(tokenizer, BPETokenizer):
        return BPE_FILE
    if isinstance(tokenizer, CharTokenizer):
        return CHAR_FILE
    if isinstance(tokenizer, PretrainedTokenizer):
        return PRETRAINED_FILE
    if isinstance(tokenizer, SentencePieceTokenizer):
        return SPM_FILE
    raise TypeError(
        "tokenizer must be a BPETokenizer, CharTokenizer, PretrainedTokenizer or SentencePieceTokenizer, "
        f"got {type(tokenizer).__name__}"
    )


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load a tokenizer from a file, or from a directory holding exactly one of ``tokenizer.json`` /
    ``char_tokenizer.json`` / ``hf_tokenizer.json`` / ``spm_tokenizer.json``. Raises ``FileNotFoundError`` or ``ValueError``."""
    file = _find_file(Path(path), prefix="")
    raw = read_untrusted_bytes(file, max_bytes=MAX_TOKENIZER_BYTES, what="tokenizer file")  # a regular file, bounded
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{file}: not a tokenizer file: not UTF-8 ({e})") from None
    data = parse_json(text, f"{file} (a tokenizer file)")
    if isinstance(data, dict) and data.get("format") == CHAR_FORMAT:
        return CharTokenizer.from_dict(data, str(file))
    if isinstance(data, dict) and data.get("format") == PRETRAINED_FORMAT:
        return PretrainedTokenizer.from_dict(data, str(file))
    if isinstance(data, dict) and data.get("format") == SPM_FORMAT:
        return SentencePieceTokenizer.from_dict(data, str(file))
    if isinstance(data, dict) and isinstance(data.get("model"), dict) and data["model"].get("type") == "BPE":
        return BPETokenizer(HFTokenizer.from_str(text))
    raise ValueError(
        f"{file}: not a tokenizer file: expected a character tokenizer ({{\"format\": \"{CHAR_FORMAT}\", ...}}) "
        "or a Hugging Face tokenizer.json with a BPE model"
    )


def save_tokenizer_pair(directory: str | Path, src: Tokenizer, tgt: Tokenizer) -> list[Path]:
    """Save a shared tokenizer once (when ``src is tgt``), else as ``src_<name>`` and ``tgt_<name>``."""
    directory = Path(directory)
    if src is tgt:
        return [src.save(directory / default_file_name(src))]
    return [
        src.save(directory / f"src_{default_file_name(src)}"),
        tgt.save(directory / f"tgt_{default_file_name(tgt)}"),
    ]


def load_tokenizer_pair(directory: str | Path) -> tuple[Tokenizer, Tokenizer]:
    """Inverse of :func:`save_tokenizer_pair`: a shared tokenizer comes back as the same object twice."""
    directory = Path(directory)
    if any((directory / f"src_{n}").exists() for n in _NAMES):
        src = load_tokenizer(_find_file(directory, prefix="src_"))
        tgt = load_tokenizer(_find_file(directory, prefix="tgt_"))
        return src, tgt
    shared = load_tokenizer(directory)
    return shared, shared


def _find_file(path: Path, prefix: str) -> Path:
    if path.is_file():
        return path
    if not path.is_dir():
        raise FileNotFoundError(f"no tokenizer at {path}: no such file or directory")
    found = [path / f"{prefix}{n}" for n in _NAMES if (path / f"{prefix}{n}").is_file()]
    if len(found) != 1:
        names = " or ".join(f"{prefix}{n}" for n in _NAMES)
        what = "both" if found else "neither"
        raise FileNotFoundError(f"{path}: expected exactly one of {names}, found {what}")
    return found[0]
