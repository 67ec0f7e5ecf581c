"""Blocked sliding-window attention equals masked softmax attention; the ring buffer keeps only the window."""

import pytest
import torch

import aiayn.nn.local_attention as local_module
from aiayn.nn.kernels import LocalKernel
from aiayn.nn.local_attention import (
    RingBufferCache,
    local_attention,
    local_attention_reference,
    window_mask,
)


def inputs(n, batch=2, heads=4, kv_heads=2, dim=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, n, dim, generator=g, dtype=dtype, requires_grad=True)
    k = torch.randn(batch, kv_heads, n, dim, generator=g, dtype=dtype, requires_grad=True)
    v = torch.randn(batch, kv_heads, n, dim, generator=g, dtype=dtype, requires_grad=True)
    return q, k, v


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("window", [1, 2, 5, 11, 40])  # 1, w < n and w >= n (n = 23)
def test_blocked_equals_masked_softmax_forward_and_backward(causal, window):
    n = 23
    key_mask = torch.ones(2, n, dtype=torch.bool)
    key_mask[1, :4] = False  # left padding
    key_mask[1, 19:] = False  # and right padding
    q, k, v = inputs(n)
    out = local_attention(q, k, v, window=window, causal=causal, key_mask=key_mask)
    ref, _ = local_attention_reference(q, k, v, window=window, causal=causal, key_mask=key_mask, backend="math")
    torch.testing.assert_close(out, ref)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    ours = torch.autograd.grad((out * weight).sum(), (q, k, v))
    theirs = torch.autograd.grad((ref * weight).sum(), (q, k, v))
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("window, block", [(9, None), (30, 4)], ids=["halo-one-group", "halo-several-groups"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_recomputed_groups_equal_the_reference(monkeypatch, causal, window, block):
    """Long training sequences go through checkpointed groups of blocks: same values, same gradients
    (also when a group's window reaches back over more than one earlier group)."""
    monkeypatch.setattr(local_module, "GROUP_QUERIES", 16)
    key_mask = torch.ones(2, 70, dtype=torch.bool)
    key_mask[0, 50:] = False
    q, k, v = inputs(70)
    out = local_attention(q, k, v, window=window, causal=causal, key_mask=key_mask, block=block)
    ref, _ = local_attention_reference(q, k, v, window=window, causal=causal, key_mask=key_mask, backend="math")
    torch.testing.assert_close(out, ref)
    weight = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad((out * weight).sum(), (q, k, v)), torch.autograd.grad((ref * weight).sum(), (q, k, v))):
        torch.testing.assert_close(a, b)


def test_window_mask_sees_the_right_keys():
    causal = window_mask(5, 5, 2, causal=True)
    assert causal.int().tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]
    centred = window_mask(5, 5, 3, causal=False)
    assert centred.sum(dim=1).tolist() == [2, 3, 3, 3, 2] and centred[2].int().tolist() == [0, 1, 1, 1, 0]
    assert window_mask(1, 5, 2, causal=True).int().tolist() == [[0, 0, 0, 1, 1]]  # lower-right aligned


def test_fully_padded_row_gives_zeros_and_zero_gradients():
    q, k, v = inputs(9)
    key_mask = torch.ones(2, 9, dtype=torch.bool)
    key_mask[0] = False
    out = local_attention(q, k, v, window=3, causal=True, key_mask=key_mask)
    out.sum().backward()
    assert torch.isfinite(out).all() and out[0].abs().max() == 0
    assert q.grad is not None and q.grad[0].abs().max() == 0 and torch.isfinite(k.grad).all()


def test_gradcheck_float64():
    q, k, v = inputs(7, batch=1, heads=2, kv_heads=1, dim=3)
    key_mask = torch.tensor([[True] * 5 + [False] * 2])
    for causal in (True, False):
        assert torch.autograd.gradcheck(
            lambda q, k, v, causal=causal: local_attention(q, k, v, window=3, causal=causal, key_mask=key_mask), (q, k, v)
        )


