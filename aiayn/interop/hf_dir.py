"""Read and write a local Hugging Face model directory: ``config.json`` + ``model.safetensors`` (+ ``tokenizer.json``).

Nothing here downloads: a directory that is not there raises ``FileNotFoundError`` saying how to get
one. ``transformers`` is not imported; the files are plain JSON and safetensors.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from safetensors import safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer as HFTokenizer
from torch import Tensor

from aiayn.checkpoint.directory import CONFIG_FILE, MODEL_FILE
from aiayn.tokenization.base import Tokenizer
from aiayn.tokenization.bpe import BPETokenizer
from aiayn.tokenization.special import BOS, CLS, EOS, MASK, PAD, SEP, SPECIAL_TOKENS, UNK

__all__ = ["read_hf_dir", "write_hf_dir", "read_hf_tokenizer", "write_hf_tokenizer", "missing_dir_message"]

log = logging.getLogger(__name__)

WEIGHTS_FILE = MODEL_FILE  # Hugging Face and our checkpoints use the same two names
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


def missing_dir_message(path: Path) -> str:
    return (
        f"no Hugging Face model directory at {path}: aiayn reads local directories only and never downloads. "
        f"With internet access, fetch one first, e.g. `huggingface-cli download gpt2 --local-dir {path}` "
        f"(or in Python: `AutoModelForCausalLM.from_pretrained('gpt2').save_pretrained('{path}')`); "
        "see docs/interop.md"
    )


def read_hf_dir(path: str | Path) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``(config.json as a dict, {key: tensor})`` of a local model directory (single or sharded safetensors).

    Raises ``FileNotFoundError`` for a missing directory or file (saying how to get one).
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(missing_dir_message(path))
    config_file = path / CONFIG_FILE
    if not config_file.is_file():
        raise FileNotFoundError(f"{path} has no {CONFIG_FILE}; found: {_listing(path)}. {missing_dir_message(path)}")
    config = json.loads(config_file.read_text(encoding="utf-8"))
    if (path / WEIGHTS_FILE).is_file():
        files = [path / WEIGHTS_FILE]
    elif (path / WEIGHTS_INDEX_FILE).is_file():
        index = json.loads((path / WEIGHTS_INDEX_FILE).read_text(encoding="utf-8"))
        files = [path / name for name in sorted(set(index["weight_map"].values()))]
    else:
        hint = ""
        if (path / "pytorch_model.bin").is_file():
            hint = (
                " (it holds pytorch_model.bin: aiayn reads safetensors only, which cannot run code; re-save it "
                "with transformers: `Model.from_pretrained(dir).save_pretrained(dir)` writes model.safetensors)"
            )
        raise FileNotFoundError(f"{path} has no {WEIGHTS_FILE} or {WEIGHTS_INDEX_FILE}{hint}; found: {_listing(path)}")
    tensors: dict[str, Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                tensors[key] = f.get_tensor(key)
    return config, tensors


def write_hf_dir(path: str | Path, config: dict[str, Any], tensors: dict[str, Tensor]) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (with the ``format: pt`` metadata transformers requires)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(path / WEIGHTS_FILE), metadata={"format": "pt"})
    return path


def read_hf_tokenizer(path: str | Path) -> tuple[BPETokenizer | None, str | None]:
    """``(tokenizer, None)`` if ``path/tokenizer.json`` is a BPE tokenizer in aiayn's special-token layout,
    else ``(None, why not)``.

    A Hugging Face tokenizer is usable as ours only if its special tokens ``<pad> <bos> <eos> <unk>
    <cls> <sep> <mask>`` sit at ids 0..6 (a tokenizer aiayn exported does); re-numbering the ids of
    any other one would change what every embedding row means.
    """
    file = Path(path) / TOKENIZER_FILE
    if not file.is_file():
        return None, f"{path} has no {TOKENIZER_FILE}"
    try:
        backend = HFTokenizer.from_file(str(file))
    except Exception as e:  # noqa: BLE001 -- tokenizers raises its own exception types
        return None, f"{file} is not readable by tokenizers: {e}"
    try:
        return BPETokenizer(backend), None
    except ValueError as e:
        return None, (
            f"{file} is not in aiayn's special-token layout ({', '.join(SPECIAL_TOKENS)} at ids 0..6): {e}; "
            "the weights and config are converted without a tokenizer (keep using the Hugging Face one)"
        )


def write_hf_tokenizer(path: str | Path, tokenizer: Tokenizer) -> str | None:
    """Write ``tokenizer.json`` + ``tokenizer_config.json`` for a BPE tokenizer; returns why not, or ``None``."""
    if not isinstance(tokenizer, BPETokenizer):
        return f"a {type(tokenizer).__name__} has no Hugging Face tokenizer.json form; exported without a tokenizer"
    path = Path(path)
    tokenizer.save(path / TOKENIZER_FILE)
    special = {
        "pad_token": PAD, "bos_token": BOS, "eos_token": EOS, "unk_token": UNK,
        "cls_token": CLS, "sep_token": SEP, "mask_token": MASK,
    }
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **special}
    (path / TOKENIZER_CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return None


def _listing(path: Path) -> str:
    names = sorted(p.name for p in path.iterdir())
    return ", ".join(names) if names else "nothing"
