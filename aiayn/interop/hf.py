"""Import Hugging Face models into our families and export ours, through the per-family key-map tables.

``load_hf`` reads a local model directory or takes an in-memory ``transformers`` model;
``save_hf`` writes a directory ``transformers`` loads (``from_pretrained``); ``to_hf`` gives the
config dict and tensors without writing. ``transformers`` itself is never imported here except by
:func:`to_hf_model`, a convenience for callers who have it.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from aiayn.interop.common import Architecture, ConfigError
from aiayn.interop.hf_dir import read_hf_dir, write_hf_dir
from aiayn.interop.hf_tokenizer import check_fits, read_hf_tokenizers, write_tokenizer
from aiayn.interop.keymap import KeyMapError, export_tensors, import_tensors, load_into, tied_keys
from aiayn.interop.registry import ARCHITECTURES
from aiayn.interop.registry import architecture as lookup_architecture
from aiayn.models.config import TransformerConfig
from aiayn.models.meta import meta_state_dict
from aiayn.models.presets import model_class
from aiayn.tokenization.base import Tokenizer

__all__ = ["Imported", "Exported", "load_hf", "to_hf", "save_hf", "to_hf_model", "PASSTHROUGH"]

log = logging.getLogger(__name__)

# Hugging Face config fields with no place in our configs (token ids for generation, label names):
# kept from an imported config.json and written back on export.
PASSTHROUGH = ("bos_token_id", "eos_token_id", "decoder_start_token_id", "forced_eos_token_id", "id2label", "label2id")


@dataclass
class Imported:
    """An imported model. ``tokenizer`` is ``None`` when the directory has none usable as ours
    (``tokenizer_note`` says why); ``dropped`` lists the foreign keys not carried over (legacy
    buffers, or a part our core cannot hold, logged as a warning); ``hf_config`` is the original
    ``config.json``, for :func:`save_hf`'s ``hf_extras``."""

    model: nn.Module
    config: TransformerConfig
    architecture: str
    tokenizer: Tokenizer | None = None
    tokenizer_note: str | None = None
    dropped: list[str] = field(default_factory=list)
    hf_config: dict[str, Any] = field(default_factory=dict)
    tgt_tokenizer: Tokenizer | None = None  # Marian: target.spm (decodes); else the same object as tokenizer


@dataclass
class Exported:
    """A model in Hugging Face form: ``config`` (``config.json``) and ``tensors`` (``model.safetensors``)."""

    architecture: str
    config: dict[str, Any]
    tensors: dict[str, Tensor]


