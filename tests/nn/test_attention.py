"""Scaled dot-product attention: backends agree, gradients are right, fully masked rows are safe."""

import math

import pytest
import torch

from aiayn.nn import attention
from aiayn.nn.attention import scaled_dot_product_attention as attend
from aiayn.nn.masks import attention_mask, causal_mask, padding_mask_from_lengths


def qkv(b=2, h=4, t=5, s=7, d=8, hkv=None, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    hkv = hkv or h
    q = torch.randn(b, h, t, d, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(b, hkv, s, d, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(b, hkv, s, d, generator=g, dtype=torch.float64).to(dtype)
    return q, k, v


def reference(q, k, v, mask=None):
    """The formula, in float64, with an explicit -inf mask."""
    scores = q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1) @ v.double()


MASKS = {
    "none": lambda t, s: None,
    "padding": lambda t, s: attention_mask(padding_mask_from_lengths(torch.tensor([s, 3]), s)),
    "causal": lambda t, s: causal_mask(t, s)[None, None],
    "padding+causal": lambda t, s: attention_mask(padding_mask_from_lengths(torch.tensor([s, s - 1]), s), causal=True, q_len=t),
}


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("mask_name", list(MASKS))
def test_matches_formula(backend, mask_name):
    q, k, v = qkv()
    mask = MASKS[mask_name](5, 7)
    out, _ = attend(q, k, v, mask=mask, backend=backend)
    torch.testing.assert_close(out.double(), reference(q, k, v, mask), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mask_name", list(MASKS))
def test_backends_agree(mask_name):
    q, k, v = qkv(seed=1)
    mask = MASKS[mask_name](5, 7)
    a, weights = attend(q, k, v, mask=mask, backend="math", return_weights=True)
    b, _ = attend(q, k, v, mask=mask, backend="sdpa")
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 5))


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_causal_flag_is_lower_right_aligned(backend):
    """causal=True with T < S equals an explicit lower-right causal mask (the KV-cache case)."""
    q, k, v = qkv(t=3, s=7)
    out, _ = attend(q, k, v, causal=True, backend=backend)
    torch.testing.assert_close(out.double(), reference(q, k, v, causal_mask(3, 7)), atol=1e-5, rtol=1e-5)
    # the last query sees every key: same as no mask at all
    full = reference(q, k, v)
    torch.testing.assert_close(out[:, :, -1].double(), full[:, :, -1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_square_causal_flag(backend):
    q, k, v = qkv(t=6, s=6)
    out, _ = attend(q, k, v, causal=True, backend=backend)
    torch.testing.assert_close(out.double(), reference(q, k, v, causal_mask(6)), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_grouped_query_equals_repeated_heads(backend):
    q, k, v = qkv(h=4, hkv=2)
    out, _ = attend(q, k, v, backend=backend)
    expected = reference(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_bias_is_added_to_scores(backend):
    q, k, v = qkv()
    bias = torch.randn(1, 4, 5, 7)
    mask = MASKS["padding"](5, 7)
    out, _ = attend(q, k, v, mask=mask, bias=bias, backend=backend)
    scores = q.double() @ k.double().transpose(-2, -1) / math.sqrt(8) + bias.double()
    expected = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ v.double()
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_gradcheck_float64(backend):
    q, k, v = (x.double().requires_grad_() for x in qkv(b=1, h=2, t=3, s=4, d=3))
    mask = attention_mask(torch.tensor([[True, True, True, False]]), causal=True, q_len=3)
    assert torch.autograd.gradcheck(lambda q, k, v: attend(q, k, v, mask=mask, backend=backend)[0], (q, k, v))


@pytest.mark.parametrize("host_check", [True, False], ids=["checked-on-host", "always-fixed-up"])
@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fully_masked_rows_are_zero_with_finite_gradients(backend, dtype, host_check, monkeypatch):
    """Both ways: looking at the mask first (CPU) and fixing up unconditionally (GPU, compiled)."""
    monkeypatch.setattr(attention, "_check_on_host", lambda q: host_check)
    q, k, v = (x.requires_grad_() for x in qkv(dtype=dtype))
    mask = torch.ones(2, 1, 5, 7, dtype=torch.bool)
    mask[0, :, 2] = False  # query 2 of row 0 may attend nothing
    mask[1] = False  # every query of row 1
    out, _ = attend(q, k, v, mask=mask, backend=backend)
    assert torch.isfinite(out).all()
    assert (out[0, :, 2] == 0).all() and (out[1] == 0).all()
    out.float().square().sum().backward()
    for x in (q, k, v):
        assert torch.isfinite(x.grad).all()
    assert (q.grad[1] == 0).all() and (k.grad[1] == 0).all()
    # the other rows are untouched by the fix-up
    ref = reference(q.detach(), k.detach(), v.detach(), mask)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out[0, :, :2].double(), ref[0, :, :2], atol=tol, rtol=tol)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_unconditional_fix_up_changes_nothing_without_empty_rows(backend, monkeypatch):
    q, k, v = qkv()
    mask = attention_mask(torch.tensor([[True] * 7, [True] * 4 + [False] * 3]), causal=False, q_len=5)
    checked, _ = attend(q, k, v, mask=mask, backend=backend)
    monkeypatch.setattr(attention, "_check_on_host", lambda q: False)
    assert torch.equal(attend(q, k, v, mask=mask, backend=backend)[0], checked)


def test_return_weights_needs_math_backend():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="return_weights=True needs backend='math'"):
        attend(q, k, v, backend="sdpa", return_weights=True)


def test_unknown_backend():
    with pytest.raises(ValueError, match=r"backend must be one of .*'flash'"):
        attend(*qkv(), backend="flash")


def test_mask_must_be_bool():
    with pytest.raises(TypeError, match="torch.bool.*got torch.float32"):
        attend(*qkv(), mask=torch.zeros(5, 7))


def test_mask_shape_checked():
    with pytest.raises(ValueError, match=r"does not broadcast to \(B, H, T, S\) = \(2, 4, 5, 7\)"):
        attend(*qkv(), mask=torch.ones(5, 6, dtype=torch.bool))


def test_empty_keys_give_zeros():
    q, k, v = qkv(s=0)
    for backend in ("math", "sdpa"):
        out, _ = attend(q, k, v, backend=backend)
        assert out.shape == (2, 4, 5, 8) and (out == 0).all()
