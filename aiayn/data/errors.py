"""The error raised for bad data: a ``ValueError`` whose message names the setting, file, line and fix."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["DataError", "DownloadError", "naming_setting"]


class DataError(ValueError):
    """Bad or missing data (a file, a line, a data set)."""


class DownloadError(DataError):
    """A download failed (offline, bad address) or its checksum did not match."""


@contextmanager
def naming_setting(setting: str) -> Iterator[None]:
    """Put the dotted ``setting`` (``data.train_files``) in front of any ``DataError`` raised inside,
    so the message reads setting, then path and line, then the fix."""
    try:
        yield
    except DownloadError:
        raise
    except DataError as e:
        message = str(e)
        raise DataError(message if message.startswith(setting) else f"{setting}: {message}") from None
