"""Training losses that return a sum and a token count, so callers normalise by tokens.

With gradient accumulation or several data-parallel ranks the right loss is the sum over all tokens
divided by the total count; a per-batch mean weights short batches too much. Every loss here returns
``TokenLoss(sum, count)``; divide ``sum`` by ``count`` (summed over micro-batches and ranks).

Label smoothing (section 5.4, eps = 0.1) uses ``F.cross_entropy``'s: the target distribution is
``(1 - eps) * one_hot + eps / V`` over all ``V`` classes. The Annotated Transformer spreads eps over
``V - 2`` classes instead (neither the target nor padding); the two differ by a constant and a little
mass on the padding class.

Shapes: B batch, T target length, V vocabulary, C classes.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.data.batch import IGNORE_INDEX  # the one definition, beside the batches that carry it

__all__ = ["TokenLoss", "label_smoothed_cross_entropy", "masked_lm_loss", "classification_loss", "IGNORE_INDEX"]


class TokenLoss(NamedTuple):
    """Summed loss (a 0-dim float tensor) and the number of counted tokens (a 0-dim int64 tensor)."""

    sum: Tensor
    count: Tensor  # type: ignore[assignment]  # shadows tuple.count on purpose: loss.sum / loss.count


def label_smoothed_cross_entropy(logits: Tensor, targets: Tensor, *, pad_id: int, smoothing: float = 0.1) -> TokenLoss:
    """Cross-entropy of ``(B, T, V)`` logits against ``(B, T)`` targets, skipping ``pad_id`` targets.

    Raises ``ValueError`` for mismatched shapes or ``smoothing`` outside [0, 1), ``TypeError`` for
    non-integer targets.
    """
    return _token_cross_entropy(logits, targets, ignore_index=pad_id, smoothing=smoothing)


def masked_lm_loss(logits: Tensor, labels: Tensor, *, smoothing: float = 0.0) -> TokenLoss:
    """Masked-LM loss of ``(B, T, V)`` logits; ``(B, T)`` labels are ``IGNORE_INDEX`` where nothing is predicted."""
    return _token_cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, smoothing=smoothing)


def classification_loss(logits: Tensor, labels: Tensor, *, smoothing: float = 0.0) -> TokenLoss:
    """Cross-entropy of ``(B, C)`` logits against ``(B,)`` labels (``IGNORE_INDEX`` skips an example)."""
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape (B, C), got shape {tuple(logits.shape)}")
    if labels.shape != logits.shape[:1]:
        raise ValueError(f"labels must have shape (B,) = {tuple(logits.shape[:1])}, got shape {tuple(labels.shape)}")
    return _cross_entropy_sum(logits, labels, ignore_index=IGNORE_INDEX, smoothing=smoothing)


def _token_cross_entropy(logits: Tensor, targets: Tensor, *, ignore_index: int, smoothing: float) -> TokenLoss:
    if logits.dim() != 3:
        raise ValueError(f"logits must have shape (B, T, V), got shape {tuple(logits.shape)}")
    if targets.shape != logits.shape[:2]:
        raise ValueError(
            f"targets must have shape (B, T) = {tuple(logits.shape[:2])}, got shape {tuple(targets.shape)}"
        )
    vocab = logits.shape[-1]
    flat_logits, flat_targets = logits.reshape(-1, vocab), targets.reshape(-1)  # (B*T, V), (B*T,)
    return _cross_entropy_sum(flat_logits, flat_targets, ignore_index=ignore_index, smoothing=smoothing)


def _cross_entropy_sum(logits: Tensor, targets: Tensor, *, ignore_index: int, smoothing: float) -> TokenLoss:
    """(N, V) logits, (N,) targets -> summed loss and count of targets != ignore_index."""
    if targets.dtype.is_floating_point or targets.dtype == torch.bool or targets.dtype.is_complex:
        raise TypeError(f"targets must be an integer tensor, got dtype {targets.dtype}")
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()  # log-softmax over a large vocabulary loses too much in 16 bits
    loss = F.cross_entropy(
        logits, targets.long(), ignore_index=ignore_index, label_smoothing=smoothing, reduction="sum"
    )
    count = (targets != ignore_index).sum()
    return TokenLoss(loss, count)
