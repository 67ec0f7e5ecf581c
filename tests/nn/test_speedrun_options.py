"""The speedrun options of the blocks: ReLU^2 in the feed-forward network, QK-norm in attention, the auto kernel."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from aiayn.models.presets import model_class, preset
from aiayn.nn import attention as attention_module
from aiayn.nn.attention import AUTO_MATH_MAX_KEYS, resolve_backend, scaled_dot_product_attention
from aiayn.nn.cache import KVCache
from aiayn.nn.feedforward import PositionwiseFeedForward
from aiayn.nn.multihead import MultiHeadAttention


def test_relu2_is_relu_squared():
    torch.manual_seed(0)
    ffn = PositionwiseFeedForward(8, 16, activation="relu2")
    x = torch.randn(2, 3, 8)
    torch.testing.assert_close(ffn(x), ffn.w_2(F.relu(ffn.w_1(x)) ** 2))


def test_qk_norm_normalises_each_head_before_the_scores():
    """Reference: project, split, RMS-normalise q and k per head, attend; written out here by hand."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, qk_norm=True, backend="math")
    with torch.no_grad():
        mha.q_norm.weight.uniform_(0.5, 1.5)
        mha.k_norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 5, 16)
    out, _ = mha(x, causal=True)

    def heads(t):  # (B, T, 16) -> (B, 4, T, 4)
        return t.view(2, 5, 4, 4).transpose(1, 2)

    q = F.rms_norm(heads(mha.w_q(x)), (4,), mha.q_norm.weight)
    k = F.rms_norm(heads(mha.w_k(x)), (4,), mha.k_norm.weight)
    ref = F.scaled_dot_product_attention(q, k, heads(mha.w_v(x)), is_causal=True).transpose(1, 2).reshape(2, 5, 16)
    torch.testing.assert_close(out, mha.w_o(ref))


def test_qk_norm_adds_keys_only_when_on():
    plain = model_class(c := preset("tiny-decoder-only", vocab_size=20))(c)
    normed = model_class(c := preset("tiny-decoder-only", vocab_size=20, qk_norm=True))(c)
    extra = set(normed.state_dict()) - set(plain.state_dict())
    assert extra and all(k.endswith(("q_norm.weight", "k_norm.weight")) for k in extra)
    assert set(plain.state_dict()) <= set(normed.state_dict())


def test_qk_norm_cache_equals_no_cache():
    torch.manual_seed(0)
    config = preset("tiny-decoder-only", vocab_size=20, qk_norm=True, positions="rotary", dropout=0.0)
    model = model_class(config)(config).eval()
    ids = torch.randint(0, 20, (2, 7))
    full = model(ids)
    cache = KVCache(config.n_layers)
    steps = [model(ids[:, i : i + 1], cache=cache) for i in range(7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("dtype", "grad", "keys", "expected"),
    [
        (torch.bfloat16, True, AUTO_MATH_MAX_KEYS, "math"),  # half-precision CPU training, short: math
        (torch.float16, True, 16, "math"),
        (torch.bfloat16, True, AUTO_MATH_MAX_KEYS + 1, "sdpa"),  # longer: the flash kernel
        (torch.float32, True, 16, "sdpa"),  # fp32: the flash kernel wins
        (torch.bfloat16, False, 16, "sdpa"),  # inference
    ],
)
def test_auto_picks_the_documented_kernel(dtype, grad, keys, expected):
    q = torch.randn(1, 2, 4, 8, dtype=dtype, requires_grad=grad)
    assert resolve_backend("auto", q, keys) == expected


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_a_named_backend_is_never_overridden(backend, monkeypatch):
    calls = {"math": 0, "sdpa": 0}
    original_math, original_sdpa = attention_module._math_attention, F.scaled_dot_product_attention

    def math_spy(*args, **kwargs):
        calls["math"] += 1
        return original_math(*args, **kwargs)

    def sdpa_spy(*args, **kwargs):
        calls["sdpa"] += 1
        return original_sdpa(*args, **kwargs)

    monkeypatch.setattr(attention_module, "_math_attention", math_spy)
    monkeypatch.setattr(attention_module.F, "scaled_dot_product_attention", sdpa_spy)
    for dtype in (torch.bfloat16, torch.float32):  # auto would pick math for bf16 and sdpa for fp32
        q = torch.randn(1, 2, 8, 8, dtype=dtype, requires_grad=True)
        scaled_dot_product_attention(q, q, q, causal=True, backend=backend)
    assert calls[backend] == 2 and calls["sdpa" if backend == "math" else "math"] == 0


def test_auto_is_the_default_and_equals_both_kernels():
    config = preset("tiny-decoder-only", vocab_size=20)
    assert config.attention_backend == "auto"
    q, k, v = (torch.randn(2, 2, 6, 8, requires_grad=True) for _ in range(3))
    auto, _ = scaled_dot_product_attention(q, k, v, causal=True, backend="auto")
    math_out, _ = scaled_dot_product_attention(q, k, v, causal=True, backend="math")
    torch.testing.assert_close(auto, math_out, atol=1e-6, rtol=1e-5)
