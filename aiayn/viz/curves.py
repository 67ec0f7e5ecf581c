"""Training curves from a run's ``metrics.jsonl``: loss, learning rate, gradient norm, validation metrics.

Training records hold ``loss``, ``lr``, ``grad_norm`` and ``tokens_per_s``; evaluation records hold
``val_loss``, ``val_ppl`` and, for some tasks, ``val_accuracy`` or metrics added by an eval hook
(``bleu``). Every numeric key becomes a series; the training and validation loss share one panel.
Each panel is written as its own PNG, and all of them together as ``curves.png``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.ticker import LogFormatter

from aiayn.viz.style import SERIES_COLORS, new_figure, save_figure, style_axes, style_context

__all__ = ["Series", "collect_series", "plot_curves", "plot_run", "OVERVIEW_FILE"]

OVERVIEW_FILE = "curves.png"


@dataclass(frozen=True)
class Series:
    """One metric over training: the steps that logged it and its finite values there."""

    name: str
    steps: list[int]
    values: list[float]


@dataclass(frozen=True)
class _Panel:
    file: str  # PNG name, without the directory
    title: str
    ylabel: str
    series: tuple[str, ...]  # metric names drawn in this panel, in colour order
    log_y: bool = False


# Known panels, in the order they are drawn; any other numeric metric gets a panel of its own after them.
_PANELS = (
    _Panel("loss", "loss", "cross-entropy (nats/token)", ("loss", "val_loss")),
    _Panel("lr", "learning rate", "lr", ("lr",)),
    _Panel("grad_norm", "gradient norm (before clipping)", "global L2 norm", ("grad_norm",), log_y=True),
    _Panel("val_accuracy", "validation accuracy", "accuracy", ("val_accuracy",)),
    _Panel("val_ppl", "validation perplexity", "perplexity", ("val_ppl",), log_y=True),
    _Panel("tokens_per_s", "training throughput", "tokens/s", ("tokens_per_s",)),
)
_LABELS = {"loss": "training", "val_loss": "validation"}


def collect_series(records: Sequence[Mapping[str, Any]]) -> dict[str, Series]:
    """Every numeric metric of ``records`` (dicts with a ``step``), in first-seen order.

    Non-finite values (a skipped non-finite step) and non-numeric fields are left out.
    Raises ``ValueError`` naming the record without an int ``step``.
    """
    steps: dict[str, list[int]] = {}
    values: dict[str, list[float]] = {}
    for i, record in enumerate(records):
        step = record.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            raise ValueError(f"metrics record {i} has no int 'step': {dict(record)!r}")
        for key, value in record.items():
            if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            steps.setdefault(key, []).append(step)
            values.setdefault(key, []).append(float(value))
    return {key: Series(key, steps[key], values[key]) for key in steps}


def plot_curves(records: Sequence[Mapping[str, Any]], out_dir: str | os.PathLike[str], *, title: str | None = None) -> list[Path]:
    """Draw the curves of ``records`` into ``out_dir``: one PNG per panel, then ``curves.png`` with all of them.

    Returns the paths written (the overview last). Raises ``ValueError`` when no record holds a
    finite number to plot.
    """
    series = collect_series(records)
    if not series:
        raise ValueError(f"nothing to plot: none of the {len(records)} metrics records holds a finite number")
    panels = _panels_for(series)
    out = Path(out_dir)
    written = []
    with style_context():
        for panel in panels:
            fig, axes = new_figure(width=6.0, height=4.0)
            _draw(axes[0, 0], panel, series)
            written.append(save_figure(fig, out / f"{panel.file}.png"))
        ncols = 2 if len(panels) > 1 else 1
        nrows = math.ceil(len(panels) / ncols)
        fig, axes = new_figure(nrows, ncols, width=5.5 * ncols, height=3.6 * nrows)
        for ax, panel in zip(axes.flat, panels):
            _draw(ax, panel, series)
        for ax in list(axes.flat)[len(panels):]:
            ax.set_axis_off()
        if title:
            fig.suptitle(title)
        written.append(save_figure(fig, out / OVERVIEW_FILE))
    return written


def plot_run(run_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """Plot ``run_dir/metrics.jsonl`` into ``out_dir`` (default ``run_dir/plots``); see :func:`plot_curves`.

    Raises ``FileNotFoundError`` naming the missing metrics file, ``ValueError`` when it holds nothing to plot.
    """
    from aiayn.training.metrics_log import METRICS_FILE, read_metrics

    run = Path(run_dir)
    records = read_metrics(run)
    target = Path(out_dir) if out_dir is not None else (run if run.is_dir() else run.parent) / "plots"
    try:
        return plot_curves(records, target, title=str(run))
    except ValueError as e:
        raise ValueError(f"{run / METRICS_FILE if run.is_dir() else run}: {e}") from None


def _panels_for(series: Mapping[str, Series]) -> list[_Panel]:
    panels = [p for p in _PANELS if any(name in series for name in p.series)]
    known = {name for p in _PANELS for name in p.series}
    panels += [_Panel(name, name.replace("_", " "), name, (name,)) for name in series if name not in known]
    return panels


def _draw(ax: Any, panel: _Panel, series: Mapping[str, Series]) -> None:
    present = [series[name] for name in panel.series if name in series]
    for i, s in enumerate(present):
        color = SERIES_COLORS[i % len(SERIES_COLORS)]
        label = _LABELS.get(s.name, s.name.replace("_", " "))
        window = _smoothing_window(len(s.values)) if s.name == "loss" else 1
        marker = "o" if len(s.values) <= 30 else None  # sparse series (evaluations) show their points
        if window > 1:
            # Training loss is noisy step to step: the raw curve faint, a running mean on top.
            ax.plot(s.steps, s.values, color=color, alpha=0.3, linewidth=0.8)
            ax.plot(s.steps, _running_mean(s.values, window), color=color, label=f"{label} (mean of {window})")
        else:
            ax.plot(s.steps, s.values, color=color, marker=marker, markersize=3, label=label)
    if panel.log_y and all(v > 0 for s in present for v in s.values):
        ax.set_yscale("log")
        # Plain numbers (0.5, 2, 30) rather than 5x10^-1; minor ticks labelled only over a short range.
        ax.yaxis.set_major_formatter(LogFormatter())
        ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.4)))
    style_axes(ax, title=panel.title, xlabel="step", ylabel=panel.ylabel, grid=True)
    if len(present) > 1 or panel.file == "loss":
        ax.legend()


def _smoothing_window(n: int) -> int:
    return max(1, min(50, n // 20))


def _running_mean(values: list[float], window: int) -> list[float]:
    """Mean of the last ``window`` values at each point (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out
