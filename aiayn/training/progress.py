"""Training progress: a tqdm bar on a terminal, one plain line per log step when the output is a file.

A bar counts steps, or the time budget when ``train.max_minutes`` bounds the run (the number of
steps the run will make is then unknown, so a bar over ``max_steps`` shows a wrong ETA: the demo's
2,000 steps and 36 minutes for a 9-minute budget). Redirected to a file or a pipe, a bar's redraws
flood the log, so there a line is written each time the loop logs (every ``train.log_every`` steps).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Protocol, TextIO

from tqdm import tqdm

from aiayn.training.config import LoopSection

__all__ = ["Progress", "progress_bar", "TimeBudgetBar", "LineProgress"]


class Progress(Protocol):
    """What the loop calls: ``update(1)`` per optimizer step, ``set_postfix`` per log step, ``close``."""

    def update(self, n: float | None = 1) -> bool | None: ...

    def set_postfix(self, ordered_dict: Any = None, refresh: bool | None = True, **kwargs: Any) -> None: ...

    def close(self) -> None: ...


def progress_bar(loop: LoopSection, step: int, *, enabled: bool, stream: TextIO | None = None) -> Progress:
    """Progress that counts optimizer steps: a bar when ``stream`` (stderr) is a terminal, else a
    :class:`LineProgress`; over the steps or over ``loop.max_minutes``."""
    stream = stream or sys.stderr
    budget = loop.max_minutes * 60.0 if loop.max_minutes is not None else None
    if enabled and not _is_terminal(stream):
        return LineProgress(loop.max_steps, step, stream, budget_s=budget)
    if budget is None:
        return tqdm(total=loop.max_steps, initial=step, unit="step", disable=not enabled, dynamic_ncols=True, file=stream)
    return TimeBudgetBar(budget, step, disable=not enabled, file=stream)


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class TimeBudgetBar(tqdm):
    """A bar over the seconds of a wall-clock budget; each ``update(n)`` adds ``n`` steps (shown in the
    description) and moves the bar to the time spent."""

    def __init__(self, seconds: float, step: int = 0, *, disable: bool = False, file: TextIO | None = None) -> None:
        super().__init__(
            total=seconds, unit="s", disable=disable, dynamic_ncols=True, desc=f"step {step}", file=file,
            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s of the time budget [{elapsed}<{remaining}{postfix}]",
        )
        self.step, self.started = step, time.perf_counter()

    def update(self, n: float | None = 1) -> bool | None:
        self.step += int(n or 0)
        self.set_description_str(f"step {self.step}", refresh=False)
        spent = min(time.perf_counter() - self.started, float(self.total))
        return super().update(spent - self.n)


class LineProgress:
    """One line per ``set_postfix`` (each log step): ``step 100/1000 (10%) loss 4.1 ... 0:30 spent, ~4:30 left``."""

    def __init__(self, max_steps: int, step: int, stream: TextIO, *, budget_s: float | None = None) -> None:
        self.max_steps, self.step, self.first, self.stream, self.budget_s = max_steps, step, step, stream, budget_s
        self.started = time.perf_counter()

    def update(self, n: float | None = 1) -> bool | None:
        self.step += int(n or 0)
        return None

    def set_postfix(self, ordered_dict: Any = None, refresh: bool | None = True, **kwargs: Any) -> None:
        values = {**(dict(ordered_dict) if ordered_dict else {}), **kwargs}
        spent = time.perf_counter() - self.started
        if self.budget_s is None:
            head = f"step {self.step}/{self.max_steps} ({100 * self.step / self.max_steps:.0f}%)"
            done = self.step - self.first
            left = f", ~{_clock((self.max_steps - self.step) * spent / done)} left" if done else ""
        else:
            head = f"step {self.step}"
            left = f" of the {_clock(self.budget_s)} budget"
        fields = "".join(f" {k} {v}" for k, v in values.items())
        self.stream.write(f"{head}{fields} ({_clock(spent)} spent{left})\n")
        self.stream.flush()

    def close(self) -> None:
        return None


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
