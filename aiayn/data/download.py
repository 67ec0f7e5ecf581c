"""Fetch one file, gunzip it if asked, check its sha256 and write it atomically (temp file + rename)."""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from aiayn.data.errors import DownloadError

__all__ = ["fetch_file", "sha256_of"]

logger = logging.getLogger(__name__)


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetch_file(url: str, dest: str | Path, *, sha256: str, gunzip: bool = False, timeout: float = 60.0) -> Path:
    """Download ``url`` (any scheme ``urllib`` opens, ``file://`` included) to ``dest``.

    The checksum is of the file as written (after decompression). Nothing is written unless it
    matches; a partial file never appears at ``dest``. Raises ``DownloadError`` when the fetch
    fails or the checksum differs.
    """
    dest = Path(dest)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - addresses come from our table
            data = response.read()
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise DownloadError(f"could not download {url}: {e}") from e
    if gunzip:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise DownloadError(f"{url} is not a valid gzip file: {e}") from e
    got = sha256_of(data)
    if got != sha256:
        raise DownloadError(
            f"checksum mismatch for {url}: expected sha256 {sha256}, got {got}; {dest} was not written "
            "(the file at the address changed, or the download was corrupted)"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; data files are for every user
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    logger.info("downloaded %s to %s (%d bytes, sha256 ok)", url, dest, len(data))
    return dest
