"""The error raised for bad data: a ``ValueError`` whose message names the file, line and fix."""

from __future__ import annotations

__all__ = ["DataError", "DownloadError"]


class DataError(ValueError):
    """Bad or missing data (a file, a line, a data set)."""


class DownloadError(DataError):
    """A download failed (offline, bad address) or its checksum did not match."""