def test_memory_is_linear_in_length():
    """The largest tensor the blocked kernel makes is (B, H, n/P, P, span): O(n w), never n x n."""
    n, window = 4096, 16
    q = torch.randn(1, 1, n, 8)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof, torch.inference_mode():
        local_attention(q, q, q, window=window, causal=True)
    biggest = max(e.cpu_memory_usage for e in prof.events())
    assert biggest < n * n * 4 / 16  # far below one float32 n x n matrix (64 MiB)


def test_ring_buffer_keeps_the_last_window_in_constant_memory():
    cache = RingBufferCache(3)
    keys = torch.arange(10.0).view(1, 1, 10, 1)
    cache.append(keys[:, :, :2], keys[:, :, :2])
    assert cache.recent()[0].flatten().tolist() == [0.0, 1.0]
    storage = cache.k.data_ptr()
    for i in range(2, 10):
        cache.append(keys[:, :, i : i + 1], keys[:, :, i : i + 1])
        assert cache.recent()[0].flatten().tolist() == [float(j) for j in range(max(0, i - 2), i + 1)]
    assert cache.k.shape[2] == 3 and cache.k.data_ptr() == storage and cache.length == 10
    cache.append(keys[:, :, :5], keys[:, :, :5])  # more new keys than the window: only the last 3 stay
    assert cache.recent()[0].flatten().tolist() == [2.0, 3.0, 4.0]


def test_cached_steps_equal_the_parallel_pass():
    q, k, v = inputs(12, dtype=torch.float32)
    kernel = LocalKernel(4)
    args = dict(mask=None, causal=True, bias=None, dropout_p=0.0, backend="sdpa", return_weights=False)
    full, _ = kernel(q, k, v, cache=None, **args)
    cache = kernel.new_cache()
    parts = [kernel(q[:, :, :5], k[:, :, :5], v[:, :, :5], cache=cache, **args)[0]]  # a prefill, then steps
    parts += [kernel(q[:, :, i : i + 1], k[:, :, i : i + 1], v[:, :, i : i + 1], cache=cache, **args)[0] for i in range(5, 9)]
    parts.append(kernel(q[:, :, 9:], k[:, :, 9:], v[:, :, 9:], cache=cache, **args)[0])  # 3 at once after the buffer
    torch.testing.assert_close(torch.cat(parts, dim=2), full)


def test_single_token_steps_read_the_ring_in_any_order_with_padding():
    """One token at a time from an empty cache (slots filling, then wrapping), with left padding in one row:
    attending the unordered ring buffer equals the parallel pass."""
    q, k, v = inputs(11, dtype=torch.float32)
    q, k, v = (x.expand(2, -1, -1, -1).contiguous() for x in (q, k, v))
    padding = torch.ones(2, 11, dtype=torch.bool)
    padding[1, :3] = False  # row 1 starts with 3 padding positions
    kernel = LocalKernel(4)
    args = dict(causal=True, bias=None, dropout_p=0.0, backend="sdpa", return_weights=False)
    full, _ = kernel(q, k, v, mask=padding[:, None, None, :], cache=None, **args)
    cache = kernel.new_cache()
    steps = [kernel(q[:, :, i : i + 1], k[:, :, i : i + 1], v[:, :, i : i + 1], cache=cache,
                    mask=padding[:, None, None, : i + 1], **args)[0] for i in range(11)]
    torch.testing.assert_close(torch.cat(steps, dim=2)[1, :, 3:], full[1, :, 3:])  # padded queries: no real output
    torch.testing.assert_close(torch.cat(steps, dim=2)[0], full[0])
    assert cache.slot_mask(None) is None and cache.slot_mask(padding).tolist()[1] == [True, True, True, True]


def test_slot_mask_while_the_ring_fills():
    cache = RingBufferCache(4)
    one = torch.zeros(1, 1, 1, 2)
    cache.append(one, one)
    assert cache.slot_mask(None).tolist() == [[True, False, False, False]]
    for _ in range(4):
        cache.append(one, one)  # 5 positions: slot 0 now holds position 4
    padding = torch.tensor([[False, False, True, True, True]])
    assert cache.slot_mask(None) is None
    assert cache.slot_mask(padding).tolist() == [[True, False, True, True]]  # slot 1 holds position 1 (padding)