def load_hf(source: str | Path | nn.Module, *, architecture: str | None = None) -> Imported:
    """Import a Hugging Face model: a local directory (``config.json`` + ``model.safetensors``, and
    ``tokenizer.json`` if present) or an in-memory ``transformers`` model.

    ``architecture`` overrides ``config.json``'s ``architectures[0]`` (the class name), e.g. to read
    a ``BertForMaskedLM`` checkpoint whose weights also hold the pre-training heads as ``BertForPreTraining``.

    Raises ``FileNotFoundError`` (missing directory or file; says how to download one),
    ``UnsupportedArchitecture`` (names the class, lists the supported ones), ``ConfigError`` (a
    config field with no exact equivalent) and ``KeyMapError`` (lists missing and unmatched keys).
    """
    if isinstance(source, (str, Path)):
        hf_config, tensors = read_hf_dir(source)
        tokenizer, tgt_tokenizer, note = read_hf_tokenizers(source)
        names = hf_config.get("architectures") or [None]
        arch = lookup_architecture(architecture or names[0], f"config.json of {source}")
    elif hasattr(source, "config") and hasattr(source.config, "to_dict") and isinstance(source, nn.Module):
        hf_config = source.config.to_dict()  # type: ignore[operator]  # a transformers model: its config is an object, not a Tensor
        tensors = {k: v.detach() for k, v in source.state_dict().items()}
        tokenizer, tgt_tokenizer, note = None, None, "an in-memory model carries no tokenizer"
        arch = lookup_architecture(architecture or type(source).__name__, "in-memory model")
    else:
        raise TypeError(f"source must be a directory or a transformers model, got {type(source).__name__}")
    if hf_config.get("model_type") not in (None, arch.model_type):
        raise ConfigError(f"{arch.name} needs model_type={arch.model_type!r}, config says {hf_config['model_type']!r}")

    short, display = _strip_prefix(tensors, arch)
    config = arch.config_from_hf(hf_config, short)
    # Shapes only (meta tensors): an untrusted config.json allocates nothing until the weights match it.
    shapes = {k: tuple(v.shape) for k, v in meta_state_dict(config).items()}
    try:
        ours, dropped = import_tensors(short, arch.rules(config), arch.ignores, display, shapes)
    except KeyMapError as e:
        raise KeyMapError(f"{arch.name}: {e}{_other_heads_hint(arch, hf_config, tensors)}") from None
    model = model_class(config)(config)
    dtype = _common_dtype(ours)
    if dtype is not None and dtype != torch.float32:
        model.to(dtype)  # keep the checkpoint's precision, so export gives back the same bytes
    load_into(model, ours)
    model.eval()
    if dropped:
        log.warning("%s: dropped %d key(s) with no counterpart: %s", arch.name, len(dropped), ", ".join(dropped))
    if tokenizer is not None and tgt_tokenizer is not None:
        check_fits(tokenizer, config.vocab_size)
        check_fits(tgt_tokenizer, getattr(config, "target_vocab_size", config.vocab_size), "target vocab_size")
    elif note:
        log.info("no tokenizer: %s", note)
    return Imported(model, config, arch.name, tokenizer, note, dropped, hf_config, tgt_tokenizer)


def to_hf(model: nn.Module, *, architecture: str | None = None, hf_extras: dict[str, Any] | None = None) -> Exported:
    """Our model -> Hugging Face config dict and tensors (the keys ``save_pretrained`` would write).

    ``architecture``: the class to export as (default: the one that fits the model's heads).
    ``hf_extras``: an imported ``config.json`` whose :data:`PASSTHROUGH` fields (token ids, label
    names) are kept. Raises ``ConfigError`` naming the field that no supported class can hold.
    """
    config = getattr(model, "config", None)
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"model must be one of aiayn's models (with a .config), got {type(model).__name__}")
    _refuse_efficient_variants(config)
    arch = _export_architecture(config, architecture, hf_extras or {})
    hf_config = arch.config_to_hf(config)
    _pass_through(hf_config, hf_extras or {}, config)
    state = model.state_dict()
    dtype = _common_dtype(state)
    if dtype is not None:
        hf_config["dtype"] = str(dtype).removeprefix("torch.")
    try:
        tensors = export_tensors(state, arch.rules(config), tied_keys(model))
    except KeyMapError as e:
        raise KeyMapError(f"{arch.name}: {e}") from None
    return Exported(arch.name, hf_config, {arch.add_prefix(k): v for k, v in tensors.items()})


def save_hf(
    directory: str | Path,
    model: nn.Module,
    *,
    tokenizer: Tokenizer | None = None,
    architecture: str | None = None,
    hf_extras: dict[str, Any] | None = None,
) -> Exported:
    """Write ``config.json`` + ``model.safetensors`` (+ ``tokenizer.json`` for a BPE tokenizer) to ``directory``.

    ``transformers`` loads the result with ``<architecture>.from_pretrained(directory)``.
    """
    exported = to_hf(model, architecture=architecture, hf_extras=hf_extras)
    write_hf_dir(directory, exported.config, exported.tensors)
    if tokenizer is not None:
        note = write_tokenizer(directory, tokenizer)
        if note:
            log.warning("%s", note)
    return exported


def to_hf_model(model: nn.Module, *, architecture: str | None = None, hf_extras: dict[str, Any] | None = None) -> nn.Module:
    """Our model as an in-memory ``transformers`` model (needs ``transformers`` installed)."""
    try:
        import transformers
    except ImportError as e:  # an optional dependency: the rest of interop does not need it
        raise ImportError("to_hf_model needs transformers (pip install transformers); save_hf does not") from e
    with tempfile.TemporaryDirectory() as tmp:
        exported = save_hf(tmp, model, architecture=architecture, hf_extras=hf_extras)
        hf_model = getattr(transformers, exported.architecture).from_pretrained(tmp)
    return hf_model.eval()


