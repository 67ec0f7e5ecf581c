"""Multi-head attention against torch.nn.MultiheadAttention with copied weights, and gradcheck."""

import pytest
import torch
from torch import nn

from aiayn.nn.cache import LayerCache, StaticLayerCache
from aiayn.nn.masks import attention_mask, causal_mask, padding_mask_from_lengths
from aiayn.nn.multihead import MultiHeadAttention


def copy_from_torch(ours: MultiHeadAttention, ref: nn.MultiheadAttention) -> None:
    """torch packs W^Q, W^K, W^V into one in_proj_weight (3D, D)."""
    w_q, w_k, w_v = ref.in_proj_weight.chunk(3)
    b_q, b_k, b_v = ref.in_proj_bias.chunk(3)
    with torch.no_grad():
        for lin, w, b in ((ours.w_q, w_q, b_q), (ours.w_k, w_k, b_k), (ours.w_v, w_v, b_v)):
            lin.weight.copy_(w)
            lin.bias.copy_(b)
        ours.w_o.weight.copy_(ref.out_proj.weight)
        ours.w_o.bias.copy_(ref.out_proj.bias)


def pair(d_model=16, heads=4, cross=False):
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(d_model, heads, batch_first=True)
    nn.init.normal_(ref.in_proj_bias)  # torch starts biases at zero: make them count
    nn.init.normal_(ref.out_proj.bias)
    ours = MultiHeadAttention(d_model, heads, cross=cross)
    copy_from_torch(ours, ref)
    return ours, ref


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_self_attention_with_padding_and_causal_masks(backend):
    ours, ref = pair()
    ours.backend = backend
    x = torch.randn(3, 6, 16)
    pad = padding_mask_from_lengths(torch.tensor([6, 4, 2]), 6)  # True = real token
    # torch.nn uses the opposite polarity: True = blocked
    expected, expected_w = ref(x, x, x, key_padding_mask=~pad, attn_mask=~causal_mask(6), average_attn_weights=False)
    out, w = ours(x, mask=attention_mask(pad), causal=True, return_weights=True)
    valid = pad[:, :, None]  # padded query rows differ by convention only where torch is NaN-free: compare real rows
    torch.testing.assert_close(out * valid, expected * valid, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w * valid[:, None], expected_w * valid[:, None], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_cross_attention_with_key_padding(backend):
    ours, ref = pair(cross=True)
    ours.backend = backend
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    pad = padding_mask_from_lengths(torch.tensor([7, 3]), 7)
    expected, _ = ref(x, memory, memory, key_padding_mask=~pad)
    out, _ = ours(x, memory, mask=attention_mask(pad))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_gradcheck_float64():
    torch.manual_seed(0)
    mha = MultiHeadAttention(6, 2, n_kv_heads=1, backend="math").double()
    x = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    mask = attention_mask(torch.tensor([[True, True, False], [True, True, True]]), causal=True, q_len=3)
    assert torch.autograd.gradcheck(lambda x: mha(x, mask=mask)[0], (x,))
    params = tuple(mha.parameters())
    assert torch.autograd.gradcheck(lambda *p: torch.func.functional_call(mha, dict(zip([n for n, _ in mha.named_parameters()], p)), (x.detach(),), {"mask": mask})[0], params)


def test_cache_equals_full_pass():
    """Feeding tokens one by one through a cache gives the full causal pass, position by position."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, n_kv_heads=2)
    x = torch.randn(2, 6, 16)
    full, _ = mha(x, causal=True)
    cache = LayerCache()
    steps = [mha(x[:, i : i + 1], causal=True, cache=cache)[0] for i in range(6)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    static = StaticLayerCache(8)  # columns 6 and 7 stay unwritten: the cache's own mask hides them
    first, _ = mha(x[:, :4], causal=True, cache=static)
    last, _ = mha(x[:, 4:], causal=True, cache=static)
    torch.testing.assert_close(torch.cat([first, last], 1), full, atol=1e-5, rtol=1e-5)
    assert static.k.shape[2] == 8 and static.length == 6
    with pytest.raises(ValueError, match="static cache holds max_len=8 positions, asked for 9"):
        mha(x[:, :3], causal=True, cache=static)


def test_gqa_validation_names_fields():
    with pytest.raises(ValueError, match="n_heads must be divisible by n_kv_heads, got n_heads=4, n_kv_heads=3"):
        MultiHeadAttention(16, 4, n_kv_heads=3)
    with pytest.raises(ValueError, match="d_model must be divisible by n_heads, got d_model=10, n_heads=4"):
        MultiHeadAttention(10, 4)


def test_self_or_cross_is_decided_at_construction():
    x, memory = torch.randn(1, 3, 16), torch.randn(1, 5, 16)
    with pytest.raises(ValueError, match="self-attention module: memory must be None"):
        MultiHeadAttention(16, 4)(x, memory)
    with pytest.raises(ValueError, match="cross-attention needs memory"):
        MultiHeadAttention(16, 4, cross=True)(x)
