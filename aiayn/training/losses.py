"""Training losses that return a sum and a token count, so callers normalise by tokens.

With gradient accumulation or several data-parallel ranks the right loss is the sum over all tokens
divided by the total count; a per-batch mean weights short batches too much. Every loss here returns
``TokenLoss(sum, count)``; divide ``sum`` by ``count`` (summed over micro-batches and ranks).

Label smoothing (section 5.4, eps = 0.1) uses ``F.cross_entropy``'s: the target distribution is
``(1 - eps) * one_hot + eps / V`` over all ``V`` classes. The Annotated Transformer spreads eps over
``V - 2`` classes instead (neither the target nor padding); the two differ by a constant and a little
mass on the padding class.

The cross-entropy is chunked over rows (:class:`ChunkedCrossEntropy`): each chunk of logits is cast
to fp32, reduced, and dropped, and the backward recomputes its softmax from the saved (maybe bf16)
logits, so neither fp32 logits nor an fp32 log-softmax of the whole batch is ever held. It equals
``F.cross_entropy`` (values and gradients, label smoothing and ignore_index; tests/training/test_losses.py). Where
our native library built, a kernel of ours computes the same a row at a time (``aiayn/inference/cross_entropy.cpp``),
chosen where it was timed faster (:func:`loss_kernel`).
Under ``torch.compile`` the plain ``F.cross_entropy`` is used instead: Inductor fuses it itself.

Shapes: B batch, T target length, V vocabulary, C classes, N rows.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.data.batch import IGNORE_INDEX  # the one definition, beside the batches that carry it

__all__ = ["TokenLoss", "ChunkedCrossEntropy", "cross_entropy_by", "loss_kernel", "label_smoothed_cross_entropy", "masked_lm_loss", "classification_loss", "IGNORE_INDEX"]


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
    count = (targets != ignore_index).sum()
    if not torch.compiler.is_compiling():
        return TokenLoss(cross_entropy_by(loss_kernel(logits), logits, targets.long(), ignore_index, smoothing), count)
    loss = F.cross_entropy(  # in fp32 for 16-bit logits: a log-softmax over a large vocabulary loses too much in 16 bits
        logits.to(_wide(logits.dtype)), targets.long(), ignore_index=ignore_index, label_smoothing=smoothing, reduction="sum"
    )
    return TokenLoss(loss, count)


def loss_kernel(logits: Tensor) -> str:
    """``native`` where our kernel (``aiayn/inference/cross_entropy.cpp``) computes the loss of these logits (fp32 or bf16
    on the CPU, timed faster here: :func:`aiayn.inference.kernel_choice.choose_native`), else ``torch``."""
    from aiayn.inference import kernel_choice  # here: kernel_choice's timing imports this module

    if logits.device.type != "cpu" or logits.dtype not in (torch.float32, torch.bfloat16):
        return "torch"
    return kernel_choice.choose_native("cross_entropy", logits.dtype)


def cross_entropy_by(kernel: str, logits: Tensor, targets: Tensor, ignore_index: int, smoothing: float) -> Tensor:
    """The summed loss of ``(N, V)`` logits against ``(N,)`` long targets (:class:`ChunkedCrossEntropy`), by ``kernel``:
    ``torch`` (its operators, a chunk of rows at a time) or ``native`` (our kernel, a row at a time)."""
    return ChunkedCrossEntropy.apply(logits, targets, ignore_index, smoothing, kernel == "native")


CHUNK_ELEMENTS = 2**20  # fp32 logits per chunk (4 MB, cache-sized); a row is never split


class ChunkedCrossEntropy(torch.autograd.Function):
    """``apply(logits (N, V), targets (N,) long, ignore_index, smoothing, native)`` -> the summed loss (fp32, 0-dim),
    ``F.cross_entropy(logits.float(), ..., reduction="sum")``'s value, a chunk of rows at a time.

    Row ``i`` costs ``(1 - eps) * (lse_i - x_iy) + eps * (lse_i - mean_j x_ij)`` (the smoothed target puts
    ``eps / V`` on every class); its gradient is ``softmax(x_i) - (1 - eps) * onehot(y_i) - eps / V``. Only
    the per-row log-sum-exp (N fp32 values) is saved beside the logits; the gradient has their dtype.
    ``native``: our kernel computes both a row at a time (fp32 or bf16 CPU logits; ``aiayn/inference/cross_entropy.cpp``),
    reading each row twice and widening none into a tensor: 2.7x faster than the chunks over GPT-2's vocabulary.
    """

    @staticmethod
    def forward(ctx: Any, logits: Tensor, targets: Tensor, ignore_index: int, smoothing: float, native: bool = False) -> Tensor:
        ctx.smoothing, ctx.ignore_index, ctx.native = smoothing, ignore_index, native
        if native:
            per_row, lse = torch.ops.aiayn_native.cross_entropy_rows(logits, targets, ignore_index, smoothing)
            ctx.save_for_backward(logits, targets, lse)
            return per_row.sum()
        n, vocab = logits.shape
        wide = _wide(logits.dtype)
        keep = targets != ignore_index  # (N,)
        safe = targets.masked_fill(~keep, 0)[:, None]  # (N, 1): any class for ignored rows, masked below
        lse = torch.empty(n, dtype=wide, device=logits.device)
        total = torch.zeros((), dtype=wide, device=logits.device)
        for rows in _chunks(n, vocab):
            x = logits[rows].to(wide)  # (r, V): the only fp32 copy, one chunk
            lse[rows] = torch.logsumexp(x, -1)
            picked = x.gather(1, safe[rows]).squeeze(1)
            per_row = lse[rows] - (1.0 - smoothing) * picked - (smoothing * x.mean(-1) if smoothing else 0.0)
            total += torch.where(keep[rows], per_row, 0.0).sum()
        ctx.save_for_backward(logits, targets, lse)
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None, None, None]:
        logits, targets, lse = ctx.saved_tensors
        eps, ignore_index = ctx.smoothing, ctx.ignore_index
        if ctx.native:
            return torch.ops.aiayn_native.cross_entropy_backward(grad, logits, targets, lse, ignore_index, eps), None, None, None, None
        n, vocab = logits.shape
        keep = targets != ignore_index
        safe = targets.masked_fill(~keep, 0)[:, None]
        grad_logits = torch.empty_like(logits)
        scale = torch.where(keep, grad.to(lse.dtype), 0.0)[:, None]  # (N, 1): ignored rows get no gradient
        for rows in _chunks(n, vocab):
            p = torch.exp(logits[rows].to(lse.dtype) - lse[rows, None])  # (r, V) softmax, recomputed
            if eps:
                p -= eps / vocab
            p.scatter_add_(1, safe[rows], torch.full_like(safe[rows], -(1.0 - eps), dtype=p.dtype))
            grad_logits[rows] = p * scale[rows]
        return grad_logits, None, None, None, None


def _wide(dtype: torch.dtype) -> torch.dtype:
    """The dtype the loss is reduced in: fp32 for 16-bit logits (a 16-bit log-softmax loses too much), else their own."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _chunks(n: int, vocab: int) -> list[slice]:
    step = max(1, CHUNK_ELEMENTS // max(vocab, 1))
    return [slice(start, min(start + step, n)) for start in range(0, n, step)]