def _refuse_efficient_variants(config: TransformerConfig) -> None:
    """GPT-2, BERT, Marian and BART attend with softmax over every key: a local, linear or SSM model has no counterpart."""
    for name, plain in (("attention", "softmax"), ("mixer", "attention")):
        value = getattr(config, name, plain)
        if value != plain:
            raise ConfigError(
                f"cannot export to Hugging Face: {name}={value!r}; the supported classes ({', '.join(ARCHITECTURES)}) "
                f"only hold {name}={plain!r}"
            )


def _export_architecture(config: TransformerConfig, name: str | None, extras: dict[str, Any]) -> Architecture:
    if name is not None:
        arch = lookup_architecture(name)
        why = arch.fits(config)
        if why:
            raise ConfigError(f"cannot export as {arch.name}: {why}")
        return arch
    fitting = [a for a in ARCHITECTURES.values() if a.fits(config) is None]
    origin = (extras.get("architectures") or [None])[0]
    for arch in fitting:
        if arch.name == origin:
            return arch
    if fitting:
        return fitting[0]
    reasons = "; ".join(f"{a.name}: {why}" for a in ARCHITECTURES.values() if (why := a.fits(config)) and "holds" not in why)
    raise ConfigError(
        f"no supported Hugging Face class can hold this {type(config).__name__} exactly"
        + (f" ({reasons})" if reasons else "") + f"; supported: {', '.join(ARCHITECTURES)}"
    )


def _pass_through(hf_config: dict[str, Any], extras: dict[str, Any], config: TransformerConfig) -> None:
    for key in PASSTHROUGH:
        if key not in extras:
            continue
        if key in ("id2label", "label2id") and (key not in hf_config or len(extras[key]) != len(hf_config[key])):
            continue  # only label names of a classifier of the same size
        hf_config[key] = extras[key]
    if config.pad_id is None and extras.get("pad_token_id") is not None:
        hf_config["pad_token_id"] = extras["pad_token_id"]  # GPT-2: a pad token for generate(), unused by the model


def _strip_prefix(tensors: dict[str, Tensor], arch: Architecture) -> tuple[dict[str, Tensor], Callable[[str], str]]:
    """Keys without the base model's prefix (the tables' names), and a function back to the file's names.

    A head class saves ``bert.encoder...``, the base class ``encoder...``; either loads, as in transformers.
    """
    if not arch.prefix:
        return tensors, lambda key: key
    out: dict[str, Tensor] = {}
    original: dict[str, str] = {}
    for key, tensor in tensors.items():
        short = key.removeprefix(f"{arch.prefix}.")
        if short in out:
            raise KeyMapError(f"{arch.name}: both {key} and {short} are present")
        out[short], original[short] = tensor, key
    prefixed = any(k != v for k, v in original.items())
    return out, lambda key: original.get(key, arch.add_prefix(key) if prefixed else key)


def _other_heads_hint(arch: Architecture, hf_config: dict[str, Any], tensors: dict[str, Tensor]) -> str:
    """Name another class of the same model type whose table matches these weights exactly."""
    for other in ARCHITECTURES.values():
        if other is arch or other.model_type != arch.model_type:
            continue
        try:
            short = _strip_prefix(tensors, other)[0]
            import_tensors(short, other.rules(other.config_from_hf(hf_config, short)), other.ignores)
        except ValueError:  # KeyMapError, ConfigError, or a config value ours rejects
            continue
        return f" (the weights match {other.name}: pass architecture={other.name!r}, or --architecture {other.name})"
    return ""


def _common_dtype(tensors: dict[str, Tensor]) -> torch.dtype | None:
    dtypes = {t.dtype for t in tensors.values() if t.is_floating_point()}
    return dtypes.pop() if len(dtypes) == 1 else None
