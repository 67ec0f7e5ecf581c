"""Our matrix-vector kernel (aiayn.inference.gemv): F.linear's product in float64 to fp32 rounding, for every width
its vector loops and their tails meet, on one thread and two, over fp32, bf16 and int8 weights (an int8 layer's one
row is its dequantised product); greedy decoding through it gives F.linear's tokens; it refuses what it cannot take,
naming what works; a failed build leaves nothing behind and says why."""

import copy
import logging
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from aiayn.inference import gemv
from aiayn.inference.precision import PackedLinear, replace_linears


@pytest.mark.parametrize("threads", [1, 2])
def test_the_product_is_float64s_to_fp32_rounding(native_gemv, threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        # widths: below one vector, a vector's tail, AVX2's and AVX-512's blocks and their tails; rows: 1 to 2 blocks
        for out_features, in_features in [(1, 1), (3, 5), (17, 100), (40, 64), (9, 200), (1100, 768), (7, 3072)]:
            w, b = torch.randn(out_features, in_features), torch.randn(out_features)
            for x in (torch.randn(in_features), torch.randn(1, 1, in_features)):
                for bias in (b, None):
                    y = gemv.gemv_linear(x, w, bias)
                    ref = torch.nn.functional.linear(x.double(), w.double(), None if bias is None else bias.double())
                    assert y.shape == ref.shape and y.dtype == torch.float32
                    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5 * in_features ** 0.5)
    finally:
        torch.set_num_threads(before)


def test_the_operator_gives_the_rows_shape_itself(native_gemv):
    """The output takes x's shape with its last dimension out_features, from the operator (no view after it), and a
    0-dimensional x is refused naming what it takes."""
    w = torch.randn(6, 4)
    for shape in [(4,), (1, 4), (1, 1, 4)]:
        assert torch.ops.aiayn_native.gemv(torch.randn(shape), w, None, None, 0).shape == (*shape[:-1], 6)
    with pytest.raises(RuntimeError, match=r"x has shape \[\], the weight takes 1 features: one row of 1 elements or rows"):
        torch.ops.aiayn_native.gemv(torch.tensor(1.0), torch.randn(6, 1), None, None, 0)


def test_bf16_weights_and_int8_weights_with_their_scales(native_gemv):
    torch.manual_seed(0)
    for out_features, in_features in [(3, 5), (17, 100), (1100, 768)]:
        x, bias = torch.randn(1, in_features), torch.randn(out_features)
        w = torch.randn(out_features, in_features).bfloat16()
        y = gemv.gemv_linear(x.bfloat16(), w, bias.bfloat16())
        ref = torch.nn.functional.linear(x.bfloat16().double(), w.double(), bias.bfloat16().double())
        assert y.dtype == torch.bfloat16
        torch.testing.assert_close(y.double(), ref, rtol=1e-2, atol=1e-2)  # the sums in fp32, the output rounded to bf16
        q = torch.randint(-127, 128, (out_features, in_features), dtype=torch.int8)
        scale = torch.rand(out_features) / 64
        ref = torch.nn.functional.linear(x.double(), q.double() * scale.double()[:, None], bias.double())
        # fp32 sums of up to 768 products of about 30 here: a build without vectors sums them in order (2.7e-5 off at most,
        # -march=x86-64 on a Zen 4, 2026-12-07), the vector builds in 64 partial sums
        torch.testing.assert_close(gemv.gemv_int8(x, q, scale, bias).double(), ref, rtol=1e-5, atol=1e-4)
        assert gemv.gemv_int8(x.bfloat16(), q, scale, None).dtype == torch.bfloat16


