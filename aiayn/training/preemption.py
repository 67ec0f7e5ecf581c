"""Save on preemption: SIGINT or SIGTERM during training finishes the step, saves a checkpoint and stops.

A cluster sends SIGTERM before it takes a machine back (and torchrun forwards it to every rank), a
person presses Ctrl-C: either way the steps since the last checkpoint would be lost. The first signal
only sets a flag; the loop sees it after the current step, every rank agrees (one all-reduce), saves,
and :func:`~aiayn.training.loop.train` raises :class:`TrainingInterrupted` naming the checkpoint
(``aiayn train`` then exits 128 + the signal: 130 for SIGINT, 143 for SIGTERM). A second signal
exits at once, without saving.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from aiayn.training.distributed import DistInfo, rank_values

__all__ = ["Preemption", "TrainingInterrupted", "SIGNALS"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(Exception):  # noqa: N818 -- a stop the caller asked for, not a failure
    """Training stopped on a signal after saving ``checkpoint`` at ``step`` (``None`` on ranks that do not write)."""

    def __init__(self, signum: int, step: int, checkpoint: Path | None) -> None:
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        self.exit_code = 128 + signum
        where = f"saved {checkpoint}" if checkpoint is not None else "checkpoint saved by rank 0"
        super().__init__(f"interrupted by {signal.Signals(signum).name} at step {step}: {where}")


class Preemption:
    """Within ``with Preemption(dist_info, device) as p``, SIGINT/SIGTERM set ``p.signum`` instead of stopping
    the process (the main thread only; elsewhere signals keep their handlers); :meth:`requested` is the
    decision of all ranks."""

    def __init__(self, dist_info: DistInfo, device: torch.device) -> None:
        self.dist_info, self.device = dist_info, device
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Preemption:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: a handler set outside Python
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:  # the second: the user means now
            os.write(2, f"\n{name} again: exiting at once without saving\n".encode())
            os._exit(128 + signum)
        self.signum = signum
        # os.write, not logging or print: a signal handler may run while either holds its lock.
        os.write(2, f"\n{name}: finishing this step, then saving a checkpoint (send it again to exit at once)\n".encode())

    def requested(self) -> int | None:
        """The signal to stop for if any rank got one (every rank gets the same answer), else ``None``."""
        signums = rank_values(self.signum or 0, self.dist_info, self.device)  # one all-reduce under DDP
        return max(signums) or None
