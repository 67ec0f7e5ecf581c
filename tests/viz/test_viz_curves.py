"""aiayn plot: PNG training curves from a hand-written metrics.jsonl."""

import json
from pathlib import Path

import pytest
from viz_helpers import assert_png

from aiayn.cli.main import main
from aiayn.viz.curves import collect_series, plot_curves


def _write_metrics(run: Path, *, with_accuracy: bool) -> None:
    records = []
    for step in range(1, 61):
        loss = 4.0 / step**0.3 + (0.05 if step % 2 else -0.05)
        records.append({"step": step, "loss": loss, "lr": min(step, 10) * 1e-4, "grad_norm": 2.0 / step**0.5, "tokens_per_s": 1000.0 + step})
        if step % 20 == 0:
            val = {"step": step, "val_loss": loss + 0.2, "val_ppl": 2.718 ** (loss + 0.2)}
            if with_accuracy:
                val["val_accuracy"] = 0.3 + step / 200
            records.append(val)
    records.append({"step": 61, "loss": float("nan"), "lr": 1e-3, "grad_norm": float("inf"), "tokens_per_s": 1000.0})  # a skipped step
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_plot_writes_decodable_pngs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    _write_metrics(run, with_accuracy=True)
    assert main(["plot", str(run)]) == 0
    names = ["loss", "lr", "grad_norm", "val_accuracy", "val_ppl", "tokens_per_s", "curves"]
    for name in names:
        assert_png(run / "plots" / f"{name}.png")
    assert sorted(p.stem for p in (run / "plots").iterdir()) == sorted(names)
    assert capsys.readouterr().out.count("wrote ") == len(names)


def test_plot_skips_absent_metrics_and_honours_out(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _write_metrics(run, with_accuracy=False)
    assert main(["plot", str(run), "--out", str(tmp_path / "pngs")]) == 0
    assert sorted(p.stem for p in (tmp_path / "pngs").iterdir()) == ["curves", "grad_norm", "loss", "lr", "tokens_per_s", "val_ppl"]


def test_series_drop_non_finite_values_and_extra_metrics_get_a_panel(tmp_path: Path) -> None:
    records = [{"step": 1, "loss": 2.0, "note": "x"}, {"step": 2, "loss": float("nan")}, {"step": 2, "bleu": 12.5}]
    series = collect_series(records)
    assert series["loss"].steps == [1] and series["loss"].values == [2.0]
    assert "note" not in series
    written = plot_curves(records, tmp_path)
    assert [p.name for p in written] == ["loss.png", "bleu.png", "curves.png"]
    with pytest.raises(ValueError, match="metrics record 0 has no int 'step'"):
        collect_series([{"loss": 1.0}])


def test_plot_errors_name_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plot", str(tmp_path)]) == 2
    assert f"no metrics at {tmp_path / 'metrics.jsonl'}" in capsys.readouterr().err
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": float("nan")}) + "\n")
    assert main(["plot", str(tmp_path)]) == 2
    assert "nothing to plot" in capsys.readouterr().err
