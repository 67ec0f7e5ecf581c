"""The shared plotting style: fonts with a graceful CJK fallback, figures saved as PNG."""

import logging

from viz_helpers import assert_png

from aiayn.viz import style


def test_figure_with_umlauts_and_cjk_saves_a_png(tmp_path):
    fig, axes = style.new_figure(1, 2, width=4, height=2)
    assert axes.shape == (1, 2)
    axes[0, 0].plot([1, 2, 3], [1, 4, 9], color=style.SERIES_COLORS[0])
    axes[0, 1].set_title("Grüße 世界")
    assert_png(style.save_figure(fig, tmp_path / "sub" / "plot.png"), min_width=300, min_height=150)


def test_cjk_font_is_found_or_reported(caplog):
    style._cjk_cache.clear()
    with caplog.at_level(logging.WARNING, logger="aiayn.viz.style"):
        name = style.cjk_font()
    if name is None:
        assert "fonts-noto-cjk" in caplog.text
    else:
        assert isinstance(name, str) and name


def test_missing_cjk_font_falls_back(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("AIAYN_CJK_FONT", "")  # pretend none is installed
    monkeypatch.setattr(style, "_cjk_cache", [])
    with caplog.at_level(logging.WARNING, logger="aiayn.viz.style"):
        assert style.cjk_font() is None
    assert "no CJK font found" in caplog.text
    fig, axes = style.new_figure()
    axes[0, 0].set_title("世界")
    assert_png(style.save_figure(fig, tmp_path / "boxes.png"))  # drawn with boxes, not an error
