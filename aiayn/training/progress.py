"""The training progress bar: steps, or the time budget when ``train.max_minutes`` bounds the run.

With a time budget the number of steps the run will make is unknown, so a bar over ``max_steps``
shows a wrong ETA (the demo's 2,000 steps and 36 minutes for a 9-minute budget).
"""

from __future__ import annotations

import time

from tqdm import tqdm

from aiayn.training.config import LoopSection

__all__ = ["progress_bar", "TimeBudgetBar"]


def progress_bar(loop: LoopSection, step: int, *, enabled: bool) -> tqdm:
    """A bar whose ``update(1)`` counts one optimizer step, over the steps or over ``loop.max_minutes``."""
    if loop.max_minutes is None:
        return tqdm(total=loop.max_steps, initial=step, unit="step", disable=not enabled, dynamic_ncols=True)
    return TimeBudgetBar(loop.max_minutes * 60.0, step, disable=not enabled)


class TimeBudgetBar(tqdm):
    """A bar over the seconds of a wall-clock budget; each ``update(n)`` adds ``n`` steps (shown in the
    description) and moves the bar to the time spent."""

    def __init__(self, seconds: float, step: int = 0, *, disable: bool = False) -> None:
        super().__init__(
            total=seconds, unit="s", disable=disable, dynamic_ncols=True, desc=f"step {step}",
            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s of the time budget [{elapsed}<{remaining}{postfix}]",
        )
        self.step, self.started = step, time.perf_counter()

    def update(self, n: float | None = 1) -> bool | None:
        self.step += int(n or 0)
        self.set_description_str(f"step {self.step}", refresh=False)
        spent = min(time.perf_counter() - self.started, float(self.total))
        return super().update(spent - self.n)
