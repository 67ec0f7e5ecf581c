"""aiayn bench attention: timings, profiled memory, fitted slopes, a plot and a JSON file."""

import json
import math

import pytest
from viz_helpers import assert_png

from aiayn.cli.main import main
from aiayn.viz.complexity import LAYERS, bench_attention, default_lengths, fit_slope


def test_fit_slope_recovers_a_power_law():
    xs = [256, 512, 1024, 2048]
    assert fit_slope(xs, [3e-9 * x**2 for x in xs]) == pytest.approx(2.0)
    assert fit_slope(xs, [5 * x for x in xs]) == pytest.approx(1.0)
    assert fit_slope([256], [1.0]) is None
    assert fit_slope(xs, [None, None, None, 1.0]) is None


def test_default_lengths():
    assert default_lengths(16384) == [256, 512, 1024, 2048, 4096, 8192, 16384]
    assert default_lengths(3000, 1024) == [1024, 2048, 3000]
    with pytest.raises(ValueError, match="max_len must be >= min_len=256, got 100"):
        default_lengths(100)


def test_memory_budget_skips_and_says_why():
    result = bench_attention([16, 512], d_model=8, repeats=1, layers=("math", "conv"), measure_memory=False, memory_budget=2**20)
    skipped = [p for p in result.points if p.skipped]
    assert [(p.layer, p.length) for p in skipped] == [("math", 512)]  # 3 * 4 * 512^2 bytes > 1 MiB
    assert "GiB" in skipped[0].skipped and skipped[0].seconds is None


def test_math_memory_grows_quadratically():
    result = bench_attention([64, 128, 256], d_model=8, repeats=1, layers=("math",))
    peaks = [p.peak_bytes for p in result.points]
    assert all(p is not None and p >= a for p, a in zip(peaks, [q.analytic_bytes for q in result.points]))
    assert result.memory_slopes["math"] == pytest.approx(2.0, abs=0.3)


def test_cli_quick(tmp_path, capsys):
    assert main(["bench", "attention", "--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "time slope" in out and "torch.profiler" in out
    data = json.loads((tmp_path / "bench_attention.json").read_text())
    assert {p["layer"] for p in data["points"]} == set(LAYERS)
    assert all(p["seconds"] > 0 and p["peak_bytes"] >= 0 for p in data["points"])
    assert all(isinstance(s, float) and math.isfinite(s) for s in data["time_slopes"].values())
    assert_png(tmp_path / "bench_attention.png", min_width=800, min_height=300)


def test_profiling_prints_no_native_noise(capfd):
    """kineto writes 'USDT: profiler_start/stop' to the C++ stderr on every profile: silenced."""
    import torch

    from aiayn.viz.complexity import _profiled_peak

    peak = _profiled_peak(lambda: torch.ones(1000))
    captured = capfd.readouterr()
    assert "USDT" not in captured.err and "profiler_start" not in captured.err + captured.out
    assert peak is None or peak >= 4000
