"""Read and write a local Hugging Face model directory: ``config.json`` + ``model.safetensors`` (+ ``tokenizer.json``).

Nothing here downloads: a directory that is not there raises ``FileNotFoundError`` saying how to get
one. ``transformers`` is not imported; the files are plain JSON and safetensors.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer as HFTokenizer
from torch import Tensor

from aiayn.checkpoint.directory import CONFIG_FILE, MODEL_FILE
from aiayn.checkpoint.errors import CorruptCheckpointError
from aiayn.checkpoint.safetensors_header import read_header
from aiayn.tokenization.base import Tokenizer
from aiayn.tokenization.bpe import BPETokenizer
from aiayn.tokenization.special import BOS, CLS, EOS, MASK, PAD, SEP, SPECIAL_TOKENS, UNK
from aiayn.untrusted import read_json_file

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

    Raises ``FileNotFoundError`` for a missing directory or file (saying how to get one), ``ValueError``
    naming a ``config.json`` or index that is not a JSON object or a shard outside the directory, and
    ``CorruptCheckpointError`` naming a weights file that is not valid safetensors.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(missing_dir_message(path))
    config_file = path / CONFIG_FILE
    if not config_file.exists():  # a FIFO or a directory of that name is refused by the reader, naming it
        raise FileNotFoundError(f"{path} has no {CONFIG_FILE}; found: {_listing(path)}. {missing_dir_message(path)}")
    config = _read_json_object(config_file)
    if (path / WEIGHTS_FILE).is_file():
        files = [path / WEIGHTS_FILE]
    elif (path / WEIGHTS_INDEX_FILE).is_file():
        files = _shard_files(path, _read_json_object(path / WEIGHTS_INDEX_FILE))
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
        read_header(file)  # a plain file (no symlink), bounded and checked first: names the file and the bad tensor
        try:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():
                    if key in tensors:
                        raise CorruptCheckpointError(file, f"tensor {key!r} is also in another shard")
                    tensors[key] = f.get_tensor(key)
        except SafetensorError as e:
            raise CorruptCheckpointError(file, f"cannot read it as safetensors ({e})") from None
    return config, tensors


def _read_json_object(file: Path) -> dict[str, Any]:
    """A JSON object from ``file`` through the bounded reader (size, depth, a regular file); ``ValueError``
    naming the file otherwise."""
    data: dict[str, Any] = read_json_file(file, what=file.name, expect=dict)
    return data


def _shard_files(path: Path, index: dict[str, Any]) -> list[Path]:
    """The shards named by ``model.safetensors.index.json``, each confined to ``path`` and present."""
    source = path / WEIGHTS_INDEX_FILE
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{source}: expected a 'weight_map' object of tensor name -> shard file name")
    root = path.resolve()
    files = []
    for name in sorted(set(weight_map.values())):
        file = (path / name).resolve()
        if Path(name).is_absolute() or not file.is_relative_to(root) or file.parent != root:
            raise ValueError(f"{source}: shard {name!r} is outside {path}; shards must be files in the model directory")
        if not file.is_file():
            raise FileNotFoundError(f"{source}: shard {name!r} is missing from {path}")
        files.append(path / name)
    return files


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
