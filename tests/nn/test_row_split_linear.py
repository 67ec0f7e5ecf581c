"""bf16 training's Linear layers with each product in the layout timed fastest: rows in one call or two, transposes
written out (aiayn.nn.onednn_linear.RowSplitLinear): the values and gradients of ``F.linear`` (against float64, within
bf16's rounding, and against each other), under autocast and on bf16 weights, the same state, and a choice per shape at
the batch's exact rows that is timed, cached and overridable (aiayn.inference.kernel_choice.choose_row_splits); an LM
run with it resumes bit for bit. The transpose kernel equals ``x.t().contiguous()``."""

import json
import logging

import pytest
import torch
import torch.nn.functional as F
from loop_fixtures import lm_config
from torch import nn

from aiayn.checkpoint.weights import read_safetensors
from aiayn.inference import gemv, kernel_choice
from aiayn.nn.onednn_linear import (
    RowSplitLinear,
    RowSplitLinearFunction,
    layout_flags,
    split_product,
    transpose,
    use_training_kernels,
)
from aiayn.training.loop import train
from aiayn.training.metrics_log import read_metrics

SPLITS = [(False, False), (True, False), (False, True), (True, True)]  # (forward, input gradient) rows in two calls
TRANSPOSES = [(False, False), (True, False), (False, True), (True, True)]  # (forward, weight gradient) transposes written out
native = pytest.mark.skipif(not gemv.available(), reason="our C++ library did not build here (aiayn.inference.gemv)")


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("transposes", [(False, False), pytest.param((True, True), marks=native), pytest.param((True, False), marks=native),
                                        pytest.param((False, True), marks=native)])
@pytest.mark.parametrize("splits", SPLITS)
def test_values_and_gradients_are_f_linears(bias, splits, transposes, linear_results):
    g = torch.Generator().manual_seed(0)
    x64 = torch.randn(3, 7, 24, generator=g, dtype=torch.float64)  # 21 rows: an odd count splits 10 + 11
    w64 = torch.randn(40, 24, generator=g, dtype=torch.float64) / 5
    b64 = torch.randn(40, generator=g, dtype=torch.float64) if bias else None
    grad64 = torch.randn(3, 7, 40, generator=g, dtype=torch.float64)
    # the inputs bf16 values, so that the float64 reference differs only by how the products round and sum
    x64, w64, grad64 = (t.bfloat16().double() for t in (x64, w64, grad64))
    b64 = b64.bfloat16().double() if bias else None

    def run(fn, dtype):
        return linear_results(fn, dtype, x64, w64, b64, grad64)

    ours = run(lambda x, w, b: RowSplitLinearFunction.apply(x, w, b, *splits, *transposes), torch.bfloat16)
    plain = run(lambda x, w, b: RowSplitLinearFunction.apply(x, w, b, False, False), torch.bfloat16)
    torch_bf16 = run(F.linear, torch.bfloat16)
    reference = run(F.linear, torch.float64)
    for name, a, b, c, d in zip(("output", "dL/dx", "dL/dW", "dL/db"), ours, plain, torch_bf16, reference):
        assert a.shape == d.shape, name
        torch.testing.assert_close(a, d, rtol=1e-2, atol=2e-2, msg=name)  # the bf16 result's rounding
        torch.testing.assert_close(a, b, rtol=8e-3, atol=1e-2, msg=name)  # split or not: the same sums
        torch.testing.assert_close(a, c, rtol=8e-3, atol=1e-2, msg=name)


@native
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64, torch.int8])
def test_the_transpose_kernel_is_torchs(dtype):
    """Every register block and edge: sizes off the 8- and 16-element blocks and the 64 x 256 tiles, a row-strided view,
    one row, no rows; 1- and 8-byte elements through torch's copy."""
    g = torch.Generator().manual_seed(0)
    for rows, cols in ((1, 1), (3, 17), (16, 16), (70, 300), (300, 70), (257, 1), (0, 5)):
        x = (torch.randn(rows, cols + 3, generator=g) * 50).to(dtype)[:, 2:cols + 2]  # a view: rows cols + 3 apart
        got = transpose(x)
        assert got.is_contiguous() and got.dtype == dtype and torch.equal(got, x.t()), (rows, cols)
    with pytest.raises(RuntimeError, match="2-D CPU tensor"):
        transpose(torch.zeros(2, 2, 2))


def test_layout_flags_read_every_choice():
    flags = [layout_flags(choice) for choice in kernel_choice.ROW_SPLITS]
    assert flags[0] == dict.fromkeys(("split_forward", "split_input_grad", "transpose_forward", "transpose_weight_grad"), False)
    assert len({tuple(f.values()) for f in flags}) == len(kernel_choice.ROW_SPLITS) == 12  # 3 forwards x 2 x 2
    assert not any(f["split_forward"] and f["transpose_forward"] for f in flags)


