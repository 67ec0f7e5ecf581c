"""benchmarks/train_ablation.py --quick: the model set up as `aiayn train` sets it up and the one with a choice taken
back both train, and the second really runs without it."""

import pytest
import torch
from bench_scripts import load_benchmark

from aiayn.inference import gemv, kernel_choice
from aiayn.nn.embedding import TokenEmbedding
from aiayn.nn.onednn_linear import RowSplitLinearFunction

pytest.importorskip("transformers")


@pytest.mark.skipif(not gemv.available(), reason="our C++ library did not build here (aiayn.inference.gemv)")
def test_quick_mode_takes_back_the_transposes(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_benchmark("train_ablation")
    monkeypatch.setattr(kernel_choice, "choose_row_splits", lambda weights, rows: ["transposed-forward+transposed-weight-grad"] * len(weights))
    flags = []
    apply = RowSplitLinearFunction.apply
    monkeypatch.setattr(RowSplitLinearFunction, "apply", lambda *a: flags.append(a[5:]) or apply(*a))
    threads = torch.get_num_threads()
    medians = bench.main(["--quick", "--dtype", "bf16-master"])
    assert torch.get_num_threads() == threads
    assert set(medians) == {"as aiayn train", "without transposes"} and min(medians.values()) > 0
    assert (True, True) in flags and (False, False) in flags  # each model ran its own layouts
    out = capsys.readouterr().out
    assert "layers with a transpose chosen (transpose_forward, transpose_weight_grad)" in out and "x the speed" in out


def test_quick_mode_takes_back_the_row_gradients(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_benchmark("train_ablation")
    seen = []
    forward = TokenEmbedding.forward
    monkeypatch.setattr(TokenEmbedding, "forward", lambda self, ids: seen.append(self.row_gradients) or forward(self, ids))
    medians = bench.main(["--quick", "--dtype", "fp32", "--take-back", "row-gradients"])
    assert set(medians) == {"as aiayn train", "without row-gradients"} and True in seen and False in seen
    assert "tied tables with row gradients: embed" in capsys.readouterr().out


@pytest.mark.skipif(not gemv.available(), reason="our C++ library did not build here (aiayn.inference.gemv)")
def test_quick_mode_takes_back_the_small_matrix_attention(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """With the tiles chosen, the model as `aiayn train` runs them and the other runs our loops, and the process's choices
    are left as they were."""
    from aiayn.nn.attention import NativeAttention

    bench = load_benchmark("train_ablation")
    monkeypatch.setattr(kernel_choice, "_TRAINING_CHOSEN", {})
    monkeypatch.setattr(kernel_choice, "choose_training_attention", lambda dtype, shape, causal, rule:
                        kernel_choice._TRAINING_CHOSEN.setdefault((dtype, shape, causal, rule), "native-tiles"))
    seen = []
    apply = NativeAttention.apply
    monkeypatch.setattr(NativeAttention, "apply", lambda *a: seen.append(a[5]) or apply(*a))
    medians = bench.main(["--quick", "--dtype", "fp32", "--take-back", "tiles"])
    assert set(medians) == {"as aiayn train", "without tiles"} and True in seen and False in seen
    assert set(kernel_choice._TRAINING_CHOSEN.values()) == {"native-tiles"}
    assert "taken back to ours in fp32 arithmetic" in capsys.readouterr().out
