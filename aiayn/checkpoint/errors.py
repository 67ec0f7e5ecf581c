"""The error a damaged checkpoint or weights file raises, shared by the readers of every file kind."""

from __future__ import annotations

from pathlib import Path

__all__ = ["CorruptCheckpointError"]


class CorruptCheckpointError(ValueError):
    """A checkpoint file is truncated, altered or unreadable; ``path`` names the file."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(f"corrupt checkpoint file {path}: {reason}")
        self.path = Path(path)