def test_a_bf16_row_gives_the_fp32_sums_rounded_once_to_bf16(native_gemv):
    """The kernel takes a bf16 row and bias itself and writes bf16: the fp32 sums of the exact products rounded once to
    bf16, whatever the bias's dtype. Bit for bit the fp32 product of the same values (widened exactly, summed in the
    same order) where the row is widened: an int8 weight's, and a bf16 weight's on a CPU without AVX512-BF16 or at a
    width that is no multiple of 32. Elsewhere AVX512-BF16 sums the products in pairs, another order: within half a bf16
    step (plus the fp32 sums' rounding) of the exact product, and the fp32 product's bits in nearly every output."""
    torch.manual_seed(0)
    for out_features, in_features in [(3, 5), (17, 100), (1100, 768), (700, 96), (300, 3072)]:
        x = torch.randn(1, in_features).bfloat16()
        w = torch.randn(out_features, in_features).bfloat16()
        q, scale = torch.randint(-127, 128, (out_features, in_features), dtype=torch.int8), torch.rand(out_features) / 64
        for bias in (None, torch.randn(out_features).bfloat16(), torch.randn(out_features)):
            wide = None if bias is None else bias.float()
            y = gemv.gemv_linear(x, w, bias)
            assert y.dtype == torch.bfloat16
            widened = gemv.gemv_linear(x.float(), w.float(), wide).bfloat16()
            if in_features % 32:
                assert torch.equal(y, widened)
            else:
                exact = torch.nn.functional.linear(x.double(), w.double(), None if bias is None else bias.double())
                bound = exact.abs() * 2.0 ** -8 + 1e-6 * (x.double().abs() @ w.double().abs().T)
                assert bool(((y.double() - exact).abs() <= bound).all()), (out_features, in_features)
                assert (y == widened).float().mean() >= 0.99, (out_features, in_features)
            assert torch.equal(gemv.gemv_int8(x, q, scale, bias), gemv.gemv_int8(x.float(), q, scale, wide).bfloat16())


def test_prefetching_changes_no_bit_and_a_negative_distance_is_refused(native_gemv):
    """The prefetching variant (the weights asked for ahead into L2) sums in the same order: the same bits, for every
    weight dtype, as a layer set to ``native-prefetch`` gives; a distance below 0 is an error naming it."""
    torch.manual_seed(0)
    for out_features, in_features in [(3, 5), (6, 17), (17, 100), (33, 777), (1100, 768), (7, 3072)]:  # scalar tails too
        x, bias = torch.randn(1, in_features), torch.randn(out_features)
        w = torch.randn(out_features, in_features)
        q, scale = torch.randint(-127, 128, (out_features, in_features), dtype=torch.int8), torch.rand(out_features) / 64
        for ahead in (64, gemv.PREFETCH, 1 << 20):  # past the end of the weight too: a hint, no fault
            assert torch.equal(gemv.gemv_linear(x, w, bias, ahead), gemv.gemv_linear(x, w, bias))
            assert torch.equal(gemv.gemv_linear(x.bfloat16(), w.bfloat16(), None, ahead), gemv.gemv_linear(x.bfloat16(), w.bfloat16(), None))
            assert torch.equal(gemv.gemv_int8(x, q, scale, bias, ahead), gemv.gemv_int8(x, q, scale, bias))
    layer = PackedLinear(nn.Linear(768, 40), one="native-prefetch", many="plain")
    x = torch.randn(1, 768)
    with torch.no_grad():
        assert torch.equal(layer(x), gemv.gemv_linear(x, layer.weight, layer.bias, gemv.PREFETCH))
    with pytest.raises(RuntimeError, match="prefetch is a distance in bytes, 0 or more, got -64"):
        gemv.gemv_linear(x, torch.randn(4, 768), None, -64)


