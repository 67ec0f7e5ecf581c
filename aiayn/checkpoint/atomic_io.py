"""Durable and atomic file writes: a file is either absent or whole, even after a crash.

``write_durable`` writes and fsyncs one file; ``fsync_dir`` makes a rename or a new entry in a
directory survive a power loss; ``atomic_write_bytes`` combines them (temporary sibling, fsync,
``os.replace``). Checkpoints and config files are written through here, so tests can simulate a
full disk by patching ``write_durable``. ``file_sha256`` is the one hash of a file on disk (checkpoint
markers, data files).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator, Sequence

__all__ = ["write_durable", "fsync_dir", "atomic_write_bytes", "temporary_sibling", "replace_directory", "file_sha256",
           "EXPORT_MANIFEST"]


def write_durable(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file at ``path`` and fsync it before returning."""
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def file_sha256(path: Path) -> str:
    """The sha256 of the file ``path`` as hex, read 1 MiB at a time (a large file is never held whole)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


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


EXPORT_MANIFEST = "aiayn_export.json"  # what replace_directory wrote: the only files a later replace may remove


@contextlib.contextmanager
def replace_directory(path: str | os.PathLike[str], *, previous: Sequence[Path] = ()) -> Iterator[Path]:
    """Fill the yielded temporary sibling; on success it replaces ``path``, on failure it is removed.

    The new directory gets ``EXPORT_MANIFEST``, the list of the files written. An existing ``path`` is
    replaced only by removing the regular files ``previous`` (the caller's checked list, see
    :func:`aiayn.pretrained.check_replaceable`) one by one, never a directory: if anything else is left,
    the rename fails (``OSError``) and nothing else is touched.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(target)
    tmp.mkdir()
    try:
        yield tmp
        names = sorted(p.name for p in tmp.iterdir() if p.name != EXPORT_MANIFEST)
        write_durable(tmp / EXPORT_MANIFEST, (json.dumps({"written_by": "aiayn", "files": names}, indent=1) + "\n").encode())
        fsync_dir(tmp)
        for file in previous:
            if file.is_symlink() or not file.is_file():
                raise ValueError(f"refusing to replace {target}: {file} is not a regular file; remove it yourself")
            file.unlink()
        os.replace(tmp, target)  # over an empty directory only: POSIX refuses a non-empty one
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(target.parent)
