"""A trained model on disk: weights, config and tokenizer(s), in one directory, with no pickle.

Layout (the same files a training checkpoint holds, so either can be loaded):
``model.safetensors`` (weights, tied tables stored once), ``config.json`` (the model config),
and ``tokenizer.json`` / ``char_tokenizer.json`` (or ``src_...`` / ``tgt_...`` when not shared).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from aiayn.checkpoint.atomic_io import replace_directory, write_durable
from aiayn.checkpoint.directory import CONFIG_FILE, MARKER, MODEL_FILE
from aiayn.checkpoint.state import resolve_checkpoint
from aiayn.checkpoint.weights import load_state_dict_checked, read_safetensors, state_dict_to_bytes
from aiayn.models.config import TransformerConfig, config_from_dict
from aiayn.models.presets import model_class
from aiayn.tokenization.base import Tokenizer
from aiayn.tokenization.compat import check_tokenizer_fits
from aiayn.tokenization.io import load_tokenizer_pair, save_tokenizer_pair

__all__ = ["Pretrained", "save_pretrained", "load_pretrained", "model_dir", "MODEL_FILE", "CONFIG_FILE"]

_TOKENIZER_NAMES = ("tokenizer.json", "char_tokenizer.json")


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
        check_tokenizer_fits(src_tokenizer, config.vocab_size, "vocab_size")
        check_tokenizer_fits(tgt_tokenizer, getattr(config, "target_vocab_size", config.vocab_size), "target vocab_size")  # type: ignore[arg-type]  # not None: defaults to src_tokenizer
    with replace_directory(target) as tmp:
        write_durable(tmp / MODEL_FILE, state_dict_to_bytes(model.state_dict()))
        write_durable(tmp / CONFIG_FILE, (config.to_json() + "\n").encode())
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


def load_pretrained(path: str | os.PathLike[str], *, device: str | torch.device = "cpu") -> Pretrained:
    """Load a model directory, a training checkpoint, or a run directory (its newest complete checkpoint).

    Raises ``FileNotFoundError`` naming the path when there is nothing to load there, and
    ``ValueError`` when the weights do not match the config.
    """
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
    state, _ = read_safetensors(directory / MODEL_FILE)
    load_state_dict_checked(model, state, source=str(directory / MODEL_FILE))
    model.to(device).eval()
    src_tok = tgt_tok = None
    if any((directory / f"{prefix}{name}").is_file() for prefix in ("", "src_") for name in _TOKENIZER_NAMES):
        src_tok, tgt_tok = load_tokenizer_pair(directory)
    return Pretrained(model, config, src_tok, tgt_tok, directory)
