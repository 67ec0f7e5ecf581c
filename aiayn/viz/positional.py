"""The sinusoidal positional encoding as pictures (paper section 3.5).

Left: the table ``PE (max_len, d_model)`` as a heatmap, positions down, features across. Along a
row the frequency falls from the first features (fast stripes) to the last (nearly constant),
the striped, periodic pattern described in the tutorials. Right: the dot product
``PE(p) . PE(p + k)`` against the offset ``k``: it equals ``sum_i cos(w_i k)``, a function of the
distance alone (the same curve from every start position ``p``), largest at ``k = 0`` and falling
off with distance, which is what lets attention read relative positions.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from aiayn.nn.positional import sinusoid_table

__all__ = ["PositionalSummary", "distance_profile", "plot_positional"]


@dataclass
class PositionalSummary:
    path: Path
    max_deviation: float  # largest |PE(p).PE(p+k) - PE(0).PE(k)| over p, k: 0 means "distance only"
    dot_at_zero: float  # PE(p).PE(p) = d_model / 2
    dot_at_max: float  # at the largest offset shown


def distance_profile(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """From ``table (L, D)``: offsets ``k = 0..L-1`` and the dot products ``(L - k, k)`` of every pair.

    Returns ``(offsets (L,), dots (L, L))`` where ``dots[k, p] = PE(p) . PE(p + k)`` (NaN where
    ``p + k >= L``).
    """
    gram = table.double() @ table.double().T  # (L, L)
    length = table.shape[0]
    dots = torch.full((length, length), float("nan"), dtype=torch.float64)
    for k in range(length):
        dots[k, : length - k] = torch.diagonal(gram, offset=k)
    return torch.arange(length), dots


def plot_positional(d_model: int, max_len: int, path: str | os.PathLike[str]) -> PositionalSummary:
    """Draw the heatmap and the dot product against distance into one PNG at ``path``.

    Raises ``ValueError`` unless ``d_model`` is even and >= 2 and ``max_len >= 2``.
    """
    from aiayn.viz.style import DIVERGING_CMAP, SERIES_COLORS, new_figure, save_figure, style_axes, style_context

    if d_model < 2 or d_model % 2:
        raise ValueError(f"d_model must be even and >= 2 (sines and cosines come in pairs, section 3.5), got {d_model}")
    if max_len < 2:
        raise ValueError(f"max_len must be >= 2, got {max_len}")
    table = sinusoid_table(max_len, d_model)  # (L, D)
    offsets, dots = distance_profile(table)
    reference = dots[:, 0]  # from position 0
    deviation = float((dots - reference[:, None]).abs().nan_to_num(0.0).max())
    with style_context():
        fig, axes = new_figure(1, 2, width=12, height=4.6)
        ax = axes[0, 0]
        image = ax.imshow(table.numpy(), cmap=DIVERGING_CMAP, vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
        style_axes(ax, title=f"sinusoidal positional encoding (max_len={max_len}, d_model={d_model})",
                   xlabel="feature i (even: sin, odd: cos)", ylabel="position")
        fig.colorbar(image, ax=ax, shrink=0.8)
        ax = axes[0, 1]
        for p in range(0, max_len, max(1, max_len // 8)):
            ax.plot(offsets.numpy(), dots[:, p].numpy(), color=SERIES_COLORS[5], alpha=0.35, lw=1)
        ax.plot(offsets.numpy(), reference.numpy(), color=SERIES_COLORS[0], lw=2, label="from position 0")
        ax.plot([], [], color=SERIES_COLORS[5], alpha=0.6, label="from other positions (the same curve)")
        ax.axhline(0, color="#999", lw=0.8)
        style_axes(ax, title="PE(p) · PE(p + k): depends only on the distance k",
                   xlabel="distance k", ylabel="dot product", grid=True)
        ax.legend()
    out = save_figure(fig, path)
    return PositionalSummary(out, deviation, float(reference[0]), float(reference[-1]))
