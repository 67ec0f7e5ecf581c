"""Validation during training: loss, and perplexity (accuracy for classifiers), over fixed batches."""

from __future__ import annotations

import math
from contextlib import AbstractContextManager
from typing import Any, Callable

import torch

from aiayn.data import ClassificationBatch
from aiayn.training.objectives import Objective, accuracy_counts

__all__ = ["validate"]


@torch.no_grad()
def validate(
    objective: Objective,
    batches: list[Any],
    *,
    device: torch.device,
    autocast: Callable[[], AbstractContextManager[Any]],
    max_batches: int | None = None,
) -> dict[str, float]:
    """Token-weighted mean loss over ``batches`` (``val_loss``), and its ``val_ppl`` (LM, MLM, translation) or
    ``val_accuracy`` (classification)."""
    was_training = objective.training
    objective.eval()
    total, count, correct, seen = 0.0, 0, 0, 0
    for batch in batches[:max_batches]:
        batch = batch.to(device)
        with autocast():
            loss = objective(batch)
            if isinstance(batch, ClassificationBatch):
                right, n = accuracy_counts(objective.model, batch)
                correct, seen = correct + right, seen + n
        total += float(loss.sum)
        count += int(loss.count)
    objective.train(was_training)
    if count == 0:
        raise ValueError("validation data has no tokens to score")
    metrics = {"val_loss": total / count}
    if seen:  # a classifier: a perplexity over classes means nothing to a reader, accuracy does
        metrics["val_accuracy"] = correct / seen
    else:
        metrics["val_ppl"] = math.exp(min(metrics["val_loss"], 50.0))
    return metrics
