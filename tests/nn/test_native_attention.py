"""Our training attention kernels (aiayn/inference/attention_train.cpp, and bf16's on matrix tiles,
attention_tiles.cpp, through aiayn.nn.attention.NativeAttention): values and gradients against float64 attention (causal
or not, shapes off the blocks' sizes, head dims 16 to 128, the model's strided views), and the timed choice that gives
them to ``backend="auto"`` training calls (cached, overridden, never for a mask, dropout, inference or another device)."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from aiayn.inference import kernel_choice
from aiayn.nn import attention
from aiayn.nn.attention import NativeAttention, scaled_dot_product_attention

TOLERANCE = {torch.float32: 5e-6, torch.bfloat16: 3e-2}  # bf16: the inputs' and outputs' rounding


def _qkv(batch, heads, t, s, d, dtype, seed=0):
    """q (B, H, T, D), k and v (B, H, S, D) as the model makes them: strided views of one projection's output."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, t, heads, d, generator=g).to(dtype).transpose(1, 2)
    kv = torch.randn(batch, s, 2, heads, d, generator=g).to(dtype)
    return q, kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch, heads, t, s, d, causal", [(2, 3, 37, 37, 32, True), (1, 2, 70, 70, 64, True), (2, 2, 9, 41, 48, False),
                                                          (1, 1, 1, 1, 16, True), (1, 2, 33, 33, 128, False)])
def test_values_and_gradients_are_attentions_in_float64(native_gemv, dtype, batch, heads, t, s, d, causal):
    q, k, v = _qkv(batch, heads, t, s, d, dtype, seed=t + d)
    grad = torch.randn(batch, heads, t, d).to(dtype)
    inputs = [x.detach().requires_grad_() for x in (q, k, v)]
    out = NativeAttention.apply(*inputs, causal, 1.0 / math.sqrt(d))
    out.backward(grad)
    wide = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref = F.scaled_dot_product_attention(*wide, is_causal=causal)
    ref.backward(grad.double())
    assert out.dtype == dtype and all(x.grad.dtype == dtype for x in inputs)
    scale = TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), ref, rtol=scale, atol=scale)
    for ours, theirs in zip(inputs, wide):
        torch.testing.assert_close(ours.grad.double(), theirs.grad, rtol=scale, atol=scale)


@pytest.fixture
def tiles(native_gemv):
    """bf16 attention by oneDNN's small-matrix kernel, skipped with the reason where torch cannot pack bf16 operands."""
    if not native_gemv.tiles_available():
        pytest.skip("torch's small-matrix kernel takes no packed bf16 operands on this CPU (it did with AMX, not on a Zen 4 with AVX512-BF16)")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch, heads, t, s, d, causal", [(2, 3, 37, 37, 32, True), (1, 2, 130, 130, 64, True), (2, 2, 9, 41, 48, False),
                                                          (1, 1, 1, 1, 16, True), (1, 2, 70, 33, 128, False), (1, 1, 65, 65, 80, True),
                                                          (1, 2, 20, 20, 24, True)])  # 24: a head dim the loops refuse
def test_tiles_values_and_gradients_are_attentions_in_float64(native_gemv, dtype, batch, heads, t, s, d, causal):
    """The kernel on oneDNN's small-matrix products: the same attention as float64's within fp32's, or bf16's rounding
    (the weights and their gradient rounded to bf16 for the products that take them), over sizes off its 64 x 64 blocks."""
    if dtype == torch.bfloat16 and not native_gemv.tiles_available():
        pytest.skip("torch's small-matrix kernel takes no packed bf16 operands on this CPU (it did with AMX, not on a Zen 4 with AVX512-BF16)")
    q, k, v = _qkv(batch, heads, t, s, d, dtype, seed=t + d)
    grad = torch.randn(batch, heads, t, d).to(dtype)
    inputs = [x.detach().requires_grad_() for x in (q, k, v)]
    out = NativeAttention.apply(*inputs, causal, 1.0 / math.sqrt(d), True)
    out.backward(grad)
    wide = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref = F.scaled_dot_product_attention(*wide, is_causal=causal)
    ref.backward(grad.double())
    assert out.dtype == dtype and out.shape == (batch, heads, t, d)
    scale = TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), ref, rtol=scale, atol=scale)
    for ours, theirs in zip(inputs, wide):
        torch.testing.assert_close(ours.grad.double(), theirs.grad, rtol=scale, atol=scale)


