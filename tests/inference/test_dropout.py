"""Dropout by our kernel (aiayn/inference/dropout.cpp, aiayn/nn/dropout.py): Philox4x32-10's published answer, the
kept fraction and scale, a mask independent of threads and layout and regenerated for the gradient, runs reproducible
under torch's seed, and the timed choice with its override."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from choice_helpers import assert_choice_cached

from aiayn.inference import kernel_choice
from aiayn.nn.dropout import Dropout, dropout


@pytest.fixture
def ours(native_gemv, monkeypatch):
    """Dropout through our kernel (the choice forced), counting its calls."""
    monkeypatch.setenv(kernel_choice.DROPOUT_ENV_VAR, "native")
    monkeypatch.setattr(kernel_choice, "_NATIVE_CHOSEN", {})
    calls = []
    kernel = native_gemv.dropout
    monkeypatch.setattr(native_gemv, "dropout", lambda x, p, seed: calls.append(seed) or kernel(x, p, seed))
    return calls


def test_the_generator_gives_philox4x32_10s_published_answer(native_gemv):
    # Random123's known-answer test (kat_vectors): counter 0, key 0 -> 6627e8d5 e169c58d bc57ac4c 9b00dbd8; the four
    # words of counter 0 are the bits of elements 0, 16, 32 and 48 (each word fills 16 adjacent elements)
    words = torch.ops.aiayn_native.dropout_bits(64, 0)[[0, 16, 32, 48]].tolist()
    assert [w & 0xFFFFFFFF for w in words] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_fraction_p_is_dropped_the_rest_scaled_and_the_mask_uniform_over_positions(ours, dtype):
    n, p = 1 << 20, 0.1
    x = torch.randn(n).to(dtype)
    y = dropout(x, p)
    kept = y != 0
    sigma = (p * (1 - p) / n) ** 0.5
    assert abs(kept.double().mean().item() - (1 - p)) < 5 * sigma
    assert torch.equal(y[kept], (x[kept].float() * (1 / (1 - p))).to(dtype))  # scaled in fp32, rounded once
    # every position within a 64-element chunk (the generator's words) is dropped as often: chi-square with 63 degrees
    counts = (~kept).reshape(-1, 64).double().sum(0)
    expected = n // 64 * p
    assert ((counts - expected) ** 2 / expected).sum().item() < 120  # P(chi2_63 > 120) < 1e-5
    assert abs(torch.corrcoef(torch.stack([kept[:-1].double(), kept[1:].double()]))[0, 1].item()) < 5 / n ** 0.5
    assert len(ours) == 1


def test_the_mask_depends_on_the_seed_only_not_on_threads_or_layout(native_gemv):
    x = torch.randn(64, 37)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native_gemv.dropout(x, 0.3, 7)
        torch.set_num_threads(2)
        two = native_gemv.dropout(x, 0.3, 7)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    assert torch.equal(native_gemv.dropout(x.t().contiguous().t(), 0.3, 7), one)  # a strided x: its elements' order
    assert not torch.equal(native_gemv.dropout(x, 0.3, 8), one)


def test_the_gradient_is_the_same_mask_and_a_run_repeats_under_torchs_seed(ours):
    x = torch.randn(5, 300, requires_grad=True)
    torch.manual_seed(3)
    y = dropout(x, 0.25)
    (grad,) = torch.autograd.grad(y, x, torch.ones_like(y))
    assert torch.equal(grad, (y != 0).float() / 0.75)
    torch.manual_seed(3)
    assert torch.equal(dropout(x, 0.25), y)
    assert not torch.equal(dropout(x, 0.25), y)  # a new seed at each call
    assert ours[:3] == [ours[0]] * 3 and ours[3] != ours[0]  # forward, its gradient, the repeat; then a new seed


def test_the_module_is_nn_dropout_and_the_identity_outside_training_or_at_p_0(ours):
    layer = Dropout(0.5)
    assert isinstance(layer, torch.nn.Dropout) and repr(layer) == "Dropout(p=0.5, inplace=False)"
    x = torch.randn(4, 8)
    assert (layer(x) == 0).any()
    layer.eval()
    assert layer(x) is x
    assert dropout(x, 0.0) is x
    assert torch.equal(dropout(x.double(), 1.0), torch.zeros_like(x.double()))  # torch's where ours does not apply
    assert len(ours) == 1


def test_the_choice_is_timed_cached_and_overridden(native_gemv, cache, monkeypatch):
    monkeypatch.setattr(kernel_choice, "_time_dropout", lambda dtype: {"torch": 2.0, "native": 1.0})
    assert kernel_choice.choose_dropout(torch.float32) == "native"
    assert_choice_cached(monkeypatch, cache, "dropout", kernel_choice.choose_dropout)
    monkeypatch.setenv(kernel_choice.DROPOUT_ENV_VAR, "torch")
    calls = []
    monkeypatch.setattr(F, "dropout", lambda x, p, training: calls.append(p) or x)
    dropout(torch.ones(3), 0.5)
    assert calls == [0.5]


def test_a_choice_adopted_from_rank_0_loads_our_library_in_this_process(native_gemv):
    """Distributed training's other ranks adopt rank 0's answer without timing: ``native`` must load the library there."""
    code = ("import torch; from aiayn.inference import gemv, kernel_choice; from aiayn.nn.dropout import dropout\n"
            "assert not gemv.loaded(); kernel_choice.adopt_native('dropout', torch.float32, 'native')\n"
            "y = dropout(torch.ones(4096), 0.5); assert gemv.loaded() and 0.4 < (y == 0).float().mean() < 0.6")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, kernel_choice.DROPOUT_ENV_VAR: "torch"})


def test_training_attention_with_dropout_takes_the_formula_with_our_dropout(ours, monkeypatch):
    """torch's CPU kernel computes attention with dropout by the formula and its own dropout: "auto" takes ours instead."""
    from aiayn.nn.attention import scaled_dot_product_attention

    fused = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: fused.append(k["dropout_p"]) or sdpa(*a, **k))
    q, k, v = (torch.randn(2, 2, 5, 8, requires_grad=True) for _ in range(3))
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])[:, None, None, :]
    out, _ = scaled_dot_product_attention(q, k, v, mask=mask, dropout_p=0.2, backend="auto")
    out.sum().backward()
    assert fused == [] and len(ours) == 2  # the weights' dropout and its gradient, by our kernel
    assert torch.equal(out[1, :, :, :].isfinite(), torch.ones_like(out[1], dtype=torch.bool))
    scaled_dot_product_attention(q, k, v, mask=mask, dropout_p=0.0, backend="auto")  # no dropout: torch's kernel
    scaled_dot_product_attention(q, k, v, mask=mask, dropout_p=0.2, backend="sdpa")  # named: obeyed
    assert fused == [0.0, 0.2]
