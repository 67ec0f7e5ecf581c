"""uvicorn's server, with one change: after a graceful shutdown on SIGTERM or Ctrl-C the process
ends normally (exit status 0, no ``KeyboardInterrupt`` trace) instead of re-raising the signal."""

from __future__ import annotations

from types import FrameType

import uvicorn

__all__ = ["Server"]


class Server(uvicorn.Server):
    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        self._captured_signals.clear()  # uvicorn would raise the signal again once shut down
