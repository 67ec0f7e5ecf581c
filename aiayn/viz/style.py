"""One plotting style for every picture the library draws (attention, positions, benchmarks, labs, curves).

Figures are built with ``matplotlib.figure.Figure`` directly, never ``pyplot``: no GUI backend, no
global figure registry, safe in tests and on headless machines. Typical use::

    fig, axes = new_figure(1, 2, width=10, height=4)
    axes[0, 0].plot(x, y, color=SERIES_COLORS[0])
    save_figure(fig, "out/plot.png")

Token labels may hold umlauts (DejaVu Sans has them) and CJK characters, which need a CJK font:
:func:`cjk_font` finds Noto Sans CJK (Debian ``fonts-noto-cjk``) or a few others, and
:func:`apply_style` puts it behind DejaVu Sans as a per-glyph fallback. Without one, CJK glyphs are
drawn as boxes, a warning is logged once, and everything else still works.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import matplotlib
from matplotlib import font_manager
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.text import Text

__all__ = [
    "apply_style", "style_context", "cjk_font", "new_figure", "save_figure", "style_axes", "loglog_slope_label",
    "SERIES_COLORS", "HEATMAP_CMAP", "DIVERGING_CMAP", "DPI",
]

log = logging.getLogger(__name__)

# Colour-blind-safe series colours (Okabe-Ito), in a fixed order so the same curve keeps its colour.
SERIES_COLORS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")
HEATMAP_CMAP = "viridis"  # attention weights in [0, 1]
DIVERGING_CMAP = "RdBu_r"  # signed values (positional encodings)
DPI = 120

_CJK_FAMILIES = (
    "Noto Sans CJK SC", "Noto Sans CJK JP", "Noto Sans CJK TC", "Noto Sans CJK KR", "Noto Sans SC",
    "Source Han Sans SC", "Source Han Sans", "WenQuanYi Zen Hei", "WenQuanYi Micro Hei", "Droid Sans Fallback",
    "AR PL UMing CN",
)
# Where Debian puts them; matplotlib's font cache may predate the package install, so look on disk too.
_CJK_FILES = (
    "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc",
    "/usr/share/fonts/opentype/noto/NotoSansCJKsc-Regular.otf",
    "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc",
    "/usr/share/fonts/truetype/wqy/wqy-microhei.ttc",
    "/usr/share/fonts/truetype/droid/DroidSansFallbackFull.ttf",
)
_cjk_cache: list[str | None] = []


def cjk_font() -> str | None:
    """The family name of an installed font with CJK glyphs, or ``None`` (then CJK shows as boxes).

    ``AIAYN_CJK_FONT`` may name a font file to use instead (an empty value disables the search).
    """
    if not _cjk_cache:
        _cjk_cache.append(_find_cjk_font())
    return _cjk_cache[0]


_CJK_CHAR = re.compile(r"[\u3000-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]")
_cjk_warned: list[bool] = []


def _warn_if_cjk_is_drawn_as_boxes(fig: Figure) -> None:
    """Say once, and only when a figure holds CJK text, that no font can draw it."""
    if _cjk_warned or cjk_font() is not None:
        return
    if any(_CJK_CHAR.search(t.get_text()) for t in fig.findobj(Text)):
        log.warning("no CJK font found (install Debian's fonts-noto-cjk); CJK characters will be drawn as boxes")
        _cjk_warned.append(True)


def _find_cjk_font() -> str | None:
    override = os.environ.get("AIAYN_CJK_FONT")
    if override is not None:
        return _add_font_file(override) if override else None
    names = {f.name for f in font_manager.fontManager.ttflist}
    for family in _CJK_FAMILIES:
        if family in names:
            return family
    for file in _CJK_FILES:
        name = _add_font_file(file)
        if name is not None:
            return name
    return None


def _add_font_file(file: str) -> str | None:
    if not Path(file).is_file():
        return None
    try:
        font_manager.fontManager.addfont(file)
        return font_manager.FontProperties(fname=file).get_name()
    except (OSError, RuntimeError, ValueError) as e:  # an unreadable or unsupported font file
        log.warning("cannot use font %s: %s", file, e)
        return None


def _rc() -> dict[str, Any]:
    families = ["DejaVu Sans"]
    cjk = cjk_font()
    if cjk is not None:
        families.append(cjk)  # per-glyph fallback (matplotlib >= 3.6)
    return {
        "font.family": families,  # a list of names, not "sans-serif": only a list gets per-glyph fallback
        "font.size": 9,
        "axes.titlesize": 9,
        "axes.labelsize": 9,
        "axes.grid": False,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "grid.alpha": 0.3,
        "legend.fontsize": 8,
        "legend.frameon": False,
        "figure.dpi": DPI,
        "savefig.dpi": DPI,
        "image.cmap": HEATMAP_CMAP,
    }


def apply_style() -> None:
    """Set the library's rcParams globally (for scripts); library code uses :func:`style_context`."""
    matplotlib.rcParams.update(_rc())  # type: ignore[arg-type]  # keys checked by matplotlib at run time


@contextmanager
def style_context() -> Iterator[None]:
    """The library's rcParams for the duration of a ``with`` block; missing-glyph warnings are silenced
    (a missing CJK font is reported once, when CJK text is saved, by :func:`save_figure` instead)."""
    with matplotlib.rc_context(_rc()), warnings.catch_warnings():  # type: ignore[arg-type]  # as above
        warnings.filterwarnings("ignore", message=r"Glyph .* missing from")
        yield


def new_figure(
    nrows: int = 1, ncols: int = 1, *, width: float = 6.0, height: float = 4.0, layout: Literal["constrained", "compressed", "tight"] | None = "constrained", **subplot_kw: Any
) -> tuple[Figure, Any]:
    """A figure and a 2-D array of axes ``(nrows, ncols)`` (always 2-D, even for one panel).

    ``layout=None`` skips matplotlib's constrained layout (slow for big grids); place axes yourself.
    """
    with style_context():
        fig = Figure(figsize=(width, height), layout=layout)
        axes = fig.subplots(nrows, ncols, squeeze=False, **subplot_kw)
    return fig, axes


def save_figure(fig: Figure, path: str | os.PathLike[str]) -> Path:
    """Write ``fig`` as PNG to ``path`` (parents created) and return the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    _warn_if_cjk_is_drawn_as_boxes(fig)
    with style_context():
        fig.savefig(target, format="png")
    return target


def loglog_slope_label(name: str, slope: float | None) -> str:
    """A legend entry such as ``math attention (slope 1.98)``."""
    return name if slope is None else f"{name} (slope {slope:.2f})"


def style_axes(ax: Axes, *, title: str | None = None, xlabel: str | None = None, ylabel: str | None = None, grid: bool = False) -> None:
    """Title, labels and an optional light grid in the library's style."""
    if title:
        ax.set_title(title)
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    if grid:
        ax.grid(True, which="both", alpha=0.3)
