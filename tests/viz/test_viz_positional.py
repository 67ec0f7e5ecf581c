"""aiayn viz positional: the sinusoid table's heatmap and its dot product against distance."""

import torch
from viz_helpers import assert_png

from aiayn.cli.main import main
from aiayn.nn.positional import sinusoid_table
from aiayn.viz.positional import distance_profile, plot_positional


def test_dot_product_depends_only_on_distance():
    table = sinusoid_table(20, 16)
    offsets, dots = distance_profile(table)
    gram = table.double() @ table.double().T
    for k in range(20):
        for p in range(20 - k):
            assert torch.isclose(dots[k, p], gram[p, p + k])
        valid = dots[k, : 20 - k]
        assert torch.allclose(valid, valid[0].expand_as(valid), atol=1e-9)  # the same for every start p
    assert torch.isclose(dots[0, 0], torch.tensor(8.0, dtype=torch.float64))  # d_model / 2
    assert torch.isnan(dots[19, 1])


def test_plot_summary(tmp_path):
    summary = plot_positional(32, 12, tmp_path / "p.png")
    assert_png(summary.path)
    assert summary.max_deviation < 1e-5
    assert abs(summary.dot_at_zero - 16.0) < 1e-5


def test_cli_writes_png(tmp_path, capsys):
    assert main(["viz", "positional", "--d-model", "128", "--max-len", "50", "--out", str(tmp_path)]) == 0
    assert_png(tmp_path / "positional.png", min_width=800, min_height=300)
    assert "d_model/2" in capsys.readouterr().out


def test_cli_rejects_bad_size(tmp_path):
    import pytest

    with pytest.raises(SystemExit, match="--d-model must be >= 2, got 1"):
        main(["viz", "positional", "--d-model", "1", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--d-model must be even .*, got 7"):
        main(["viz", "positional", "--d-model", "7", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="d_model must be even"):
        from aiayn.viz.positional import plot_positional

        plot_positional(7, 10, tmp_path / "x.png")