def test_split_product_writes_both_halves():
    a, b, bias = torch.randn(5, 3).bfloat16(), torch.randn(3, 4).bfloat16(), torch.randn(4).bfloat16()
    for rows in (1, 2, 5):
        for with_bias in (None, bias):
            torch.testing.assert_close(split_product(a[:rows], b, with_bias, True), split_product(a[:rows], b, with_bias, False))


def test_the_layer_under_autocast_and_on_bf16_weights_and_fp32_without():
    torch.manual_seed(0)
    layer = nn.Linear(16, 8)
    split = nn.Linear(16, 8)
    split.load_state_dict(layer.state_dict())
    split.__class__ = RowSplitLinear
    split.split_forward = split.split_input_grad = True
    x = torch.randn(6, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected, got = layer(x), split(x)
    assert got.dtype == torch.bfloat16 and got.grad_fn.name() == "RowSplitLinearFunctionBackward"
    torch.testing.assert_close(got, expected)
    got.float().square().sum().backward()
    expected.float().square().sum().backward()
    assert split.weight.grad.dtype == torch.float32  # the fp32 parameter's gradient, through autocast's cast
    torch.testing.assert_close(split.weight.grad, layer.weight.grad, rtol=1e-2, atol=1e-2)
    assert torch.equal(split(x), layer(x))  # fp32 without autocast: F.linear itself
    with torch.no_grad():
        split.weight.data, split.bias.data = split.weight.bfloat16(), split.bias.bfloat16()  # a bf16 copy (master weights)
    y = split(x.bfloat16())
    assert y.grad_fn.name() == "RowSplitLinearFunctionBackward"
    torch.testing.assert_close(y, F.linear(x.bfloat16(), split.weight, split.bias))
    assert list(split.state_dict()) == ["weight", "bias"]


def test_the_choice_is_timed_at_the_exact_rows_cached_and_obeyed(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv(kernel_choice.ENV_VAR, "measure")
    monkeypatch.setattr(kernel_choice, "_others_share", lambda start, end: 0.0)  # a quiet machine (the other test worker is not)
    timed = []

    def fake(weight, rows):  # 8 -> 16: the input gradient faster split; 16 -> 8: the forward, and the weight gradient
        timed.append((tuple(weight.shape), rows))  # transposed; 8 -> 8: none (and a transposed forward slower)
        grad_split, forward_split = {(16, 8): (1.0, 2.0), (8, 16): (2.0, 1.0), (8, 8): (2.0, 2.0)}[tuple(weight.shape)]
        return {"forward": 1.5, "forward, two calls": forward_split, "input grad": 1.5, "input grad, two calls": grad_split,
                "weight grad": 1.5, "forward, weight transposed": 1.6,
                "weight grad, input transposed": 1.0 if tuple(weight.shape) == (8, 16) else 2.0}

    monkeypatch.setattr(kernel_choice, "_time_row_splits", fake)
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8), nn.Linear(8, 8), nn.Linear(8, 16))
    keys = list(model.state_dict())
    with caplog.at_level(logging.INFO, logger="aiayn.inference.kernel_choice"):
        assert use_training_kernels(model, rows=1024, dtype=torch.bfloat16) == 3
    assert [type(m) for m in model] == [RowSplitLinear, RowSplitLinear, nn.Linear, RowSplitLinear]
    assert [(m.split_forward, m.split_input_grad, m.transpose_forward, m.transpose_weight_grad) for m in (model[0], model[1], model[3])] == [
        (False, True, False, False), (True, False, False, True), (False, True, False, False)]
    assert sorted(timed) == [((8, 8), 1024), ((8, 16), 1024), ((16, 8), 1024)]  # each shape once, at the rows given (no cap)
    assert "8->16 bfloat16 train 1024 rows (product layouts): forward 1.500, forward, two calls 2.000" in caplog.text
    table = json.loads((tmp_path / "aiayn" / "kernels.json").read_text())[kernel_choice.machine_key()]
    assert table == {"8->16 bfloat16 train 1024 rows (product layouts)": "split-input-grad",
                     "16->8 bfloat16 train 1024 rows (product layouts)": "split-forward+transposed-weight-grad",
                     "8->8 bfloat16 train 1024 rows (product layouts)": "plain"}
    assert list(model.state_dict()) == keys

    monkeypatch.setattr(kernel_choice, "_time_row_splits", lambda w, rows: pytest.fail("timed a shape the cache decides"))
    again = nn.Sequential(nn.Linear(16, 8))
    assert use_training_kernels(again, rows=1024, dtype=torch.bfloat16) == 1 and again[0].split_forward
    timed.clear()
    monkeypatch.setattr(kernel_choice, "_time_row_splits", fake)
    assert use_training_kernels(nn.Sequential(nn.Linear(16, 8)), rows=2048, dtype=torch.bfloat16) == 1
    assert timed == [((8, 16), 2048)]  # other rows: timed again
    monkeypatch.setenv(kernel_choice.ENV_VAR, "plain")
    plain = nn.Sequential(nn.Linear(16, 8))
    assert use_training_kernels(plain, rows=1024, dtype=torch.bfloat16) == 0 and type(plain[0]) is nn.Linear


