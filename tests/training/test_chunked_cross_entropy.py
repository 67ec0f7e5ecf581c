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


# Our kernel (aiayn/inference/cross_entropy.cpp), the same Function with native=True: values and gradients against
# F.cross_entropy in float64 (vocabularies off the vector width, ignored rows, a real class id ignored, smoothing).
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("v, smoothing, ignore_index", [(11, 0.0, IGNORE_INDEX), (50, 0.1, 2), (777, 0.3, IGNORE_INDEX), (16, 0.1, 2)])
def test_our_kernel_equals_f_cross_entropy(native_gemv, dtype, v, smoothing, ignore_index):
    logits, targets = _rows(seed=v, n=37, v=v, dtype=dtype)
    logits[0, :3] = torch.tensor([40.0, -40.0, 0.0]).to(dtype)  # far from the others: exp's range
    targets[targets == IGNORE_INDEX] = ignore_index
    ours_in, ref_in = logits.clone().requires_grad_(), logits.double().requires_grad_()
    ours = losses.cross_entropy_by("native", ours_in, targets, ignore_index, smoothing)
    ref = F.cross_entropy(ref_in, targets, ignore_index=ignore_index, label_smoothing=smoothing, reduction="sum")
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours.double(), ref, rtol=2e-6, atol=1e-5)
    (ours * 0.7).backward()
    (ref * 0.7).backward()
    assert ours_in.grad.dtype == dtype
    tolerance = 2e-6 if dtype == torch.float32 else 4e-3  # bf16: the fp32 gradient rounded once
    torch.testing.assert_close(ours_in.grad.double(), ref_in.grad, rtol=0, atol=tolerance)
    assert torch.equal(ours_in.grad[targets == ignore_index], torch.zeros_like(ours_in.grad[targets == ignore_index]))
    if dtype == torch.bfloat16:  # the same loss as torch's operators over the chunks, to fp32 rounding
        chunked = losses.cross_entropy_by("torch", logits, targets, ignore_index, smoothing)
        torch.testing.assert_close(ours, chunked, rtol=1e-6, atol=1e-4)


def test_our_kernel_refuses_a_target_out_of_range(native_gemv):
    logits, targets = _rows(seed=1, n=4, v=5, dtype=torch.float32)
    targets[1] = 5
    with pytest.raises(RuntimeError, match="target 5 is out of bounds for 5 classes"):
        losses.cross_entropy_by("native", logits, targets, IGNORE_INDEX, 0.0)


def test_the_loss_takes_the_kernel_timed_faster_cached_and_the_override(native_gemv, tmp_path, monkeypatch):
    """``label_smoothed_cross_entropy`` asks the choice once per dtype (timed, cached beside the other choices);
    ``$AIAYN_LOSS_KERNEL`` overrides it; fp64 and a graph being compiled keep torch's operators."""
    import json

    from aiayn.inference import kernel_choice

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(kernel_choice, "_others_share", lambda start, end: 0.0)  # a quiet machine
    monkeypatch.setattr(kernel_choice, "_NATIVE_CHOSEN", {})
    monkeypatch.setenv(kernel_choice.LOSS_ENV_VAR, "measure")
    timed, calls = [], []
    monkeypatch.setattr(kernel_choice, "_time_cross_entropy", lambda dtype: timed.append(dtype) or {"torch": 2.0, "native": 1.0})
    rows = torch.ops.aiayn_native.cross_entropy_rows
    monkeypatch.setattr(torch.ops.aiayn_native, "cross_entropy_rows", lambda *a: calls.append(a[0].dtype) or rows(*a), raising=False)
    logits, targets = _rows(seed=2, n=6, v=9, dtype=torch.float32)
    for dtype in (torch.float32, torch.float32, torch.float64):
        label_smoothed_cross_entropy(logits.to(dtype)[None], targets[None], pad_id=IGNORE_INDEX, smoothing=0.1)
    assert timed == [torch.float32] and calls == [torch.float32, torch.float32]
    path = tmp_path / "aiayn" / "kernels.json"
    assert json.loads(path.read_text())[kernel_choice.machine_key()] == {"cross_entropy float32 (torch/native)": "native"}
    kernel_choice._NATIVE_CHOSEN.clear()
    monkeypatch.setenv(kernel_choice.LOSS_ENV_VAR, "torch")
    label_smoothed_cross_entropy(logits[None], targets[None], pad_id=IGNORE_INDEX, smoothing=0.1)
    assert calls == [torch.float32, torch.float32]
    monkeypatch.setenv(kernel_choice.LOSS_ENV_VAR, "fastest")
    kernel_choice._NATIVE_CHOSEN.clear()
    with pytest.raises(ValueError, match=r"\$AIAYN_LOSS_KERNEL must be one of measure, torch, native, got 'fastest'"):
        label_smoothed_cross_entropy(logits[None], targets[None], pad_id=IGNORE_INDEX, smoothing=0.1)


def test_the_choice_times_both_kernels_on_this_machine(native_gemv):
    from aiayn.inference import kernel_choice

    for dtype in (torch.float32, torch.bfloat16):
        times = kernel_choice._time_cross_entropy(dtype, rounds=1)
        assert set(times) == {"torch", "native"} and all(0 < t < 1e4 for t in times.values())