def test_tiles_refuse_what_they_do_not_compute(tiles):
    q, k, v = _qkv(1, 2, 8, 8, 16, torch.float64)
    with pytest.raises(RuntimeError, match="q must be a float32 or bfloat16 CPU tensor, got Double"):
        NativeAttention.apply(q, k, v, False, 0.25, True)
    q, k, v = _qkv(1, 2, 8, 9, 16, torch.bfloat16)
    with pytest.raises(RuntimeError, match="causal attention needs as many keys as queries"):
        NativeAttention.apply(q, k, v, True, 0.25, True)


def test_refuses_what_it_does_not_compute(native_gemv):
    q, k, v = _qkv(1, 2, 8, 8, 24, torch.float32)
    with pytest.raises(RuntimeError, match="head dimension must be a multiple of 16, got 24"):
        NativeAttention.apply(q, k, v, True, 0.2)
    q, k, v = _qkv(1, 2, 8, 9, 16, torch.float32)
    with pytest.raises(RuntimeError, match="causal attention needs as many keys as queries"):
        NativeAttention.apply(q, k, v, True, 0.25)


@pytest.fixture
def choice(native_gemv, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(kernel_choice, "_others_share", lambda start, end: 0.0)  # a quiet machine
    monkeypatch.setattr(kernel_choice, "_TRAINING_CHOSEN", {})
    monkeypatch.setenv(kernel_choice.TRAINING_ATTENTION_ENV_VAR, "measure")
    return tmp_path / "aiayn" / "kernels.json"


def test_auto_training_takes_ours_where_timed_faster_cached_and_the_override(choice, monkeypatch):
    timed, calls = [], []
    monkeypatch.setattr(kernel_choice, "_time_training_attention",
                        lambda dtype, shape, causal, rule, names: timed.append((shape, rule)) or {rule: 2.0, "native": 1.0, "native-tiles": 3.0})
    forward = torch.ops.aiayn_native.attention_forward
    monkeypatch.setattr(torch.ops.aiayn_native, "attention_forward", lambda *a: calls.append(a[0].shape) or forward(*a), raising=False)
    q, k, v = (x.detach().requires_grad_() for x in _qkv(2, 2, 16, 16, 16, torch.float32))
    for _ in range(2):
        out, _ = scaled_dot_product_attention(q, k, v, causal=True, backend="auto")
    assert timed == [((2, 2, 16, 16), "sdpa")] and len(calls) == 2  # timed once, ours taken both times
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
    key = "training attention 2x2x16x16 float32 causal (sdpa/native/native-tiles, 8-row blocks)"
    assert json.loads(choice.read_text())[kernel_choice.machine_key()] == {key: "native"}
    calls.clear()
    scaled_dot_product_attention(q, k, v, causal=True, backend="sdpa")  # a named backend is obeyed
    with torch.no_grad():  # inference: not ours
        scaled_dot_product_attention(q, k, v, causal=True, backend="auto")
    scaled_dot_product_attention(q, k, v, mask=torch.ones(16, 16, dtype=torch.bool), backend="auto")  # a mask: not ours
    _, weights = scaled_dot_product_attention(q, k, v, causal=True, backend="auto", return_weights=True)  # weights: the formula
    assert calls == [] and weights is not None and weights.shape == (2, 2, 16, 16)
    kernel_choice._TRAINING_CHOSEN.clear()
    monkeypatch.setenv(kernel_choice.TRAINING_ATTENTION_ENV_VAR, "rule")
    scaled_dot_product_attention(q, k, v, causal=True, backend="auto")
    assert calls == [] and len(timed) == 1
    monkeypatch.setenv(kernel_choice.TRAINING_ATTENTION_ENV_VAR, "ours")
    kernel_choice._TRAINING_CHOSEN.clear()
    with pytest.raises(ValueError, match=r"\$AIAYN_TRAINING_ATTENTION must be one of measure, rule, native, native-tiles, got 'ours'"):
        scaled_dot_product_attention(q, k, v, causal=True, backend="auto")


def test_the_choice_times_the_rules_kernel_and_ours(choice):
    times = kernel_choice._time_training_attention(torch.float32, (1, 2, 32, 16), True, "sdpa", rounds=1)
    assert set(times) == {"sdpa", "native"} and all(0 < t < 1e4 for t in times.values())
    assert kernel_choice.choose_training_attention(torch.float32, (1, 2, 32, 16), True, "sdpa") in ("sdpa", "native")
    assert attention.TRAINING_MAX_KEYS >= 1024
    assert kernel_choice.training_attention_candidates(torch.float32) == ("native", "native-tiles")


def test_bf16_choice_times_the_tiles_too_and_obeys_each_override(tiles, choice, monkeypatch):
    """The tiles are a third candidate (timed, cached under a name of all three); ``native-tiles`` forced is obeyed, and
    refused for bf16 where torch cannot pack its operands, naming what works."""
    times = kernel_choice._time_training_attention(torch.bfloat16, (1, 2, 32, 16), True, "sdpa", rounds=1, names=("native", "native-tiles"))
    assert set(times) == {"sdpa", "native", "native-tiles"} and all(0 < t < 1e4 for t in times.values())
    timed = []
    monkeypatch.setattr(kernel_choice, "_time_training_attention", lambda dtype, shape, causal, rule, names: timed.append((rule, names)) or
                        {rule: 3.0, "native": 2.0, "native-tiles": 1.0})
    calls = []
    forward = torch.ops.aiayn_native.attention_forward
    monkeypatch.setattr(torch.ops.aiayn_native, "attention_forward", lambda *a: calls.append(a[5]) or forward(*a), raising=False)
    q, k, v = (x.detach().requires_grad_() for x in _qkv(2, 2, 16, 16, 16, torch.bfloat16))
    out, _ = scaled_dot_product_attention(q, k, v, causal=True, backend="auto")
    out.float().sum().backward()
    (rule, names), = timed  # the rule's kernel at this shape (math or sdpa) and ours
    assert names == ("native", "native-tiles") and calls == [True] and torch.isfinite(q.grad.float()).all()
    key = f"training attention 2x2x16x16 bfloat16 causal ({rule}/native/native-tiles, 8-row blocks)"
    assert json.loads(choice.read_text())[kernel_choice.machine_key()] == {key: "native-tiles"}
    monkeypatch.setenv(kernel_choice.TRAINING_ATTENTION_ENV_VAR, "native-tiles")
    for dtype in (torch.bfloat16, torch.float32):
        kernel_choice._TRAINING_CHOSEN.clear()
        assert kernel_choice.choose_training_attention(dtype, (1, 2, 8, 16), True, "sdpa") == "native-tiles"
    monkeypatch.setattr(kernel_choice, "training_attention_candidates", lambda dtype: ("native",))
    kernel_choice._TRAINING_CHOSEN.clear()
    with pytest.raises(ValueError, match=r"\$AIAYN_TRAINING_ATTENTION=native-tiles: torch cannot pack bf16 operands .*; use measure, rule or native"):
        kernel_choice.choose_training_attention(torch.bfloat16, (1, 2, 8, 16), True, "sdpa")
    monkeypatch.setattr(kernel_choice, "gemv_available", lambda: False)  # no library at all: said, with the reason
    monkeypatch.setattr(kernel_choice, "unavailable_reason", lambda: "no C++ compiler")
    with pytest.raises(ValueError, match=r"\$AIAYN_TRAINING_ATTENTION=native-tiles: our training attention kernel cannot run here "
                                         r"\(no C\+\+ compiler\); use measure or rule"):
        kernel_choice.choose_training_attention(torch.float32, (1, 2, 8, 16), True, "sdpa")


def test_a_model_trains_through_it_as_through_the_rules_kernel(choice, monkeypatch):
    """A decoder-only model's loss and every parameter's gradient with our kernel forced equal the rule's within fp32."""
    from aiayn import build_model

    torch.manual_seed(0)
    model = build_model("tiny-decoder-only", n_heads=2, dropout=0.0, max_len=16)  # heads of 16
    calls = []
    forward = torch.ops.aiayn_native.attention_forward
    monkeypatch.setattr(torch.ops.aiayn_native, "attention_forward", lambda *a: calls.append(1) or forward(*a), raising=False)
    ids = torch.randint(model.config.vocab_size, (2, 12))
    grads = {}
    for mode in ("rule", "native"):
        monkeypatch.setenv(kernel_choice.TRAINING_ATTENTION_ENV_VAR, mode)
        kernel_choice._TRAINING_CHOSEN.clear()
        model.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
        loss.backward()
        grads[mode] = (loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        assert len(calls) == (2 if mode == "native" else 0)  # each layer through ours, only when asked
    torch.testing.assert_close(grads["native"][0], grads["rule"][0], rtol=1e-6, atol=1e-6)
    assert grads["native"][1].keys() == grads["rule"][1].keys()
    for name, grad in grads["rule"][1].items():
        torch.testing.assert_close(grads["native"][1][name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize(("precision", "kernel"), [("fp32", "native"), ("bf16", "native"), ("fp32", "native-tiles"), ("bf16", "native-tiles")])
def test_an_lm_run_through_our_attention_and_loss_resumes_bit_for_bit(native_gemv, tmp_path, monkeypatch, precision, kernel):
    """``aiayn train`` of a language model with our attention and our loss forced: 4 steps straight == 2 steps, stop,
    resume to 4 (every kernel gives each row and head to one thread: the same bits whatever the run)."""
    if kernel == "native-tiles" and precision == "bf16" and not native_gemv.tiles_available():
        pytest.skip("torch's small-matrix kernel takes no packed bf16 operands on this CPU (it did with AMX, not on a Zen 4 with AVX512-BF16)")
    from loop_fixtures import lm_config

    from aiayn.checkpoint.weights import read_safetensors
    from aiayn.training.config import ModelSection
    from aiayn.training.loop import train

    monkeypatch.setenv(kernel_choice.TRAINING_ATTENTION_ENV_VAR, kernel)
    monkeypatch.setenv(kernel_choice.LOSS_ENV_VAR, "native")
    monkeypatch.setattr(kernel_choice, "_NATIVE_CHOSEN", {})
    monkeypatch.setattr(kernel_choice, "_TRAINING_CHOSEN", {})
    calls = []
    forward, rows = torch.ops.aiayn_native.attention_forward, torch.ops.aiayn_native.cross_entropy_rows
    monkeypatch.setattr(torch.ops.aiayn_native, "attention_forward", lambda *a: calls.append(("attention", a[5])) or forward(*a), raising=False)
    monkeypatch.setattr(torch.ops.aiayn_native, "cross_entropy_rows", lambda *a: calls.append("loss") or rows(*a), raising=False)

    def config(name: str, **loop: object):
        config = lm_config(tmp_path / name, steps=4, save_every=2, eval_every=4, precision=precision, **loop)
        config.model = ModelSection(preset="tiny-decoder-only", n_heads=2, dropout=0.0, max_len=16)  # heads of 16
        return config

    straight = train(config("a"))
    assert {("attention", kernel == "native-tiles"), "loss"} <= set(calls)  # the steps ran our attention (this kernel) and our loss
    train(config("b", stop_after=2))
    resumed = train(config("b"))
    a, _ = read_safetensors(straight.run_dir / "step-000004" / "model.safetensors")
    b, _ = read_safetensors(resumed.run_dir / "step-000004" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_operators_have_shapes_for_graphs(native_gemv):
    """The operators' fake implementations (what torch.compile traces) take the tiles flag and give the real shapes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 3, 5, 16, dtype=torch.bfloat16)
        out, lse = torch.ops.aiayn_native.attention_forward(q, q, q, True, 0.25, True)
        dq, dk, dv = torch.ops.aiayn_native.attention_backward(q, q, q, q, out, lse, True, 0.25, True)
    assert out.shape == dq.shape == dk.shape == dv.shape == q.shape and lse.shape == (2, 3, 5) and lse.dtype == torch.float32
