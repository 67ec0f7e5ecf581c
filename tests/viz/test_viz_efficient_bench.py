"""aiayn bench attention --efficient: every variant measured, slopes, crossover, generation, a plot and a JSON file."""

import json
import math

from viz_helpers import assert_png

from aiayn.cli.main import main
from aiayn.viz.efficient_bench import TRAIN_VARIANTS, _crossover


def test_crossover_is_the_first_length_from_which_a_variant_stays_faster():
    rows = [{"variant": v, "n": n, "seconds": t} for v, n, t in [
        ("sdpa", 1, 1.0), ("sdpa", 2, 2.0), ("sdpa", 4, 8.0), ("sdpa", 8, 30.0),
        ("local", 1, 0.5), ("local", 2, 3.0), ("local", 4, 4.0), ("local", 8, 8.0),  # faster at 1, slower at 2
        ("linear", 1, 2.0), ("linear", 2, 4.0), ("linear", 4, 9.0), ("linear", 8, 31.0),
    ]]
    assert _crossover(rows, "local") == 4 and _crossover(rows, "linear") is None


def test_cli_quick(tmp_path, capsys):
    assert main(["bench", "attention", "--efficient", "--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "faster than sdpa from" in out and "ms/token" in out and "sdpa dispatched to aten::" in out
    data = json.loads((tmp_path / "bench_efficient.json").read_text())
    assert {r["variant"] for r in data["train"]} >= set(TRAIN_VARIANTS)
    assert all(r["seconds"] > 0 and r["peak_bytes"] > 0 for r in data["train"])
    assert {r["variant"] for r in data["generation"]} == {"softmax", "local", "linear"}
    assert all(r["seconds_per_token"] > 0 for r in data["generation"])
    assert all(isinstance(s, float) and math.isfinite(s) for s in data["time_slopes"].values())
    assert_png(tmp_path / "bench_efficient.png", min_width=1000, min_height=300)
