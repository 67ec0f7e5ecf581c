"""bf16 training's Linear layers with a product's rows in one call or two (aiayn.nn.onednn_linear.RowSplitLinear): the
values and gradients of ``F.linear`` (against float64, within bf16's rounding, and against each other), under
autocast and on bf16 weights, the same state, and a choice per shape at the batch's exact rows that is timed, cached
and overridable (aiayn.inference.kernel_choice.choose_row_splits); an LM run with it resumes bit for bit."""

import json
import logging

import pytest
import torch
import torch.nn.functional as F
from loop_fixtures import lm_config
from torch import nn

from aiayn.checkpoint.weights import read_safetensors
from aiayn.inference import kernel_choice
from aiayn.nn.onednn_linear import RowSplitLinear, RowSplitLinearFunction, split_product, use_training_kernels
from aiayn.training.loop import train
from aiayn.training.metrics_log import read_metrics

SPLITS = [(False, False), (True, False), (False, True), (True, True)]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("splits", SPLITS)
def test_values_and_gradients_are_f_linears(bias, splits, linear_results):
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

    ours = run(lambda x, w, b: RowSplitLinearFunction.apply(x, w, b, *splits), torch.bfloat16)
    plain = run(lambda x, w, b: RowSplitLinearFunction.apply(x, w, b, False, False), torch.bfloat16)
    torch_bf16 = run(F.linear, torch.bfloat16)
    reference = run(F.linear, torch.float64)
    for name, a, b, c, d in zip(("output", "dL/dx", "dL/dW", "dL/db"), ours, plain, torch_bf16, reference):
        assert a.shape == d.shape, name
        torch.testing.assert_close(a, d, rtol=1e-2, atol=2e-2, msg=name)  # the bf16 result's rounding
        torch.testing.assert_close(a, b, rtol=8e-3, atol=1e-2, msg=name)  # split or not: the same sums
        torch.testing.assert_close(a, c, rtol=8e-3, atol=1e-2, msg=name)


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

    def fake(weight, rows):  # 8 -> 16: the input gradient faster split; 16 -> 8: the forward; 8 -> 8: neither
        timed.append((tuple(weight.shape), rows))
        grad_split, forward_split = {(16, 8): (1.0, 2.0), (8, 16): (2.0, 1.0), (8, 8): (2.0, 2.0)}[tuple(weight.shape)]
        return {"forward": 1.5, "forward, two calls": forward_split, "input grad": 1.5, "input grad, two calls": grad_split}

    monkeypatch.setattr(kernel_choice, "_time_row_splits", fake)
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8), nn.Linear(8, 8), nn.Linear(8, 16))
    keys = list(model.state_dict())
    with caplog.at_level(logging.INFO, logger="aiayn.inference.kernel_choice"):
        assert use_training_kernels(model, rows=1024, dtype=torch.bfloat16) == 3
    assert [type(m) for m in model] == [RowSplitLinear, RowSplitLinear, nn.Linear, RowSplitLinear]
    assert [(m.split_forward, m.split_input_grad) for m in (model[0], model[1], model[3])] == [(False, True), (True, False), (False, True)]
    assert sorted(timed) == [((8, 8), 1024), ((8, 16), 1024), ((16, 8), 1024)]  # each shape once, at the rows given (no cap)
    assert "8->16 bfloat16 train 1024 rows (rows in one call or two): forward 1.500, forward, two calls 2.000" in caplog.text
    table = json.loads((tmp_path / "aiayn" / "kernels.json").read_text())[kernel_choice.machine_key()]
    assert table == {"8->16 bfloat16 train 1024 rows (rows in one call or two)": "split-input-grad",
                     "16->8 bfloat16 train 1024 rows (rows in one call or two)": "split-forward",
                     "8->8 bfloat16 train 1024 rows (rows in one call or two)": "plain"}
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


def test_the_real_timing_returns_four_times():
    times = kernel_choice._time_row_splits(torch.randn(16, 8), rows=32)
    assert set(times) == {"forward", "forward, two calls", "input grad", "input grad, two calls"} and min(times.values()) > 0


@pytest.mark.parametrize("precision", ["bf16", "bf16-master"])
def test_an_lm_run_splits_where_chosen_and_resumes_bit_for_bit(tmp_path, monkeypatch, caplog, precision):
    """``aiayn train`` of a language model in bf16 takes the row splits (here forced, every product split): 6 steps
    straight == 3 steps, stop, resume to 6, and its loss stays the unsplit run's within bf16 rounding."""
    chosen = []

    def forced(weights, rows):
        chosen.append(rows)
        return ["split-both"] * len(weights)

    def config(name: str, **loop: object):
        return lm_config(tmp_path / name, steps=6, save_every=3, eval_every=6, precision=precision, **loop)

    plain = train(config("plain"))
    monkeypatch.setattr(kernel_choice, "choose_row_splits", forced)
    with caplog.at_level(logging.INFO, logger="aiayn.nn.onednn_linear"):
        straight = train(config("a"))
    assert "bf16 training matmuls: rows split in two calls for 13 of 13 Linear layers (timed per shape at 64 rows" in caplog.text
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
        return {"forward": 2.0, "forward, two calls": 1.0, "input grad": 2.0, "input grad, two calls": 1.0}

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