def test_an_int8_layer_through_it_computes_its_dequantized_weight(native_gemv):
    from aiayn.inference.quantization import Int8Linear

    torch.manual_seed(0)
    layer = Int8Linear.from_linear(nn.Linear(96, 40))
    layer.one = "native"
    x = torch.randn(1, 1, 96)
    with torch.no_grad():  # one row in fp32: no bf16 activations, so the fp32 product of the int8 grid
        torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, layer.dequantized(), layer.bias), rtol=1e-5, atol=1e-5)
        rows = torch.randn(3, 96)  # several rows: torch's kernel, as before
        torch.testing.assert_close(layer(rows), torch.nn.functional.linear(rows, layer.dequantized(), layer.bias), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_few_rows_give_each_rows_own_result_bit_for_bit(native_gemv, threads):
    """Several rows read each weight row once for all of them; every row's sums are the operations of its call alone, so
    a row of a batch gives exactly what it gives alone (batched decoding = one row at a time), for every width the
    loops and their tails meet, fp32, bf16 and int8 weights, fp32 and bf16 rows, with and without prefetching."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        for out_features, in_features in [(3, 5), (17, 100), (40, 64), (9, 200), (130, 768), (7, 3072)]:
            w, b = torch.randn(out_features, in_features), torch.randn(out_features)
            q = torch.randint(-127, 128, (out_features, in_features), dtype=torch.int8)
            scale = torch.rand(out_features) + 0.1
            for rows in (2, 3, 4, 5, 8):
                x = torch.randn(rows, in_features)
                for prefetch in (0, gemv.PREFETCH):
                    cases = [(gemv.gemv_linear, (w, b)), (gemv.gemv_linear, (w.bfloat16(), b.bfloat16())), (gemv.gemv_int8, (q, scale, b))]
                    for call, args in cases:
                        xs = x.to(args[0].dtype) if args[0].is_floating_point() else x
                        for inputs in (xs, xs.bfloat16()) if call is gemv.gemv_int8 else (xs,):
                            y = call(inputs, *args, prefetch)
                            alone = torch.stack([call(row, *args, prefetch) for row in inputs])
                            assert y.shape == (rows, out_features) and y.dtype == inputs.dtype
                            assert torch.equal(y, alone), (call.__name__, out_features, in_features, rows, prefetch, inputs.dtype)
            ref = torch.nn.functional.linear(x.double(), q.double() * scale.double()[:, None], b.double())
            torch.testing.assert_close(gemv.gemv_int8(x, q, scale, b).double(), ref, rtol=1e-5, atol=1e-4 * in_features ** 0.5)
    finally:
        torch.set_num_threads(before)


def test_rows_of_another_width_and_no_rows(native_gemv):
    w = torch.randn(4, 6)
    with pytest.raises(RuntimeError, match=r"x has shape \[2, 5\], the weight takes 6 features: one row of 6 elements or rows \(\.\.\., 6\)"):
        gemv.gemv_linear(torch.randn(2, 5), w, None)
    assert gemv.gemv_int8(torch.randn(0, 6), torch.zeros(4, 6, dtype=torch.int8), torch.ones(4), None).shape == (0, 4)


def test_an_int8_layer_takes_its_timed_kernel_for_a_few_rows_and_torchs_for_more(native_gemv):
    from aiayn.inference.quantization import Int8Linear

    torch.manual_seed(0)
    layer = Int8Linear.from_linear(nn.Linear(96, 40))
    layer.many = "native"
    exact = lambda x: torch.nn.functional.linear(x, layer.dequantized(), layer.bias)  # noqa: E731
    with torch.no_grad():
        few = torch.randn(2, gemv.FEW_ROWS // 2, 96)  # FEW_ROWS rows: ours, fp32 sums of the int8 grid
        torch.testing.assert_close(layer(few), exact(few), rtol=1e-5, atol=1e-5)
        more = torch.randn(gemv.FEW_ROWS + 1, 96)  # more: torch's, with bf16 activations
        assert not torch.allclose(layer(more), exact(more), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(layer(more), exact(more), rtol=2e-2, atol=2e-2)


def test_a_layer_takes_its_kernel_for_a_few_rows_and_onednns_packed_weight_beyond(native_gemv, monkeypatch):
    torch.manual_seed(0)
    layer = PackedLinear(nn.Linear(96, 40), one="native", many="native-prefetch")
    assert layer._packed is not None  # held for the calls beyond FEW_ROWS
    packed = []
    monkeypatch.setattr(layer, "packed_forward", lambda x: packed.append(x.shape[:-1].numel()) or torch.nn.functional.linear(x, layer.weight, layer.bias))
    with torch.no_grad():
        few = torch.randn(2, gemv.FEW_ROWS // 2, 96)
        assert torch.equal(layer(few), gemv.gemv_linear(few, layer.weight, layer.bias, gemv.PREFETCH))
        layer(torch.randn(gemv.FEW_ROWS + 1, 96))
    assert packed == [gemv.FEW_ROWS + 1]


def test_other_dtypes_and_strided_weights_take_f_linear(native_gemv):
    w = torch.randn(8, 6)
    x = torch.randn(1, 6)
    torch.testing.assert_close(gemv.gemv_linear(x, w.t().contiguous().t(), None), x @ w.t())  # a transposed view
    torch.testing.assert_close(gemv.gemv_linear(x.double(), w.double(), None), x.double() @ w.double().t())


def test_greedy_decoding_through_it_gives_f_linears_tokens(native_gemv):
    from aiayn import build_model
    from aiayn.decoding import CausalLMDecoder, GenerationConfig, generate

    torch.manual_seed(0)
    plain = build_model("tiny-decoder-only", vocab_size=50, bias=True).eval()
    native = copy.deepcopy(plain)
    linears = [(n, m) for n, m in native.named_modules() if isinstance(m, nn.Linear)]
    replace_linears(native, linears, lambda name, linear: PackedLinear(linear, one="native", many="plain"))
    prompt = torch.randint(4, 50, (2, 5))
    config = GenerationConfig(max_new_tokens=12, greedy=True, eos_id=None)
    outs = [generate(CausalLMDecoder(m, static_cache=True), prompt, None, config) for m in (native, plain)]
    assert outs[0].sequences() == outs[1].sequences()
    with torch.no_grad():
        torch.testing.assert_close(native(prompt[:1, :1]), plain(prompt[:1, :1]), rtol=1e-5, atol=1e-5)


def test_a_layer_refuses_the_kernel_where_it_cannot_run(monkeypatch):
    with pytest.raises(ValueError, match=r"one='native' takes float32 or bfloat16 weights, got torch.float16 \(use packed, plain or split\)"):
        PackedLinear(nn.Linear(4, 4).to(torch.float16), one="native")
    monkeypatch.setattr("aiayn.inference.gemv.unavailable_reason", lambda: "no C++ compiler (c++ or g++, or $CXX) on PATH")
    with pytest.raises(ValueError, match=r"one='native' cannot run here: no C\+\+ compiler .* \(use packed, plain or split\)"):
        PackedLinear(nn.Linear(4, 4), one="native")


def test_a_failed_build_says_why_and_leaves_no_file(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # a compiler that always fails
    with caplog.at_level(logging.WARNING, logger="aiayn.inference.gemv"):
        reason = gemv._load.__wrapped__()  # the uncached build: the process's own loaded kernel is untouched
    names = ", ".join(path.name for path in gemv.SOURCES)  # gemv.cpp, attend_one.cpp, ... norm.cpp
    assert names.startswith("gemv.cpp, gemv_int4.cpp, attend_one.cpp") and names.endswith("argmax.cpp, norm.cpp, dropout.cpp")
    assert reason is not None and reason.startswith(f"building {names} with false failed")
    assert f"not used here: building {names} with false failed" in caplog.text
    assert [p.suffix for p in (tmp_path / "aiayn" / "native").iterdir()] == [".lock"]  # the builders' lock, no half-written library


def test_processes_started_together_build_the_library_once(tmp_path):
    """Two processes finding no library (torchrun's ranks, test workers): one builds, the other waits for it and loads
    what it built. A fake compiler counts the links and writes an empty file (which then does not load)."""
    count = tmp_path / "links"
    compiler = tmp_path / "fake-c++"
    compiler.write_text('#!/bin/sh\nout=""; prev=""\nfor a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done\n'
                        '[ "$1" = "-c" ] || echo link >> "$LINKS"\nsleep 1\n: > "$out"\n')
    compiler.chmod(0o755)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "CXX": str(compiler), "LINKS": str(count)}
    code = "from aiayn.inference import gemv; print(gemv.unavailable_reason())"
    runs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    reasons = [run.communicate(timeout=120)[0] for run in runs]
    assert count.read_text().splitlines() == ["link"]
    assert all(reason.startswith("loading ") for reason in reasons), reasons


@pytest.mark.parametrize("threads", [1, 2])
def test_the_epilogues_give_the_bits_of_the_operator_after_the_product(native_gemv, threads):
    """gemv_add_ (the C++ decoding step's residual connections): residual.add_(gemv(x, ...)) in place, and
    gemv_activation (its feed-forward's hidden layer): gelu_tanh(gemv(x, ...)), relu_ and relu_().mul_() of itself, bit
    for bit, for fp32, bf16, int8 and 4-bit weights, one row and a few, fp32 and bf16 activations; a residual of another
    shape or dtype, one that overlaps x, and an unknown activation are refused."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        out, inp = 96, 128
        w = torch.randn(out, inp)
        codes = torch.randint(0, 256, (out, inp // 2), dtype=torch.uint8)
        scale_least = torch.stack([torch.rand(out, inp // 32) / 8, -torch.rand(out, inp // 32)], dim=1).bfloat16()
        weights = [(w, None), (w.bfloat16(), None), (torch.randint(-127, 128, (out, inp), dtype=torch.int8), torch.rand(out) / 64),
                   (codes, scale_least)]
        for weight, scale in weights:
            for dtype in (torch.float32, torch.bfloat16):
                for rows in ((1, 1), (1, 5)):
                    x, residual, bias = torch.randn(*rows, inp, dtype=dtype), torch.randn(*rows, out, dtype=dtype), torch.randn(out)
                    product = torch.ops.aiayn_native.gemv(x, weight, scale, bias, 0)
                    got = residual.clone()
                    assert torch.ops.aiayn_native.gemv_add_(got, x, weight, scale, bias, 0) is got  # in place
                    assert torch.equal(got, residual.clone().add_(product)), (weight.dtype, dtype, rows)
                    relu = product.clone().relu_()
                    for name, want in [("gelu_tanh", torch.ops.aiayn_native.gelu_tanh(product)), ("relu", relu),
                                       ("relu2", relu.clone().mul_(relu))]:  # as the eager feed-forward computes each
                        hidden = torch.ops.aiayn_native.gemv_activation(x, weight, scale, bias, 0, name)  # in the epilogue
                        assert torch.equal(hidden, want), (name, weight.dtype, dtype, rows)
        x = torch.randn(1, 1, inp)
        with pytest.raises(RuntimeError, match=r"gemv_add_: the residual must be contiguous, of x's dtype \(Float\) and the product's shape"):
            torch.ops.aiayn_native.gemv_add_(torch.zeros(1, 1, out + 1), x, w, None, None, 0)
        with pytest.raises(RuntimeError, match=r"gemv_add_: the residual must be contiguous, of x's dtype"):
            torch.ops.aiayn_native.gemv_add_(torch.zeros(1, 1, out, dtype=torch.bfloat16), x, w, None, None, 0)
        with pytest.raises(RuntimeError, match="gemv_activation: activation must be 'gelu_tanh', 'relu' or 'relu2', got 'silu'"):
            torch.ops.aiayn_native.gemv_activation(x, w, None, None, 0, "silu")
        square = torch.randn(inp, inp)
        with pytest.raises(RuntimeError, match="gemv_add_: the residual and x share memory"):
            torch.ops.aiayn_native.gemv_add_(x, x, square, None, None, 0)
    finally:
        torch.set_num_threads(before)


def test_gelu_tanh_gives_each_element_the_same_bits_wherever_a_span_starts(native_gemv):
    """The epilogue applies GELU to each thread's block of outputs: an element's bits must not depend on where a block
    starts or ends (the last few of a span take the vector formula too)."""
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(100, dtype=dtype) * 4
        whole = torch.ops.aiayn_native.gelu_tanh(x)
        for start, stop in [(0, 7), (3, 20), (5, 100), (17, 33), (99, 100)]:
            assert torch.equal(torch.ops.aiayn_native.gelu_tanh(x[start:stop].clone()), whole[start:stop]), (dtype, start, stop)
        grad = torch.randn(100, dtype=dtype)
        back = torch.ops.aiayn_native.gelu_tanh_backward(grad, x)
        assert torch.equal(torch.ops.aiayn_native.gelu_tanh_backward(grad[5:30].clone(), x[5:30].clone()), back[5:30])
