"""Durable and atomic file writes: a file is either absent or whole, even after a crash.

``write_durable`` writes and fsyncs one file; ``fsync_dir`` makes a rename or a new entry in a
directory survive a power loss; ``atomic_write_bytes`` combines them (temporary sibling, fsync,
``os.replace``). Checkpoints and config files are written through here, so tests can simulate a
full disk by patching ``write_durable``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator

__all__ = ["write_durable", "fsync_dir", "atomic_write_bytes", "temporary_sibling", "replace_directory"]


def write_durable(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file at ``path`` and fsync it before returning."""
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Fsync a directory so the entries created or renamed in it are durable (no-op where unsupported)."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(path, flags)
    except OSError:  # platforms (Windows) that cannot open a directory: nothing to do
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temporary_sibling(path: Path) -> Path:
    """A unique hidden name next to ``path``, on the same file system so a rename is atomic."""
    return path.with_name(f".tmp-{path.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically: readers see the old file or the new one, never a part."""
    target = Path(path)
    tmp = temporary_sibling(target)
    try:
        write_durable(tmp, data)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


@contextlib.contextmanager
def replace_directory(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Fill the yielded temporary sibling; on success it replaces ``path`` whole, on failure it is removed."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(target)
    tmp.mkdir()
    try:
        yield tmp
        fsync_dir(tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(target.parent)
