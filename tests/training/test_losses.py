"""losses: label-smoothed cross-entropy against a hand-written KL reference, masked-LM, classification."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from aiayn.training.losses import classification_loss, label_smoothed_cross_entropy, masked_lm_loss

PAD = 0


def _batch(seed: int = 0, b: int = 3, t: int = 6, v: int = 7) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, t, v, generator=g, dtype=torch.float64) * 3
    targets = torch.randint(1, v, (b, t), generator=g)
    targets[0, 4:] = PAD
    targets[2, 1:] = PAD
    return logits, targets


def _smoothed_kl_reference(logits: Tensor, targets: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(sum over non-pad tokens of KL(q || softmax(logits)), entropy of q) with q = (1-eps) one-hot + eps/V."""
    v = logits.shape[-1]
    flat_logits, flat_targets = logits.reshape(-1, v), targets.reshape(-1)
    q = torch.full_like(flat_logits, eps / v)
    q[torch.arange(len(flat_targets)), flat_targets] += 1 - eps
    log_p = flat_logits - flat_logits.logsumexp(-1, keepdim=True)
    kl = (q * (q.log() - log_p)).sum(-1)
    keep = flat_targets != PAD
    entropy = -(q[0] * q[0].log()).sum()  # the same for every token
    return kl[keep].sum(), entropy


def test_label_smoothing_equals_kl_to_the_smoothed_target_plus_its_entropy() -> None:
    logits, targets = _batch()
    logits.requires_grad_(True)
    loss = label_smoothed_cross_entropy(logits, targets, pad_id=PAD, smoothing=0.1)
    kl, entropy = _smoothed_kl_reference(logits, targets, 0.1)
    n_real = int((targets != PAD).sum())
    assert loss.count.dtype == torch.int64 and int(loss.count) == n_real == 11
    assert torch.allclose(loss.sum, kl + n_real * entropy, rtol=0, atol=1e-12)
    (grad,) = torch.autograd.grad(loss.sum, logits)
    (ref_grad,) = torch.autograd.grad(kl, logits)
    assert torch.allclose(grad, ref_grad, rtol=0, atol=1e-14)


def test_padding_positions_change_nothing_and_get_no_gradient() -> None:
    logits, targets = _batch(seed=1)
    other = logits.clone()
    other[targets == PAD] = torch.randn(int((targets == PAD).sum()), logits.shape[-1], dtype=torch.float64) * 100
    other.requires_grad_(True)
    a = label_smoothed_cross_entropy(logits, targets, pad_id=PAD)
    b = label_smoothed_cross_entropy(other, targets, pad_id=PAD)
    assert torch.equal(a.sum, b.sum) and torch.equal(a.count, b.count)
    (grad,) = torch.autograd.grad(b.sum, other)
    assert torch.equal(grad[targets == PAD], torch.zeros_like(grad[targets == PAD]))


def test_without_smoothing_it_is_the_negative_log_likelihood() -> None:
    logits, targets = _batch(seed=2)
    loss = label_smoothed_cross_entropy(logits, targets, pad_id=PAD, smoothing=0.0)
    log_p = logits.log_softmax(-1).gather(-1, targets[..., None])[..., 0]
    assert torch.allclose(loss.sum, -log_p[targets != PAD].sum(), rtol=0, atol=1e-12)


def test_all_padding_gives_zero_sum_and_zero_count() -> None:
    logits, _ = _batch()
    loss = label_smoothed_cross_entropy(logits, torch.zeros(3, 6, dtype=torch.long), pad_id=PAD)
    assert float(loss.sum) == 0.0 and int(loss.count) == 0


def test_masked_lm_ignores_minus_100() -> None:
    logits, targets = _batch(seed=3)
    labels = targets.clone()
    labels[targets == PAD] = -100  # padding
    labels[1, :3] = -100  # unmasked tokens
    labels[0, 0] = PAD  # a real prediction of the pad token id is counted
    loss = masked_lm_loss(logits, labels)
    keep = labels != -100
    log_p = logits.log_softmax(-1).gather(-1, labels.clamp(min=0)[..., None])[..., 0]
    assert int(loss.count) == int(keep.sum())
    assert torch.allclose(loss.sum, -log_p[keep].sum(), rtol=0, atol=1e-12)


def test_classification_loss_sum_and_count() -> None:
    logits = torch.randn(4, 3, dtype=torch.float64)
    labels = torch.tensor([0, 2, -100, 1])
    loss = classification_loss(logits, labels)
    log_p = logits.log_softmax(-1)
    expected = -(log_p[0, 0] + log_p[1, 2] + log_p[3, 1])
    assert int(loss.count) == 3 and torch.allclose(loss.sum, expected, rtol=0, atol=1e-12)


def test_half_precision_logits_are_reduced_in_float32() -> None:
    logits, targets = _batch(seed=4)
    half = logits.to(torch.bfloat16)
    loss = label_smoothed_cross_entropy(half, targets, pad_id=PAD)
    reference = label_smoothed_cross_entropy(half.float(), targets, pad_id=PAD)
    assert loss.sum.dtype == torch.float32 and torch.equal(loss.sum, reference.sum)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: label_smoothed_cross_entropy(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), pad_id=0), ValueError, r"logits must have shape \(B, T, V\), got shape \(2, 3\)"),
        (lambda: label_smoothed_cross_entropy(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long), pad_id=0), ValueError, r"targets must have shape \(B, T\) = \(2, 3\), got shape \(2, 4\)"),
        (lambda: label_smoothed_cross_entropy(torch.zeros(2, 3, 4), torch.zeros(2, 3), pad_id=0), TypeError, r"targets must be an integer tensor, got dtype torch.float32"),
        (lambda: label_smoothed_cross_entropy(torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.long), pad_id=0, smoothing=1.0), ValueError, r"smoothing must be in \[0, 1\), got 1.0"),
        (lambda: masked_lm_loss(torch.zeros(2, 3, 4), torch.zeros(3, 2, dtype=torch.long)), ValueError, r"targets must have shape \(B, T\) = \(2, 3\), got shape \(3, 2\)"),
        (lambda: classification_loss(torch.zeros(2, 3, 4), torch.zeros(2, dtype=torch.long)), ValueError, r"logits must have shape \(B, C\), got shape \(2, 3, 4\)"),
        (lambda: classification_loss(torch.zeros(2, 3), torch.zeros(3, dtype=torch.long)), ValueError, r"labels must have shape \(B,\) = \(2,\), got shape \(3,\)"),
    ],
)  # fmt: skip
def test_bad_inputs_name_shapes_and_dtypes(call, error: type[Exception], message: str) -> None:  # noqa: ANN001
    with pytest.raises(error, match=message):
        call()
