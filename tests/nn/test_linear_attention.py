"""Linear attention: chunked causal = the naive quadratic formula; the RNN state = the parallel pass."""

import pytest
import torch

import aiayn.nn.linear_attention as linear_module
from aiayn.nn.kernels import LinearKernel
from aiayn.nn.linear_attention import (
    causal_linear_attention,
    linear_attention,
    linear_attention_reference,
)


def inputs(n, batch=2, heads=4, kv_heads=2, dim=6, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(batch, h, n, dim, generator=g, dtype=dtype, requires_grad=True) for h in (heads, kv_heads, kv_heads)
    )


def padding(n):
    key_mask = torch.ones(2, n, dtype=torch.bool)
    key_mask[1, :3] = False
    return key_mask


@pytest.mark.parametrize("chunk", [1, 4, 7, 64])
def test_chunked_causal_equals_naive_forward_and_backward(chunk):
    n = 19
    key_mask = padding(n)
    q, k, v = inputs(n)
    out, _ = causal_linear_attention(q, k, v, key_mask=key_mask, chunk=chunk)
    ref = linear_attention_reference(q, k, v, causal=True, key_mask=key_mask)
    torch.testing.assert_close(out, ref)
    weight = torch.randn_like(out)
    ours = torch.autograd.grad((out * weight).sum(), (q, k, v))
    theirs = torch.autograd.grad((ref * weight).sum(), (q, k, v))
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b)


def test_recomputed_segments_equal_naive(monkeypatch):
    """Long training sequences go through checkpointed segments carrying the state: same values, same gradients."""
    monkeypatch.setattr(linear_module, "SEGMENT", 8)
    q, k, v = inputs(27)
    key_mask = padding(27)
    out, _ = causal_linear_attention(q, k, v, key_mask=key_mask, chunk=4)
    ref = linear_attention_reference(q, k, v, causal=True, key_mask=key_mask)
    torch.testing.assert_close(out, ref)
    weight = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad((out * weight).sum(), (q, k, v)), torch.autograd.grad((ref * weight).sum(), (q, k, v))):
        torch.testing.assert_close(a, b)


def test_bidirectional_equals_naive():
    q, k, v = inputs(11)
    key_mask = padding(11)
    torch.testing.assert_close(
        linear_attention(q, k, v, key_mask=key_mask), linear_attention_reference(q, k, v, causal=False, key_mask=key_mask)
    )


def test_recurrent_state_equals_parallel_at_every_step():
    q, k, v = inputs(10, dtype=torch.float32)
    kernel = LinearKernel(chunk=4)
    args = dict(causal=True, bias=None, dropout_p=0.0, backend="sdpa", return_weights=False)
    mask = padding(10)[:, None, None, :]  # (B, 1, 1, S) over every position so far, as a model passes it
    full, _ = kernel(q, k, v, mask=mask, cache=None, **args)
    state = kernel.new_cache()
    steps = [kernel(q[:, :, :3], k[:, :, :3], v[:, :, :3], mask=mask[..., :3], cache=state, **args)[0]]
    for i in range(3, 10):
        steps.append(kernel(q[:, :, i : i + 1], k[:, :, i : i + 1], v[:, :, i : i + 1], mask=mask[..., : i + 1], cache=state, **args)[0])
        torch.testing.assert_close(torch.cat(steps, dim=2), full[:, :, : i + 1])
    assert state.state[0].shape == (2, 4, 6, 6) and state.length == 10  # (B, H, D, Dv), whatever the length


def test_fully_padded_row_stays_finite_with_zero_gradients():
    q, k, v = inputs(8)
    key_mask = torch.ones(2, 8, dtype=torch.bool)
    key_mask[0] = False
    for causal in (True, False):
        out = causal_linear_attention(q, k, v, key_mask=key_mask)[0] if causal else linear_attention(q, k, v, key_mask=key_mask)
        grads = torch.autograd.grad(out.sum(), (q, k, v))
        assert torch.isfinite(out).all() and out[0].abs().max() == 0
        assert all(torch.isfinite(g).all() for g in grads) and grads[0][0].abs().max() == 0


def test_gradcheck_float64():
    q, k, v = inputs(6, batch=1, heads=2, kv_heads=1, dim=3)
    assert torch.autograd.gradcheck(lambda q, k, v: causal_linear_attention(q, k, v, chunk=4)[0], (q, k, v))
    assert torch.autograd.gradcheck(lambda q, k, v: linear_attention(q, k, v), (q, k, v))


def test_return_weights_is_refused_saying_why():
    q, k, v = inputs(4)
    with pytest.raises(ValueError, match="attention='linear' has no attention weights to return"):
        LinearKernel()(q, k, v, mask=None, causal=True, cache=None, bias=None, dropout_p=0.0, backend="sdpa", return_weights=True)
