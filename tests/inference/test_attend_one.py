"""Our one-query attention kernel (aiayn.inference.gemv.attend_one, the ``native`` one-query backend of
aiayn.nn.attention): the formula's result in float64 within each dtype's rounding, for grouped-query heads, cache views,
padding masks of one row or of each row, a row whose keys are all masked (zeros, as the library gives), head sizes with
scalar tails and key counts off the four-key blocks; where it does not apply, torch's fused kernel answers."""

import pytest
import torch

from aiayn.nn.attention import scaled_dot_product_attention

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def reference(q, k, v, mask):
    out, _ = scaled_dot_product_attention(q.double(), k.double(), v.double(), mask=mask, backend="math")
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("batch", "heads", "kv_heads", "keys", "dim"),
                         [(1, 12, 12, 1, 64), (1, 4, 4, 7, 64), (2, 8, 2, 37, 64), (3, 4, 1, 130, 32), (2, 3, 3, 9, 40)])
def test_it_is_the_formula_for_cache_views_and_masks(native_gemv, dtype, batch, heads, kv_heads, keys, dim):
    torch.manual_seed(keys)
    cache_k, cache_v = (torch.randn(batch, kv_heads, keys + 11, dim, dtype=dtype) for _ in range(2))
    k, v = cache_k[:, :, :keys], cache_v[:, :, :keys]  # the filled columns of a static cache: a strided view
    q = torch.randn(batch, heads, 1, dim, dtype=dtype)
    rows = torch.rand(batch, 1, 1, keys) > 0.3
    rows[..., -1] = True
    for mask in (None, rows, rows[:1]):
        out, weights = scaled_dot_product_attention(q, k, v, mask=mask, backend="native")
        assert weights is None and out.dtype == dtype and out.shape == (batch, heads, 1, dim)
        torch.testing.assert_close(out.double(), reference(q, k, v, mask), rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads", "queries", "keys"), [(4, 4, 2, 2), (8, 2, 8, 37), (3, 1, 5, 130)])
@pytest.mark.parametrize("dim", [32, 40, 128])  # scores 16 keys at a time, and a head with a scalar tail
def test_a_few_causal_queries_are_each_the_step_at_its_position(native_gemv, dtype, heads, kv_heads, queries, keys, dim):
    """Speculative decoding's check: query t over the first S - T + t + 1 keys, with the bits of one query over exactly
    those keys (what the one-token step at that position computes), and the formula's result."""
    torch.manual_seed(keys)
    cache_k, cache_v = (torch.randn(2, kv_heads, keys + 5, dim, dtype=dtype) for _ in range(2))
    k, v = cache_k[:, :, :keys], cache_v[:, :, :keys]
    q = torch.randn(2, heads, queries, dim, dtype=dtype)
    pad = torch.ones(2, 1, 1, keys, dtype=torch.bool)
    pad[1, ..., : keys // 3] = False  # the second row left-padded
    for mask in (None, pad):
        out, _ = scaled_dot_product_attention(q, k, v, mask=mask, causal=True, backend="native")
        assert out.shape == q.shape and out.dtype == dtype
        for t in range(queries):
            seen = keys - queries + t + 1
            one = native_gemv.attend_one(q[:, :, t : t + 1], k[:, :, :seen], v[:, :, :seen], None if mask is None else mask[..., :seen])
            assert torch.equal(out[:, :, t : t + 1], one)
        torch.testing.assert_close(out.double(), scaled_dot_product_attention(q.double(), k.double(), v.double(), mask=mask, causal=True,
                                                                            backend="math")[0], rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


def test_more_queries_than_a_check_take_torchs_fused_kernel(native_gemv, monkeypatch):
    from aiayn.nn.attention import FEW_QUERIES

    monkeypatch.setattr(torch.ops.aiayn_native, "attend_one", lambda *a: pytest.fail("the native kernel was called"))
    q, k = torch.randn(1, 2, FEW_QUERIES + 1, 8), torch.randn(1, 2, 20, 8)
    native, _ = scaled_dot_product_attention(q, k, k, causal=True, backend="native")
    assert torch.equal(native, scaled_dot_product_attention(q, k, k, causal=True, backend="sdpa")[0])


def test_a_row_with_every_key_masked_gives_zeros(native_gemv):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 1, 16), torch.randn(2, 4, 5, 16), torch.randn(2, 4, 5, 16)
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    mask[1] = False
    out, _ = scaled_dot_product_attention(q, k, v, mask=mask, backend="native")
    assert torch.equal(out[1], torch.zeros(4, 1, 16))
    torch.testing.assert_close(out.double(), reference(q, k, v, mask), rtol=TOLERANCE[torch.float32], atol=TOLERANCE[torch.float32])


def test_where_it_does_not_apply_torchs_fused_kernel_answers(native_gemv, monkeypatch):
    """Gradients, a bias, several queries or a mask per query: the ``sdpa`` backend's result, bit for bit."""
    monkeypatch.setattr(torch.ops.aiayn_native, "attend_one", lambda *a: pytest.fail("the native kernel was called"))
    q, k, v = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    per_query = torch.ones(1, 2, 1, 6, dtype=torch.bool)
    cases = [dict(q=q.clone().requires_grad_()), dict(bias=torch.randn(1, 6)), dict(q=torch.randn(1, 2, 3, 8)), dict(mask=per_query)]
    for case in cases:
        args = {"q": q, "k": k, "v": v, **case}
        native, _ = scaled_dot_product_attention(**args, backend="native")
        fused, _ = scaled_dot_product_attention(**args, backend="sdpa")
        assert torch.equal(native, fused)


@pytest.mark.parametrize(("heads", "kv_heads", "queries", "keys", "dim"), [(12, 12, 1, 37, 64), (8, 2, 3, 130, 32), (3, 3, 1, 9, 40)])
def test_fp32_queries_over_a_bf16_cache_are_the_widened_cache_bit_for_bit(native_gemv, heads, kv_heads, queries, keys, dim):
    """A cache kept in bf16 under fp32 activations (CausalLMDecoder's kv_dtype): bf16 keys and values are read widened,
    exactly, so the result is that of the same values widened beforehand, bit for bit (one query and a causal few)."""
    torch.manual_seed(keys)
    cache_k, cache_v = (torch.randn(2, kv_heads, keys + 5, dim).bfloat16() for _ in range(2))
    k, v = cache_k[:, :, :keys], cache_v[:, :, :keys]
    q = torch.randn(2, heads, queries, dim)
    mask = torch.rand(2, 1, 1, keys) > 0.3
    mask[..., -queries:] = True
    for m in (None, mask):
        out = torch.ops.aiayn_native.attend_one(q, k, v, m, dim ** -0.5, True)
        assert out.dtype == torch.float32
        assert torch.equal(out, torch.ops.aiayn_native.attend_one(q, k.float(), v.float(), m, dim ** -0.5, True))


def test_the_kernel_checks_its_inputs(native_gemv):
    q, k = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 4, 8)
    with pytest.raises(RuntimeError, match=r"q, k and v must all be float32 or all bfloat16 \(or float32 q with bfloat16 k and v\), got q BFloat16, k Float"):
        torch.ops.aiayn_native.attend_one(q.bfloat16(), k, k, None, 1.0)
    with pytest.raises(RuntimeError, match="got q Float, k BFloat16, v Float"):
        torch.ops.aiayn_native.attend_one(q, k.bfloat16(), k, None, 1.0)
    with pytest.raises(RuntimeError, match=r"mask must be bool \(B or 1, 1, 1, S\)"):
        torch.ops.aiayn_native.attend_one(q, k, k, torch.ones(1, 1, 1, 3, dtype=torch.bool), 1.0)
    with pytest.raises(RuntimeError, match="causal attention needs at least as many keys as queries, got T=5, S=4"):
        torch.ops.aiayn_native.attend_one(torch.randn(1, 2, 5, 8), k, k, None, 1.0, True)
    with pytest.raises(RuntimeError, match="the last dimension must be contiguous"):
        every_other = torch.randn(1, 2, 4, 16)[..., ::2]
        torch.ops.aiayn_native.attend_one(q, every_other, every_other, None, 1.0)
