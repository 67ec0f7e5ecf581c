"""Ratios of two sides timed in the same rounds, read as every benchmark here reads them: the median of each round's
own ratio. A round's two sides run seconds apart; the medians of the two sides can come from rounds minutes apart, on
either side of a change of the host's speed (this project's EPYC hosts switch memory bandwidth between two states
within minutes), so the ratio of the medians can report a change of the host as one of the code."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def round_ratios(ours: Sequence[float | None], other: Sequence[float]) -> list[float]:
    """Each round's ``ours / other``, rounds where ours has no rate left out."""
    return [a / b for a, b in zip(ours, other) if a is not None]


def paired_ratio(ours: Sequence[float | None], other: Sequence[float]) -> float:
    """The median of :func:`round_ratios` (rates for a speed-up, or ``other`` and ``ours`` swapped for times)."""
    ratios = round_ratios(ours, other)
    if not ratios:
        raise ValueError(f"paired_ratio: no round has both sides (ours {list(ours)}, other {list(other)})")
    return statistics.median(ratios)