def test_the_real_timing_times_each_layout():
    times = kernel_choice._time_row_splits(torch.randn(16, 8), rows=32)
    layouts = {**kernel_choice.FORWARD_LAYOUTS, **kernel_choice.INPUT_GRAD_LAYOUTS, **kernel_choice.WEIGHT_GRAD_LAYOUTS}
    transposed = {name for name, part in layouts.items() if part.startswith("transposed")}
    assert set(times) == set(layouts) - (set() if gemv.available() else transposed) and min(times.values()) > 0


@pytest.mark.parametrize(("precision", "layout"), [
    ("bf16", "split-forward+split-input-grad"), ("bf16-master", "split-forward+split-input-grad"),
    pytest.param("bf16-master", "transposed-forward+split-input-grad+transposed-weight-grad", marks=native)])
def test_an_lm_run_splits_where_chosen_and_resumes_bit_for_bit(tmp_path, monkeypatch, caplog, precision, layout):
    """``aiayn train`` of a language model in bf16 takes the layouts chosen (here forced for every layer: rows split, or
    transposes written out): 6 steps straight == 3 steps, stop, resume to 6, and its loss stays the plain run's within
    bf16 rounding."""
    chosen = []

    def forced(weights, rows):
        chosen.append(rows)
        return [layout] * len(weights)

    def config(name: str, **loop: object):
        return lm_config(tmp_path / name, steps=6, save_every=3, eval_every=6, precision=precision, **loop)

    plain = train(config("plain"))
    monkeypatch.setattr(kernel_choice, "choose_row_splits", forced)
    with caplog.at_level(logging.INFO, logger="aiayn.nn.onednn_linear"):
        straight = train(config("a"))
    assert "bf16 training matmuls: rows split in two calls or a transpose written out for 13 of 13 Linear layers (timed per shape at 64 rows" in caplog.text
    train(config("b", stop_after=3))
    resumed = train(config("b"))
    assert chosen == [4 * 16] * 3  # each run chose once, at its batches' rows (4 windows of 16)
    losses = [{r["step"]: r["loss"] for r in read_metrics(run.run_dir) if "loss" in r} for run in (plain, straight, resumed)]
    assert sorted(losses[1]) == list(range(1, 7)) and losses[1] == losses[2]
    assert losses[0].keys() == losses[1].keys() and all(abs(losses[0][k] - losses[1][k]) <= 0.01 * abs(losses[0][k]) for k in losses[0])
    a, _ = read_safetensors(straight.run_dir / "step-000006" / "model.safetensors")
    b, _ = read_safetensors(resumed.run_dir / "step-000006" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_self_attentions_fused_product_is_timed_and_run_at_its_own_shape(tmp_path, monkeypatch):
    """In training self-attention multiplies Q, K and V in one product: its w_q is timed at the three's shape and that
    product runs through w_q's kernel."""
    from aiayn import build_model

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv(kernel_choice.ENV_VAR, "measure")
    timed = []

    def fake(weight, rows):
        timed.append(tuple(weight.shape))
        return {"forward": 2.0, "forward, two calls": 1.0, "input grad": 2.0, "input grad, two calls": 1.0, "weight grad": 1.0}

    monkeypatch.setattr(kernel_choice, "_time_row_splits", fake)
    torch.manual_seed(0)
    model = build_model("tiny-decoder-only", d_model=16, d_ff=32, n_heads=2, n_layers=1, vocab_size=24)
    use_training_kernels(model, rows=8, dtype=torch.bfloat16)
    assert (48, 16) in timed  # Q, K and V of d_model 16 as one (48, 16) weight
    shapes = []
    apply = RowSplitLinearFunction.apply
    monkeypatch.setattr(RowSplitLinearFunction, "apply", lambda x, w, *rest: shapes.append(tuple(w.shape)) or apply(x, w, *rest))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randint(0, 24, (2, 4))).float().sum().backward()
    assert (48, 16) in shapes and model.decoder.layers[0].self_attn.w_q.weight.grad is not None
