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


def test_cjk_font_is_found_or_none():
    style._cjk_cache.clear()
    name = style.cjk_font()
    assert name is None or (isinstance(name, str) and name)


def test_missing_cjk_font_is_reported_only_when_cjk_is_drawn(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("AIAYN_CJK_FONT", "")  # pretend none is installed
    monkeypatch.setattr(style, "_cjk_cache", [])
    monkeypatch.setattr(style, "_cjk_warned", [])
    assert style.cjk_font() is None
    with caplog.at_level(logging.WARNING, logger="aiayn.viz.style"):
        fig, axes = style.new_figure()
        axes[0, 0].set_title("an English title")
        axes[0, 0].set_xticks([0, 1], ["Grüße", "world"])
        style.save_figure(fig, tmp_path / "english.png")
        assert "CJK" not in caplog.text  # nothing to warn about
        fig, axes = style.new_figure()
        axes[0, 0].set_xticks([0, 1], ["世", "界"])  # in tick labels, as attention plots draw tokens
        assert_png(style.save_figure(fig, tmp_path / "boxes.png"))  # drawn with boxes, not an error
    assert caplog.text.count("no CJK font found") == 1
