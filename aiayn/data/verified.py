"""Check a data file against its sha256 once, and remember the result beside it (``<file>.sha256``).

Files found in ``--data-dir``, ``$AIAYN_DATA_DIR`` or the cache were put there by someone: a
different version or a damaged copy would silently change every number measured on it. The hash is
computed the first time; the note records it with the file's size and modification time, so later
runs skip the hashing until the file changes. A read-only directory gets no note (hashed each time).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from aiayn.checkpoint.atomic_io import atomic_write_bytes, file_sha256
from aiayn.data.errors import DataError

__all__ = ["NOTE_SUFFIX", "check_file", "remember"]

log = logging.getLogger(__name__)
NOTE_SUFFIX = ".sha256"


def check_file(path: Path, sha256: str) -> None:
    """Return if ``path`` has the sha256 ``sha256`` (from its note when still current); ``DataError`` if not."""
    note = _note_path(path)
    stat = path.stat()
    recorded = _read_note(note)
    if recorded == _entry(sha256, stat):
        return
    got = file_sha256(path)
    if got != sha256:
        raise DataError(
            f"{path} does not match its checksum: expected sha256 {sha256}, got {got} "
            f"({stat.st_size} bytes). It is a different version or a damaged copy; replace it with the original "
            "(the data README lists the addresses), or delete it to download it again"
        )
    remember(path, sha256)


def remember(path: Path, sha256: str) -> None:
    """Write the note that ``path`` (as it is now) has been checked against ``sha256``."""
    try:
        atomic_write_bytes(_note_path(path), json.dumps(_entry(sha256, path.stat())).encode())
    except OSError as e:  # a read-only data directory: fine, the file is checked again next time
        log.debug("cannot remember the checksum of %s: %s", path, e)


def _note_path(path: Path) -> Path:
    return path.with_name(path.name + NOTE_SUFFIX)


def _entry(sha256: str, stat: os.stat_result) -> dict[str, object]:
    return {"sha256": sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _read_note(note: Path) -> object:
    try:
        return json.loads(note.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
