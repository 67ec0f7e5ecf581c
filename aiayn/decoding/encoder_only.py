"""Inference with the encoder-only family: fill masked tokens, classify sentences.

Inputs follow the training format of :mod:`aiayn.data.sentences`: ``[CLS] text [SEP]``, padded on
the right; ``pad_mask`` is bool, ``True`` = real token (default: ``ids != pad_id``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from aiayn.decoding.protocol import right_pad
from aiayn.models.encoder_only import EncoderOnly
from aiayn.tokenization.base import N_SPECIAL, Tokenizer
from aiayn.tokenization.special import MASK, MASK_ID, sentence_ids, special_ids

__all__ = ["MaskPrediction", "Classification", "fill_mask", "classify", "encode_sentences", "encode_masked_text", "sentence_ids"]


@dataclass(frozen=True)
class MaskPrediction:
    """Candidates for the mask token at ``position``: ``token_ids`` with their ``probs``, most likely first."""

    position: int
    token_ids: list[int]
    probs: list[float]


@dataclass
class Classification:
    """``labels (B,)``: the most likely class of each row; ``probs (B, n_classes)``."""

    labels: Tensor
    probs: Tensor


@torch.no_grad()
def fill_mask(
    model: EncoderOnly,
    ids: Tensor,
    pad_mask: Tensor | None = None,
    *,
    top_k: int = 5,
    mask_id: int = MASK_ID,
    allow_special: bool = False,
    special: Sequence[int] | None = None,
) -> list[list[MaskPrediction]]:
    """The ``top_k`` candidates for every ``mask_id`` in ``ids (B, T)``: per row, one prediction per mask, left to right.

    Probabilities are over the whole vocabulary; special tokens (``special``, default our ids
    ``0..6``) are not offered as candidates unless ``allow_special``. Raises ``ValueError`` for
    ``top_k < 1`` or a model without a masked-LM head.
    """
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if not model.config.mlm_head:
        raise ValueError("this model has no masked-LM head (config.mlm_head=False): it cannot fill masks")
    hidden = model(ids, pad_mask)  # (B, T, D)
    is_mask = ids == mask_id
    if pad_mask is not None:
        is_mask &= pad_mask
    rows, cols = is_mask.nonzero(as_tuple=True)  # (M,), (M,) in row-major order
    probs = model.masked_lm_logits(hidden[rows, cols]).float().softmax(dim=-1)  # (M, V): only the masks
    excluded = torch.tensor(list(range(N_SPECIAL)) if special is None else sorted(set(special)), dtype=torch.long, device=probs.device)
    ranked = probs if allow_special else probs.index_fill(-1, excluded, -1.0)
    top = ranked.topk(min(top_k, probs.shape[-1] - (0 if allow_special else len(excluded))), dim=-1)
    out: list[list[MaskPrediction]] = [[] for _ in range(ids.shape[0])]
    for row, col, token_ids, token_probs in zip(rows.tolist(), cols.tolist(), top.indices.tolist(), top.values.tolist()):
        out[row].append(MaskPrediction(col, token_ids, token_probs))
    return out


@torch.no_grad()
def classify(model: EncoderOnly, ids: Tensor, pad_mask: Tensor | None = None, segment_ids: Tensor | None = None) -> Classification:
    """Classify ``ids (B, T)`` from the pooled output ([CLS] or the mean of the real tokens). Raises ``ValueError`` for a model without a classifier."""
    if not model.config.n_classes:
        raise ValueError("this model has no classification head (config.n_classes=0): it cannot classify")
    if pad_mask is None and model.config.pad_id is not None:
        pad_mask = ids != model.config.pad_id  # what the model derives too; mean pooling needs it
    probs = model.classification_logits(model(ids, pad_mask, segment_ids), pad_mask).float().softmax(dim=-1)  # (B, C)
    return Classification(probs.argmax(dim=-1), probs)


def encode_sentences(tokenizer: Tokenizer, texts: Sequence[str], *, pad_id: int | None = None) -> tuple[Tensor, Tensor]:
    """``[CLS] text [SEP]`` for each text (the tokenizer's own ids), right-padded with ``pad_id``
    (default: the tokenizer's) -> ``(ids (B, T), pad_mask (B, T))``."""
    cls, sep, pad = sentence_ids(tokenizer)
    return right_pad([[cls, *tokenizer.encode(text), sep] for text in texts], pad if pad_id is None else pad_id)


def encode_masked_text(tokenizer: Tokenizer, text: str, *, mask_token: str | None = None) -> list[int]:
    """``[CLS] text [SEP]`` with every ``mask_token`` in ``text`` encoded as the tokenizer's mask id.

    ``mask_token`` defaults to the tokenizer's own spelling (``<mask>``, BERT's ``[MASK]``). The
    pieces between masks are encoded separately, so the tokenizer never sees the mask's spelling.
    """
    cls, sep, _ = sentence_ids(tokenizer)
    mask_id = special_ids(tokenizer).need("mask", "filling masks")
    mask_token = mask_token or tokenizer.id_to_token(mask_id) or MASK
    ids = [cls]
    for i, piece in enumerate(text.split(mask_token)):
        if i:
            ids.append(mask_id)
        ids.extend(tokenizer.encode(piece) if piece else [])
    return [*ids, sep]
