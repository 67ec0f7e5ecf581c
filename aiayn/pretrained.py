"""A trained model on disk: weights, config and tokenizer(s), in one directory, with no pickle.

Layout (the same files a training checkpoint holds, so either can be loaded):
``model.safetensors`` (weights, tied tables stored once), ``config.json`` (the model config),
and ``tokenizer.json`` / ``char_tokenizer.json`` (or ``src_...`` / ``tgt_...`` when not shared).
An int8- or int4-quantised model (``aiayn quantize``) also holds ``quantization.json``; its weights file then
has int8 ``weight`` and fp32 ``scale`` tensors for every Linear layer (int4: 4-bit codes two to a byte, fp32
``scales`` and ``zeros`` per group; :mod:`aiayn.inference.int4`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from aiayn.checkpoint.atomic_io import EXPORT_MANIFEST, replace_directory, write_durable
from aiayn.checkpoint.directory import CONFIG_FILE, MARKER, MODEL_FILE
from aiayn.checkpoint.safetensors_header import meta_state
from aiayn.checkpoint.state import resolve_checkpoint
from aiayn.checkpoint.weights import (
    CorruptCheckpointError,
    check_state_fits,
    load_state_dict_checked,
    read_safetensors,
    state_dict_to_bytes,
)
from aiayn.config_io import from_dict, read_yaml
from aiayn.inference.fusion import fuse_projections
from aiayn.inference.huge_pages import place_on_huge_pages
from aiayn.inference.huge_pages import unavailable_reason as huge_pages_reason
from aiayn.inference.kernel_choice import choose_huge_pages, choose_model_attention
from aiayn.inference.precision import cast_model, native_bf16, pack_linears, parse_dtype
from aiayn.inference.quantization import QUANTIZATIONS, parse_quantize, quantization_record
from aiayn.inference.quantization import quantize as quantize_model
from aiayn.models.config import TransformerConfig, config_from_dict
from aiayn.models.meta import meta_state_dict
from aiayn.models.presets import model_class
from aiayn.nn.norm import use_native_norms
from aiayn.tokenization.base import Tokenizer
from aiayn.tokenization.compat import check_tokenizer_fits
from aiayn.tokenization.io import load_tokenizer_pair, save_tokenizer_pair
from aiayn.training.config import DecodeSection
from aiayn.untrusted import read_json_file, read_untrusted_bytes

__all__ = [
    "Pretrained", "save_pretrained", "load_pretrained", "prepare_for_inference", "model_dir", "label_names", "hf_source_config",
    "check_replaceable", "check_config_backed", "confine_data_paths", "DATA_PATH_KEYS", "MODEL_FILE", "CONFIG_FILE", "QUANTIZATION_FILE", "LABELS_FILE",
    "TRAIN_CONFIG_FILE", "own_files", "saved_decode",
]

log = logging.getLogger(__name__)

LABELS_FILE = "labels.json"  # {"labels": [name of class 0, name of class 1, ...]}
TRAIN_CONFIG_FILE = "train_config.yaml"  # the recipe it was trained with: its data (evaluate) and decode settings
_TOKENIZER_NAMES = ("tokenizer.json", "char_tokenizer.json", "hf_tokenizer.json", "spm_tokenizer.json")
QUANTIZATION_FILE = "quantization.json"


@dataclass
class Pretrained:
    """A loaded model (in eval mode) with its config and tokenizers (the same object when shared)."""

    model: nn.Module
    config: TransformerConfig
    src_tokenizer: Tokenizer | None
    tgt_tokenizer: Tokenizer | None
    path: Path
    labels: list[str] | None = None  # class names, where the directory knows them (see label_names)
    decode: DecodeSection = dataclasses.field(default_factory=DecodeSection)  # how it translates by default (saved_decode)


def save_pretrained(
    path: str | os.PathLike[str],
    model: nn.Module,
    src_tokenizer: Tokenizer | None = None,
    tgt_tokenizer: Tokenizer | None = None,
    *,
    overwrite: bool = False,
    extra_files: Mapping[str, bytes] | None = None,
) -> Path:
    """Write ``model`` (and tokenizers) to the directory ``path`` atomically: it appears whole or not at all.

    ``tgt_tokenizer`` defaults to ``src_tokenizer`` (one shared vocabulary); ``extra_files`` (name -> bytes)
    are written with the rest (``hf_source.json``). ``overwrite`` removes only the files a previous export
    wrote (see :func:`check_replaceable`). Raises
    ``FileExistsError`` if ``path`` exists and ``overwrite`` is false, ``ValueError`` if a tokenizer
    has more ids than the model's vocabulary.
    """
    target = Path(path)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} exists; pass overwrite=True (--overwrite) to replace it")
    previous = check_replaceable(target)
    config: TransformerConfig = model.config  # type: ignore[assignment]
    tgt_tokenizer = tgt_tokenizer if tgt_tokenizer is not None else src_tokenizer
    if src_tokenizer is not None:
        check_tokenizer_fits(src_tokenizer, config.vocab_size, "vocab_size")
        check_tokenizer_fits(tgt_tokenizer, getattr(config, "target_vocab_size", config.vocab_size), "target vocab_size")  # type: ignore[arg-type]  # not None: defaults to src_tokenizer
    with replace_directory(target, previous=previous) as tmp:
        write_durable(tmp / MODEL_FILE, state_dict_to_bytes(model.state_dict()))
        write_durable(tmp / CONFIG_FILE, (config.to_json() + "\n").encode())
        record = quantization_record(model)
        if record is not None:
            write_durable(tmp / QUANTIZATION_FILE, (json.dumps(record, indent=2) + "\n").encode())
        if src_tokenizer is not None:
            save_tokenizer_pair(tmp, src_tokenizer, tgt_tokenizer)  # type: ignore[arg-type]
        for name, data in (extra_files or {}).items():  # e.g. hf_source.json: listed in the manifest with the rest
            if name not in _EXPORT_FILES or (tmp / name).exists():
                raise ValueError(f"extra_files: {name!r} is not an export file name, or clashes with one written")
            write_durable(tmp / name, data)
    return target


# What a model export holds (ours, or a Hugging Face layout): --overwrite replaces nothing else.
_EXPORT_FILES = frozenset({
    MODEL_FILE, CONFIG_FILE, "hf_source.json", "model.safetensors.index.json", "tokenizer_config.json", TRAIN_CONFIG_FILE, LABELS_FILE,
    "special_tokens_map.json", "generation_config.json", "vocab.json", "merges.txt", "vocab.txt", "README.md",
    *(f"{prefix}{name}" for prefix in ("", "src_", "tgt_") for name in _TOKENIZER_NAMES),
})
_EXPORT_SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")


def check_replaceable(target: Path) -> list[Path]:
    """The files ``--overwrite`` may remove from ``target``: regular files with the exact names an export
    writes (or that its ``EXPORT_MANIFEST`` lists) and the manifest itself; ``[]`` when ``target`` is
    absent or empty.

    Anything else (a directory, even one named like an export file, a symbolic link, a FIFO, a file with
    another name, a folder that is not an export at all) might be someone's work: ``ValueError`` names it,
    and nothing is removed.
    """
    if not target.exists() and not target.is_symlink():
        return []
    if target.is_symlink() or not target.is_dir():
        raise ValueError(f"refusing to replace {target}: it is not a directory (a file or a link); remove it yourself")
    entries = sorted(target.iterdir())
    if not entries:
        return []
    listed = _manifest_names(target)
    names = {p.name for p in entries}
    # With a manifest, what it lists (a notes file named README.md put there later is kept); without one
    # (an export of an older version, a Hugging Face download), the exact export names.
    foreign = [p.name for p in entries if p.name != EXPORT_MANIFEST and not (
        p.name in listed if listed else p.name in _EXPORT_FILES or _EXPORT_SHARD.fullmatch(p.name))]
    why = ""
    if foreign:
        why = f"it holds {', '.join(foreign[:10])}"
    elif not listed and (CONFIG_FILE not in names or not (MODEL_FILE in names or "model.safetensors.index.json" in names)):
        why = f"it lacks {CONFIG_FILE} and weights"
    if why:
        raise ValueError(
            f"refusing to replace {target}: it is not a previous model export ({why}); "
            "--overwrite only replaces a directory an export wrote. Choose another path or remove it yourself"
        )
    for entry in entries:
        if entry.is_symlink() or not entry.is_file():
            raise ValueError(
                f"refusing to replace {target}: {entry} is not a regular file (a directory, link or FIFO); --overwrite "
                "removes only the files an export wrote, never a directory. Remove it yourself"
            )
    return entries


def _manifest_names(target: Path) -> set[str]:
    """The plain file names ``EXPORT_MANIFEST`` lists (an unreadable manifest lists none)."""
    if not (target / EXPORT_MANIFEST).exists():
        return set()
    try:
        files = read_json_file(target / EXPORT_MANIFEST, what="export manifest", expect=dict).get("files")
    except ValueError:
        return set()
    if not isinstance(files, list):
        return set()
    return {f for f in files if isinstance(f, str) and f and "/" not in f and "\\" not in f and f not in (".", "..")}


# The keys of a training config's data section that name files or folders an inference command reads
# (data.prepared, token-id shards, is read by training only, from a config the user gives).
DATA_PATH_KEYS = ("data_dir", "train_files", "val_files", "test_files")


def confine_data_paths(data: Any, root: str | os.PathLike[str], source: Path, *, given: Collection[str] = ()) -> Any:
    """``data`` (a training config's data section read from ``source``, a file inside the model directory
    ``root``) with every path it reads resolved inside ``root``: relative ones from ``root``, symbolic links followed.

    A model directory is untrusted input: its ``train_config.yaml`` could name any file on this machine
    (``val_files: [/etc/passwd]``). A path outside ``root`` raises ``ValueError`` naming the key, the path and
    the flag that gives it explicitly; keys in ``given`` (``"data.data_dir"``: the user's own flag) are not checked.
    """
    base = Path(root).resolve()
    changes: dict[str, Any] = {}
    files = getattr(data, "dataset", None) == "files"
    for key in DATA_PATH_KEYS:
        value = getattr(data, key, None)
        read = files == key.endswith("_files")  # a named set reads data_dir, own files their lists
        if f"data.{key}" in given or not value or not read:
            continue
        paths = [value] if isinstance(value, str) else list(value)
        resolved = []
        for item in paths:
            target = (base / item).resolve()
            if not target.is_relative_to(base):
                flag = "--data-dir DIR" if key == "data_dir" else "--files PATH"
                raise ValueError(
                    f"{source}: data.{key} names {item!r}, which is outside the model directory {base}; a model "
                    f"directory may only point inside itself. If you mean that data, give it yourself with {flag}"
                )
            resolved.append(str(target))
        changes[key] = resolved[0] if isinstance(value, str) else resolved
    return dataclasses.replace(data, **changes) if changes else data


def model_dir(path: str | os.PathLike[str]) -> Path:
    """The directory to load weights from: a model directory as given, a checkpoint (verified), or a
    run directory's newest complete checkpoint."""
    directory = Path(path)
    if (directory / MODEL_FILE).is_file() and not (directory / MARKER).is_file():
        return directory
    return resolve_checkpoint(directory)


def check_config_backed(config: TransformerConfig, weights: Path) -> None:
    """Refuse a config whose tensors the weights file does not hold, before allocating anything.

    The model is built on the ``meta`` device (shapes only) and compared with the file's header, so
    an untrusted ``config.json`` (say ``d_model = 2**30``) costs no memory. Raises ``ValueError``
    listing the mismatches and ``CorruptCheckpointError`` for a bad header.
    """
    try:
        check_state_fits(meta_state_dict(config), meta_state(weights), source=str(weights))
    except CorruptCheckpointError:
        raise
    except ValueError as e:
        raise ValueError(f"{e}\nrefusing to build the model of {weights.parent / CONFIG_FILE}: its weights file cannot back it") from None


def load_pretrained(
    path: str | os.PathLike[str],
    *,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype | None = None,
    quantize: str | None = None,
    pack: bool = True,
) -> Pretrained:
    """Load a model directory, a training checkpoint, or a run directory (its newest complete checkpoint).

    The one place where inference precision is chosen, once, at load: ``dtype`` (``"float32"``,
    ``"bfloat16"``, ``"float16"`` or a ``torch.dtype``; ``None`` keeps fp32) casts the weights;
    ``quantize="int8"`` turns every Linear layer into int8 weights with per-channel scales
    (:mod:`aiayn.inference.quantization`; ``"int8-dynamic"``, ``"int4"``: see there). A directory written by ``aiayn quantize`` loads as int8
    whatever ``quantize`` says. ``pack=False`` keeps the CPU's fp32/bf16 Linear layers plain ``nn.Linear``
    (each weight held once instead of twice, for memory; few-row matmuls then run MKL's slower kernel, see
    :func:`~aiayn.inference.precision.pack_linears`). Raises ``FileNotFoundError`` naming the path when there is nothing
    to load there, ``ValueError`` when the weights do not match the config or for an unknown
    ``dtype``/``quantize``, and ``RuntimeError`` when int8 is asked for and torch lacks the kernel.
    """
    torch_dtype = parse_dtype(dtype)
    quantize = parse_quantize(quantize)
    _check_pack(pack)  # before any file is read
    directory = Path(path)
    if not directory.exists():
        raise FileNotFoundError(f"no model at {directory}: no such directory")
    directory = model_dir(directory)
    config_file = directory / CONFIG_FILE
    if not config_file.exists():  # a FIFO or folder of that name is refused by the reader, naming it
        raise FileNotFoundError(f"{directory} holds {MODEL_FILE} but no {CONFIG_FILE}")
    raw = read_json_file(config_file, what="model config")  # bounded: size, depth, a regular file
    try:
        config = config_from_dict(raw)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ValueError(f"{config_file}: not a valid model config ({e})") from None
    from aiayn.checkpoint.sharded import is_sharded, read_sharded_model_state  # DCP only when needed

    sharded = is_sharded(directory)
    stored = _stored_quantization(directory)
    if not sharded and stored is None:  # quantised and DCP files hold other tensors than the fp32 model
        check_config_backed(config, directory / MODEL_FILE)
    model = model_class(config)(config)
    if stored is not None:
        quantize_model(model, stored)  # the int8/int4 layout (checks the kernel), then the stored codes and scales fill it
    if sharded:  # a train.parallel=fsdp checkpoint: DCP shards, read whole
        read_sharded_model_state(directory, model)
    else:
        state, _ = read_safetensors(directory / MODEL_FILE)
        load_state_dict_checked(model, state, source=str(directory / MODEL_FILE))
    prepare_for_inference(model, device=device, dtype=torch_dtype, quantize=None if stored is not None else quantize, pack=pack)
    src_tok = tgt_tok = None
    if any((directory / f"{prefix}{name}").is_file() for prefix in ("", "src_") for name in _TOKENIZER_NAMES):
        src_tok, tgt_tok = load_tokenizer_pair(directory)
        # Refused here, naming both sizes: a larger tokenizer would index past the embedding table.
        check_tokenizer_fits(src_tok, config.vocab_size, f"{config_file}: vocab_size")
        check_tokenizer_fits(tgt_tok, getattr(config, "target_vocab_size", config.vocab_size), f"{config_file}: target vocab_size")
    return Pretrained(model, config, src_tok, tgt_tok, directory, label_names(directory), saved_decode(directory))


def own_files(directory: Path) -> dict[str, bytes]:
    """What ``directory`` says of its model beyond weights, config and tokenizers (its training config, with the
    decode settings; its class names), for a converted copy (``aiayn quantize``, a consolidated FSDP checkpoint)."""
    return {name: read_untrusted_bytes(directory / name, what=name) for name in (TRAIN_CONFIG_FILE, LABELS_FILE)
            if (directory / name).is_file()}


def saved_decode(directory: Path) -> DecodeSection:
    """The beam search settings the model's recipe chose (the ``decode`` section of the ``train_config.yaml``
    saved beside its weights), else the paper's. Only that section is read: the rest of a saved config
    (an older version's keys, another machine's paths) does not keep a model from loading.
    Raises ``ValueError``/``TypeError`` naming the file for a ``decode`` section that is not valid."""
    file = directory / TRAIN_CONFIG_FILE
    if not file.is_file():
        return DecodeSection()
    data = read_yaml(file)
    if not isinstance(data, dict) or data.get("decode") is None:
        return DecodeSection()
    try:
        return from_dict(DecodeSection, data["decode"], path="decode")  # the messages a recipe gets
    except (ValueError, TypeError) as e:
        raise type(e)(f"{file}: {e}") from e


def prepare_for_inference(
    model: nn.Module,
    *,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype | None = None,
    quantize: str | None = None,
    pack: bool = True,
    huge_pages: bool | None = None,
) -> nn.Module:
    """Quantise (from the fp32 weights), fuse the projections that share an input, cast once, move, set eval mode,
    put the weights on transparent huge pages (``huge_pages``: ``None`` where timed faster on this machine,
    :func:`~aiayn.inference.kernel_choice.choose_huge_pages`; the CPU only) and (``pack``) pack the Linear weights for
    oneDNN: the precision step of every loader."""
    torch_dtype, quantize = parse_dtype(dtype), parse_quantize(quantize)
    _check_pack(pack)
    if huge_pages is not None and not isinstance(huge_pages, bool):  # 1 == True: `in (None, True, False)` would take it
        raise TypeError(f"huge_pages must be None (timed on this machine), True or False, got {huge_pages!r}")
    if huge_pages and (reason := huge_pages_reason()) is not None:
        raise ValueError(f"huge_pages=True: {reason}; use huge_pages=None (decided here) or False")
    if quantize is not None:
        quantize_model(model, quantize)  # from the fp32 weights, before any cast; checks the kernel
    fuse_projections(model)  # Q/K/V (and SwiGLU's gate/up) as one layer each; the same checkpoint keys
    model.to(device).eval()
    if torch_dtype is not None:
        if torch_dtype == torch.bfloat16 and not native_bf16(torch.device(device)):
            log.warning("dtype=bfloat16 on a %s without native bf16 matmuls (no AMX or AVX512-BF16): it runs, but "
                        "may be many times slower than float32 here for several rows at once (prompts, batches, evaluation); "
                        "one-row decoding can be faster (docs/benchmarks.md)", torch.device(device).type)
        cast_model(model, torch_dtype)  # once: no step re-casts a weight
    if torch.device(device).type == "cpu" and (choose_huge_pages() if huge_pages is None else huge_pages):
        place_on_huge_pages(model)  # before packing: oneDNN's packed copies are its own memory
    if pack:
        pack_linears(model)  # on the CPU: weights also in oneDNN's layout, once
    choose_model_attention(model)  # on the CPU: the faster backend of one-query attention here, timed once
    if torch.device(device).type == "cpu":
        use_native_norms(model)  # our LayerNorm/RMSNorm kernel where timed faster here (the C++ step calls it too)
    return model


def _check_pack(pack: object) -> None:
    """``TypeError`` naming ``pack`` unless it is a bool (a string such as ``"no"`` would be truthy)."""
    if not isinstance(pack, bool):
        raise TypeError(f"pack must be True or False, got {pack!r}")


def _stored_quantization(directory: Path) -> str | None:
    """The quantisation method a model directory was saved with, or ``None``; ``ValueError`` for an unknown one."""
    file = directory / QUANTIZATION_FILE
    if not file.is_file():
        return None
    record = read_json_file(file, what="quantization record")
    stored = tuple(q for q in QUANTIZATIONS if q != "none")
    if not isinstance(record, dict) or record.get("method") not in stored:
        got = record.get("method") if isinstance(record, dict) else record
        raise ValueError(f"{file}: method must be one of {', '.join(stored)} (the stored quantisations), got {got!r}")
    return str(record["method"])


def label_names(directory: Path) -> list[str] | None:
    """The class names a directory knows: ``labels.json`` (classification training writes it), else
    the ``id2label`` of an imported Hugging Face config (``hf_source.json``)."""
    file = directory / LABELS_FILE
    if file.exists():
        names = read_json_file(file, what="labels file", expect=dict).get("labels")
        if not isinstance(names, list) or not all(isinstance(n, (str, int)) for n in names):
            raise ValueError(f"{file}: expected {{\"labels\": [name of class 0, name of class 1, ...]}}, got labels={names!r:.80}")
        return [str(n) for n in names]
    config = hf_source_config(directory)
    return id2label_names(config) if config is not None else None


def hf_source_config(directory: Path) -> dict[str, Any] | None:
    """The original Hugging Face ``config.json`` an imported directory records in ``hf_source.json``
    (``aiayn convert``), or ``None`` without one."""
    source = directory / "hf_source.json"
    if not source.exists():
        return None
    config = read_json_file(source, what="Hugging Face source record", expect=dict).get("config")
    return config if isinstance(config, dict) else None


def id2label_names(hf_config: dict) -> list[str] | None:
    """A Hugging Face config's ``id2label`` as a list in id order (``None`` without one)."""
    id2label = hf_config.get("id2label")
    if not isinstance(id2label, dict) or not id2label:
        return None
    try:
        return [str(id2label[k]) for k in sorted(id2label, key=int)]
    except (ValueError, TypeError):
        return None
