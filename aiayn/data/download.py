"""Fetch one file, gunzip it if asked, check its sha256 and write it atomically (temp file + rename)."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import logging
import os
import tempfile
import urllib.error
import urllib.request
import zlib
from pathlib import Path
from typing import BinaryIO, Iterator

from aiayn.data.errors import DownloadError

__all__ = ["fetch_file", "sha256_of", "MAX_BYTES"]

logger = logging.getLogger(__name__)


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


MAX_BYTES = 64 * 1024 * 1024  # per file, downloaded and after gunzip; the largest data file is 2.1 MB


def fetch_file(
    url: str, dest: str | Path, *, sha256: str, gunzip: bool = False, timeout: float = 60.0, max_bytes: int = MAX_BYTES
) -> Path:
    """Download ``url`` (any scheme ``urllib`` opens, ``file://`` included) to ``dest``.

    The checksum is of the file as written (after decompression). Nothing is written unless it
    matches; a partial file never appears at ``dest``. At most ``max_bytes`` are read, and at most
    ``max_bytes`` come out of gunzip (a gzip bomb stops there). Raises ``DownloadError`` when the
    fetch fails, a bound is passed or the checksum differs.
    """
    dest = Path(dest)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - addresses come from our table
            if not gunzip:  # written to disk as it comes: an archive of a GB is never held whole
                return _stream(url, response, dest, sha256, max_bytes)
            data = response.read(max_bytes + 1)
    except DownloadError:  # _stream's own (a bound, the checksum): already says what failed
        raise
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise DownloadError(f"could not download {url}: {e}") from e
    if len(data) > max_bytes:
        raise DownloadError(f"{url} is larger than the limit of {max_bytes} bytes; stopped reading, {dest} was not written")
    if gunzip:
        data = _gunzip(url, data, max_bytes)
    _check_sha256(url, dest, sha256, sha256_of(data))
    with _written(dest) as f:
        f.write(data)
    logger.info("downloaded %s to %s (%d bytes, sha256 ok)", url, dest, len(data))
    return dest


def _stream(url: str, response: io.BufferedIOBase, dest: Path, sha256: str, max_bytes: int) -> Path:
    """Copy ``response`` to a temporary sibling of ``dest`` in 1 MiB pieces, hashing them; rename it when whole and right."""
    digest, size = hashlib.sha256(), 0
    with _written(dest) as f:
        while chunk := response.read(1 << 20):
            size += len(chunk)
            if size > max_bytes:
                raise DownloadError(f"{url} is larger than the limit of {max_bytes} bytes; stopped reading, {dest} was not written")
            digest.update(chunk)
            f.write(chunk)
        _check_sha256(url, dest, sha256, digest.hexdigest())  # inside: a mismatch removes the temporary file
    logger.info("downloaded %s to %s (%d bytes, sha256 ok)", url, dest, size)
    return dest


def _check_sha256(url: str, dest: Path, sha256: str, got: str) -> None:
    if got != sha256:
        raise DownloadError(
            f"checksum mismatch for {url}: expected sha256 {sha256}, got {got}; {dest} was not written "
            "(the file at the address changed, or the download was corrupted)"
        )


@contextlib.contextmanager
def _written(dest: Path) -> Iterator[BinaryIO]:
    """A temporary sibling of ``dest`` to write: renamed to ``dest`` when the block ends, removed when it raises."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; data files are for every user
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _gunzip(url: str, data: bytes, max_bytes: int) -> bytes:
    """Decompress ``data``, refusing to produce more than ``max_bytes``."""
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
            out = f.read(max_bytes + 1)
    except (OSError, EOFError, zlib.error) as e:
        raise DownloadError(f"{url} is not a valid gzip file: {e}") from e
    if len(out) > max_bytes:
        raise DownloadError(f"{url} decompresses to more than the limit of {max_bytes} bytes; stopped")
    return out
