"""The chunked cross-entropy equals F.cross_entropy (values and gradients, label smoothing, ignore_index)
and never keeps fp32 logits (or their log-softmax) of the whole batch for the backward pass."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from aiayn.training import losses
from aiayn.training.losses import IGNORE_INDEX, ChunkedCrossEntropy, label_smoothed_cross_entropy


def _rows(seed: int, n: int = 37, v: int = 11, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, v, generator=g, dtype=torch.float64) * 4).to(dtype)
    targets = torch.randint(0, v, (n,), generator=g)
    targets[::5] = IGNORE_INDEX
    targets[3] = 2  # pad_id-style ignore_index below: a real class id that is ignored
    return logits, targets


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("ignore_index", [IGNORE_INDEX, 2])
def test_values_and_gradients_equal_f_cross_entropy_across_chunks(monkeypatch, smoothing, ignore_index):
    monkeypatch.setattr(losses, "CHUNK_ELEMENTS", 4 * 11)  # 4 rows a chunk: 10 chunks, the last one short
    logits, targets = _rows(seed=int(smoothing * 10) + ignore_index)
    targets[targets == IGNORE_INDEX] = ignore_index
    ours_in, ref_in = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    ours = ChunkedCrossEntropy.apply(ours_in, targets, ignore_index, smoothing)
    ref = F.cross_entropy(ref_in, targets, ignore_index=ignore_index, label_smoothing=smoothing, reduction="sum")
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)
    (ours * 0.7).backward()
    (ref * 0.7).backward()
    torch.testing.assert_close(ours_in.grad, ref_in.grad, rtol=0, atol=1e-14)
    assert torch.equal(ours_in.grad[targets == ignore_index], torch.zeros_like(ours_in.grad[targets == ignore_index]))


def test_gradcheck_in_float64(monkeypatch):
    monkeypatch.setattr(losses, "CHUNK_ELEMENTS", 3 * 5)
    logits, targets = _rows(seed=9, n=8, v=5)
    logits.requires_grad_()
    assert torch.autograd.gradcheck(lambda x: ChunkedCrossEntropy.apply(x, targets, IGNORE_INDEX, 0.1), (logits,))


def test_bf16_logits_match_f_cross_entropy_in_fp32_and_get_a_bf16_gradient(monkeypatch):
    monkeypatch.setattr(losses, "CHUNK_ELEMENTS", 8 * 50)
    logits, targets = _rows(seed=3, n=64, v=50, dtype=torch.bfloat16)
    ours_in, ref_in = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    ours = label_smoothed_cross_entropy(ours_in[None], targets[None], pad_id=IGNORE_INDEX, smoothing=0.1).sum
    ref = F.cross_entropy(ref_in.float(), targets, label_smoothing=0.1, reduction="sum")
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-4)
    ours.backward()
    ref.backward()
    assert ours_in.grad.dtype == torch.bfloat16
    torch.testing.assert_close(ours_in.grad, ref_in.grad, rtol=0, atol=0)  # both cast the same fp32 gradient once


def test_no_whole_batch_fp32_tensor_is_saved_for_backward():
    """bf16 logits (N, V): what autograd keeps is the bf16 logits and (N,)-sized vectors, no (N, V) fp32 tensor."""
    logits, targets = _rows(seed=5, n=256, v=400, dtype=torch.bfloat16)
    logits.requires_grad_()
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        label_smoothed_cross_entropy(logits[None], targets[None], pad_id=IGNORE_INDEX, smoothing=0.1)
    big_fp32 = [tuple(t.shape) for t in saved if t.dtype == torch.float32 and t.numel() >= logits.numel()]
    assert saved and big_fp32 == []
