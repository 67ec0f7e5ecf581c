"""The training objective: one module whose ``forward(batch)`` picks the loss by the batch's type, so that
DDP and ``torch.compile`` wrap a single forward for every task."""

from __future__ import annotations

from torch import Tensor, nn

from aiayn.data import IGNORE_INDEX, ClassificationBatch, LMBatch, MLMBatch, TranslationBatch
from aiayn.tokenization.special import PAD_ID
from aiayn.training.losses import TokenLoss, classification_loss, label_smoothed_cross_entropy, masked_lm_loss

__all__ = ["Objective", "loss_count", "seq2seq_loss", "target_count"]


class Objective(nn.Module):
    """``forward(batch) -> TokenLoss(sum, count)`` for the ``task`` the batch belongs to."""

    def __init__(self, model: nn.Module, task: str, *, label_smoothing: float = 0.0) -> None:
        super().__init__()
        self.model, self.task, self.label_smoothing = model, task, label_smoothing

    def forward(self, batch: TranslationBatch | LMBatch | MLMBatch | ClassificationBatch) -> TokenLoss:
        eps = self.label_smoothing
        if isinstance(batch, TranslationBatch):
            logits = self.model(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask)  # (B, T, V)
            # Padding is where tgt_mask is False, whatever its id (Marian's EOS is 0, our pad id).
            targets = batch.tgt_out.masked_fill(~batch.tgt_mask, IGNORE_INDEX)
            return label_smoothed_cross_entropy(logits, targets, pad_id=IGNORE_INDEX, smoothing=eps)
        if isinstance(batch, LMBatch):
            logits = self.model(batch.input)  # (B, T, V); windows have no padding
            return label_smoothed_cross_entropy(logits, batch.target, pad_id=IGNORE_INDEX, smoothing=eps)
        if isinstance(batch, MLMBatch):
            hidden = self.model(batch.input, batch.pad_mask, batch.segment_ids)  # (B, T, D)
            # Vocabulary logits only where a token is predicted (~15%): the projection is most of the work.
            predicted = batch.labels != IGNORE_INDEX  # (B, T)
            logits = self.model.masked_lm_logits(hidden[predicted])  # type: ignore[operator]  # (N, V); EncoderOnly's head, seen through nn.Module
            return masked_lm_loss(logits[None], batch.labels[predicted][None], smoothing=eps)
        if isinstance(batch, ClassificationBatch):
            hidden = self.model(batch.input, batch.pad_mask)
            return classification_loss(self.model.classification_logits(hidden, batch.pad_mask), batch.labels, smoothing=eps)  # type: ignore[operator]  # as above
        raise TypeError(f"unknown batch type {type(batch).__name__}")


def loss_count(batch: TranslationBatch | LMBatch | MLMBatch | ClassificationBatch) -> int:
    """How many targets the loss of ``batch`` sums over, known before the forward pass."""
    if isinstance(batch, ClassificationBatch):
        return batch.labels.numel()
    return batch.n_tokens


def accuracy_counts(model: nn.Module, batch: ClassificationBatch) -> tuple[int, int]:
    """(correct, total) predictions of a classifier on ``batch``."""
    logits: Tensor = model.classification_logits(model(batch.input, batch.pad_mask), batch.pad_mask)  # type: ignore[operator]  # as above
    return int((logits.argmax(-1) == batch.labels).sum()), batch.labels.numel()


def seq2seq_loss(model: nn.Module, batch: tuple[Tensor, Tensor, Tensor], smoothing: float = 0.0) -> TokenLoss:
    """The loss of an encoder-decoder on a plain ``(src (B, S), tgt_in (B, T), tgt_out (B, T))`` batch,
    the form the copy task and the labs use (their masks come from ``pad_id``)."""
    src, tgt_in, tgt_out = batch
    return label_smoothed_cross_entropy(model(src, tgt_in), tgt_out, pad_id=PAD_ID, smoothing=smoothing)


def target_count(batch: tuple[Tensor, Tensor, Tensor]) -> int:
    """How many non-pad targets a ``(src, tgt_in, tgt_out)`` batch has (:func:`seq2seq_loss` sums over them)."""
    return int((batch[2] != PAD_ID).sum())
