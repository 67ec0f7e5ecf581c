"""benchmarks/train_layouts.py --quick: the model with the layouts chosen and the one with its transposes taken back
both train, and the second really runs without them."""

import pytest
import torch
from bench_scripts import load_benchmark

from aiayn.inference import gemv, kernel_choice
from aiayn.nn.onednn_linear import RowSplitLinearFunction

pytest.importorskip("transformers")


@pytest.mark.skipif(not gemv.available(), reason="our C++ library did not build here (aiayn.inference.gemv)")
def test_quick_mode_times_both(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_benchmark("train_layouts")
    layout = "transposed-forward+transposed-weight-grad"
    monkeypatch.setattr(kernel_choice, "choose_row_splits", lambda weights, rows: [layout] * len(weights))
    flags = []
    apply = RowSplitLinearFunction.apply
    monkeypatch.setattr(RowSplitLinearFunction, "apply", lambda *a: flags.append(a[5:]) or apply(*a))
    threads = torch.get_num_threads()
    medians = bench.main(["--quick", "--dtype", "bf16-master"])
    assert torch.get_num_threads() == threads
    assert set(medians) == {"timed layouts", "without transposes"} and min(medians.values()) > 0
    assert (True, True) in flags and (False, False) in flags  # each model ran its own layouts
    out = capsys.readouterr().out
    assert "layers with a transpose chosen (transpose_forward, transpose_weight_grad)" in out and "x the speed" in out
