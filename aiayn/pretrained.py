"""A trained model on disk: weights, config and tokenizer(s), in one directory, with no pickle.

Layout (the same files a training checkpoint holds, so either can be loaded):
``model.safetensors`` (weights, tied tables stored once), ``config.json`` (the model config),
and ``tokenizer.json`` / ``char_tokenizer.json`` (or ``src_...`` / ``tgt_...`` when not shared).
An int8-quantised model (``aiayn quantize``) also holds ``quantization.json``; its weights file then
has int8 ``weight`` and fp32 ``scale`` tensors for every Linear layer.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from aiayn.checkpoint.atomic_io import replace_directory, write_durable
from aiayn.models.config import TransformerConfig, config_from_dict
from aiayn.models.presets import model_class
from aiayn.tokenization.base import Tokenizer
from aiayn.tokenization.compat import check_tokenizer_fits
from aiayn.tokenization.io import load_tokenizer_pair, save_tokenizer_pair
from aiayn.checkpoint.directory import CONFIG_FILE, MARKER, MODEL_FILE
from aiayn.checkpoint.state import resolve_checkpoint
from aiayn.checkpoint.weights import load_state_dict_checked, read_safetensors, state_dict_to_bytes
from aiayn.inference.precision import cast_model, pack_linears, parse_dtype
from aiayn.inference.quantization import Int8Linear, check_int8_kernel, parse_quantize, quantize_int8

__all__ = ["Pretrained", "save_pretrained", "load_pretrained", "model_dir", "MODEL_FILE", "CONFIG_FILE", "QUANTIZATION_FILE"]

_TOKENIZER_NAMES = ("tokenizer.json", "char_tokenizer.json")
QUANTIZATION_FILE = "quantization.json"
_INT8_FORMAT = {"method": "int8", "scheme": "weight-only, symmetric, one fp32 scale per output channel"}


@dataclass
class Pretrained:
    """A loaded model (in eval mode) with its config and tokenizers (the same object when shared)."""

    model: nn.Module
    config: TransformerConfig
    src_tokenizer: Tokenizer | None
    tgt_tokenizer: Tokenizer | None
    path: Path


def save_pretrained(
    path: str | os.PathLike[str],
    model: nn.Module,
    src_tokenizer: Tokenizer | None = None,
    tgt_tokenizer: Tokenizer | None = None,
    *,
    overwrite: bool = False,
) -> Path:
    """Write ``model`` (and tokenizers) to the directory ``path`` atomically: it appears whole or not at all.

    ``tgt_tokenizer`` defaults to ``src_tokenizer`` (one shared vocabulary). Raises
    ``FileExistsError`` if ``path`` exists and ``overwrite`` is false, ``ValueError`` if a tokenizer
    has more ids than the model's vocabulary.
    """
    target = Path(path)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} exists; pass overwrite=True (--overwrite) to replace it")
    config: TransformerConfig = model.config  # type: ignore[assignment]
    tgt_tokenizer = tgt_tokenizer if tgt_tokenizer is not None else src_tokenizer
    if src_tokenizer is not None:
        check_tokenizer_fits(src_tokenizer, config.vocab_size, "vocab_size")  # type: ignore[attr-defined]
        check_tokenizer_fits(tgt_tokenizer, getattr(config, "target_vocab_size", config.vocab_size), "target vocab_size")  # type: ignore[arg-type,attr-defined]
    with replace_directory(target) as tmp:
        write_durable(tmp / MODEL_FILE, state_dict_to_bytes(model.state_dict()))
        write_durable(tmp / CONFIG_FILE, (config.to_json() + "\n").encode())
        if any(isinstance(m, Int8Linear) for m in model.modules()):
            write_durable(tmp / QUANTIZATION_FILE, (json.dumps(_INT8_FORMAT, indent=2) + "\n").encode())
        if src_tokenizer is not None:
            save_tokenizer_pair(tmp, src_tokenizer, tgt_tokenizer)  # type: ignore[arg-type]
    return target


def model_dir(path: str | os.PathLike[str]) -> Path:
    """The directory to load weights from: a model directory as given, a checkpoint (verified), or a
    run directory's newest complete checkpoint."""
    directory = Path(path)
    if (directory / MODEL_FILE).is_file() and not (directory / MARKER).is_file():
        return directory
    return resolve_checkpoint(directory)


def load_pretrained(
    path: str | os.PathLike[str],
    *,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype | None = None,
    quantize: str | None = None,
) -> Pretrained:
    """Load a model directory, a training checkpoint, or a run directory (its newest complete checkpoint).

    The one place where inference precision is chosen, once, at load: ``dtype`` (``"float32"``,
    ``"bfloat16"``, ``"float16"`` or a ``torch.dtype``; ``None`` keeps fp32) casts the weights;
    ``quantize="int8"`` turns every Linear layer into int8 weights with per-channel scales
    (:mod:`aiayn.inference.quantization`). A directory written by ``aiayn quantize`` loads as int8
    whatever ``quantize`` says. Raises ``FileNotFoundError`` naming the path when there is nothing
    to load there, ``ValueError`` when the weights do not match the config or for an unknown
    ``dtype``/``quantize``, and ``RuntimeError`` when int8 is asked for and torch lacks the kernel.
    """
    torch_dtype = parse_dtype(dtype)
    quantize = parse_quantize(quantize)
    directory = Path(path)
    if not directory.exists():
        raise FileNotFoundError(f"no model at {directory}: no such directory")
    directory = model_dir(directory)
    config_file = directory / CONFIG_FILE
    if not config_file.is_file():
        raise FileNotFoundError(f"{directory} holds {MODEL_FILE} but no {CONFIG_FILE}")
    try:
        config = config_from_dict(json.loads(config_file.read_text(encoding="utf-8")))
    except json.JSONDecodeError as e:
        raise ValueError(f"{config_file}: invalid JSON ({e})") from None
    model = model_class(config)(config)
    stored_int8 = _stored_quantization(directory) is not None
    if stored_int8:
        check_int8_kernel(device)
        quantize_int8(model)  # the int8 layout, then the stored int8 weights and scales fill it
    state, _ = read_safetensors(directory / MODEL_FILE)
    load_state_dict_checked(model, state, source=str(directory / MODEL_FILE))
    if quantize == "int8" and not stored_int8:
        quantize_int8(model)  # from the fp32 weights, before any cast
    model.to(device).eval()
    if torch_dtype is not None:
        cast_model(model, torch_dtype)  # once: no step re-casts a weight
        pack_linears(model)  # half precision on the CPU: weights in oneDNN's layout, once
    src_tok = tgt_tok = None
    if any((directory / f"{prefix}{name}").is_file() for prefix in ("", "src_") for name in _TOKENIZER_NAMES):
        src_tok, tgt_tok = load_tokenizer_pair(directory)
    return Pretrained(model, config, src_tok, tgt_tok, directory)


def _stored_quantization(directory: Path) -> dict | None:
    """The quantization record of a model directory, or ``None``; ``ValueError`` for an unknown format."""
    file = directory / QUANTIZATION_FILE
    if not file.is_file():
        return None
    try:
        record = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{file}: invalid JSON ({e})") from None
    if not isinstance(record, dict) or record.get("method") != "int8":
        got = record.get("method") if isinstance(record, dict) else record
        raise ValueError(f"{file}: method must be 'int8' (the only stored quantisation), got {got!r}")
    return record
