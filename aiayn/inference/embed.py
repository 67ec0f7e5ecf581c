"""Sentence embeddings from an encoder-only model: the hidden states of ``[CLS] text [SEP]`` pooled
(mean of the real tokens, the [CLS] state, or their max) and L2-normalised, as sentence-transformers'
``encode`` does. A directory with sentence-transformers' files (``modules.json``, ``1_Pooling/config.json``,
a ``Normalize`` module, ``sentence_bert_config.json``) says its own pooling; other models pool with the mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.decoding.protocol import right_pad
from aiayn.models.encoder_only import EncoderOnly
from aiayn.tokenization.base import Tokenizer
from aiayn.tokenization.special import sentence_ids
from aiayn.untrusted import read_json_file
from aiayn.validation import check_choice, check_int, rule

__all__ = ["POOLINGS", "Pooling", "embed_ids", "embed_texts", "embedding_pooling", "read_sentence_transformers", "sentence_rows"]

POOLINGS = ("mean", "cls", "max")
MODULES_FILE = "modules.json"
# sentence-transformers' legacy pooling flags (1_Pooling/config.json before v5) -> our mode
_LEGACY_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean", "pooling_mode_max_tokens": "max",
                 "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens": "weightedmean",
                 "pooling_mode_lasttoken": "lasttoken"}


@dataclass(frozen=True)
class Pooling:
    """How hidden states ``(B, T, D)`` become one vector ``(B, D)``: ``mode`` (``mean`` of the real tokens,
    the ``cls`` state, the ``max`` over the real tokens), ``normalize`` (to unit L2 length), ``max_tokens``
    (longer inputs are cut to it, [CLS] and [SEP] included; ``None``: the model's context) and ``source``
    (the file it was read from, or ``"default"``)."""

    mode: str = "mean"
    normalize: bool = True
    max_tokens: int | None = None
    source: str = "default"

    def __post_init__(self) -> None:
        check_choice("pooling", self.mode, POOLINGS)
        rule(isinstance(self.normalize, bool), "normalize", self.normalize, "must be True or False")
        if self.max_tokens is not None:
            check_int("max_tokens", self.max_tokens, minimum=3)  # [CLS] one token [SEP]


def embedding_pooling(
    model: EncoderOnly, directory: Path | None = None, *, pooling: str | None = None, normalize: bool | None = None,
) -> Pooling:
    """The pooling of ``model``: sentence-transformers' files in ``directory`` where it has them, else the mean,
    normalised; ``pooling`` / ``normalize`` override either. ``max_tokens`` is at most the model's context."""
    found = read_sentence_transformers(directory) if directory is not None else None
    chosen = found or Pooling()
    if pooling is not None:
        check_choice("pooling", pooling, POOLINGS)
        chosen = replace(chosen, mode=pooling)
    if normalize is not None:
        chosen = replace(chosen, normalize=normalize)
    context = model.config.max_len
    return replace(chosen, max_tokens=context if chosen.max_tokens is None else min(chosen.max_tokens, context))


def read_sentence_transformers(directory: Path) -> Pooling | None:
    """The pooling that sentence-transformers' ``modules.json`` describes for the model in ``directory`` (``None``
    without one): the file in ``directory``, or in its parent when that names ``directory`` as its Transformer
    module (the older layout, ``0_Transformer/``).

    Reads the old (``pooling_mode_mean_tokens: true``) and new (``pooling_mode: "mean"``) pooling files.
    Raises ``ValueError`` naming the file for a module or pooling mode this library does not run
    (``Dense``, ``weightedmean``, several modes at once...), rather than return other vectors than theirs.
    """
    root: Path = directory
    model_path: tuple[str, ...] = ("", ".")  # what modules.json's Transformer path may say
    if not (directory / MODULES_FILE).is_file():
        root, model_path = directory.parent, (directory.name,)
        if not (root / MODULES_FILE).is_file() or directory.name not in _module_paths(root / MODULES_FILE, "Transformer"):
            return None
    file = root / MODULES_FILE
    mode, normalize = None, False
    for module in _modules(file):
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if kind == "Transformer":
            rule(module.get("path", "") in model_path, f"{file}: Transformer path", module.get("path"),
                 f"must name the model directory {directory}; load the directory that holds the model")
        elif kind == "Pooling":
            mode = _pooling_mode(root / str(module.get("path", "")) / "config.json")
        elif kind == "Normalize":
            normalize = True
        else:
            raise ValueError(f"{file}: module type {module.get('type')!r} is not supported: aiayn embeds with a "
                             "Transformer, a Pooling and an optional Normalize module only")
    if mode is None:
        raise ValueError(f"{file}: has no Pooling module, so it does not say how to pool the token states into one vector")
    return Pooling(mode, normalize, _max_seq_length(directory), source=str(file))


def _modules(file: Path) -> list[dict[str, Any]]:
    modules = _read_json(file)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ValueError(f"{file}: must be a JSON list of modules (objects with 'type' and 'path')")
    return modules


def _module_paths(file: Path, kind: str) -> list[str]:
    return [str(m.get("path", "")) for m in _modules(file) if str(m.get("type", "")).rsplit(".", 1)[-1] == kind]


def _pooling_mode(file: Path) -> str:
    config = _read_json(file)
    if not isinstance(config, dict):
        raise ValueError(f"{file}: must be a JSON object (sentence-transformers' pooling config)")
    given = config.get("pooling_mode", [mode for key, mode in _LEGACY_MODES.items() if config.get(key)])
    modes = [given] if isinstance(given, str) else list(given)
    if len(modes) != 1 or modes[0] not in POOLINGS:
        raise ValueError(f"{file}: pooling mode {given!r} is not supported: aiayn pools with one of {POOLINGS}")
    return str(modes[0])


def _max_seq_length(directory: Path) -> int | None:
    """sentence-transformers' truncation length: ``sentence_bert_config.json`` (before v5), else the tokenizer's."""
    for name, key in (("sentence_bert_config.json", "max_seq_length"), ("tokenizer_config.json", "model_max_length")):
        file = directory / name
        value = _read_json(file).get(key) if file.is_file() else None
        if isinstance(value, int) and not isinstance(value, bool) and 3 <= value < 1_000_000:  # 1e30: "no limit"
            return value
    return None


def _read_json(file: Path) -> Any:
    """A sentence-transformers file of the (untrusted) model directory, through the bounded reader."""
    return read_json_file(file, what="sentence-transformers file (modules.json names it)")


def sentence_rows(tokenizer: Tokenizer, token_ids: Sequence[Sequence[int]], max_tokens: int | None) -> list[list[int]]:
    """``[CLS] ids [SEP]`` per row (the tokenizer's own special ids), cut to ``max_tokens`` as sentence-transformers cuts."""
    cls, sep, _ = sentence_ids(tokenizer)
    keep = None if max_tokens is None else max_tokens - 2
    return [[cls, *list(ids)[:keep], sep] for ids in token_ids]


def pool(hidden: Tensor, mask: Tensor, mode: str) -> Tensor:
    """Hidden states ``(B, T, D)`` and ``mask`` bool ``(B, T)`` (``True`` = real token) -> ``(B, D)`` in float32."""
    hidden = hidden.float()
    if mode == "cls":
        return hidden[:, 0]  # right padding: [CLS] is first
    if mode == "max":
        return hidden.masked_fill(~mask[..., None], float("-inf")).amax(dim=1)
    weights = mask.to(hidden.dtype)[..., None]  # (B, T, 1)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)


@torch.inference_mode()
def embed_ids(model: EncoderOnly, ids: Tensor, mask: Tensor, pooling: Pooling) -> Tensor:
    """One batch: ``ids (B, T)`` of ``[CLS] ... [SEP]`` rows and their ``mask`` -> embeddings ``(B, D)``, float32."""
    vectors = pool(model(ids, mask), mask, pooling.mode)
    return F.normalize(vectors, p=2, dim=1) if pooling.normalize else vectors


def embed_texts(
    model: EncoderOnly, tokenizer: Tokenizer, texts: Sequence[str], pooling: Pooling, *, batch_size: int = 32,
    device: torch.device | str | None = None,
) -> Tensor:
    """Embeddings ``(N, D)`` (float32, on the CPU) of ``texts``, in their order; texts of similar length are
    batched together (fewer pads), ``batch_size`` at a time. Raises ``ValueError`` for ``batch_size < 1``."""
    check_int("batch_size", batch_size, minimum=1)
    _, _, pad = sentence_ids(tokenizer)
    rows = sentence_rows(tokenizer, tokenizer.encode_batch(list(texts)), pooling.max_tokens)
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
    out = torch.empty(len(rows), model.config.d_model)
    for start in range(0, len(order), batch_size):
        chosen = order[start : start + batch_size]
        ids, mask = right_pad([rows[i] for i in chosen], pad, device=device)
        out[chosen] = embed_ids(model, ids, mask, pooling).cpu()
    return out
