"""Data files found on disk are checked against their sha256 once, the result remembered; downloads are bounded."""

from __future__ import annotations

import gzip
import hashlib
import json
import os

import pytest

from aiayn.data import DATASETS, ENV_VAR, DataError, DownloadError, fetch_file, resolve_files, verified
from aiayn.data.datasets import DatasetSpec, RemoteFile

pytestmark = pytest.mark.reliability

TEXT = "Ein Mann.\n"


@pytest.fixture()
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(ENV_VAR, raising=False)
    files = {"val.de": RemoteFile((tmp_path / "nowhere").as_uri(), hashlib.sha256(TEXT.encode()).hexdigest())}
    monkeypatch.setitem(DATASETS, "multi30k", DatasetSpec("multi30k", {"val": ("val.de",)}, files))
    (tmp_path / "data" / "multi30k").mkdir(parents=True)
    return tmp_path / "data"


def test_a_good_file_is_hashed_once_then_remembered(root, monkeypatch):
    (root / "multi30k" / "val.de").write_text(TEXT)
    resolve_files("multi30k", "val", data_dir=root, download=False)
    note = json.loads((root / "multi30k" / "val.de.sha256").read_text())
    assert note["sha256"] == DATASETS["multi30k"].files["val.de"].sha256 and note["size"] == len(TEXT)
    calls = []
    monkeypatch.setattr(verified, "file_sha256", lambda path: calls.append(path) or "x")
    resolve_files("multi30k", "val", data_dir=root, download=False)
    assert calls == []  # the note is current: no hashing


def test_a_file_that_does_not_match_is_named_even_after_a_good_note(root):
    file = root / "multi30k" / "val.de"
    file.write_text(TEXT)
    resolve_files("multi30k", "val", data_dir=root, download=False)
    file.write_text("Ein Mann!\n")  # same size, new content: the note is stale (mtime), so it is hashed again
    os.utime(file, ns=(1, 1))
    with pytest.raises(DataError, match=rf"{file} does not match its checksum: expected sha256 [0-9a-f]{{64}}, got [0-9a-f]{{64}} .*different version or a damaged copy"):
        resolve_files("multi30k", "val", data_dir=root, download=False)


def test_a_read_only_directory_is_checked_without_a_note(root):
    (root / "multi30k" / "val.de").write_text(TEXT)
    os.chmod(root / "multi30k", 0o555)
    try:
        if os.access(root / "multi30k", os.W_OK):
            pytest.skip("running as a user that can write anywhere")
        resolve_files("multi30k", "val", data_dir=root, download=False)
        assert not (root / "multi30k" / "val.de.sha256").exists()
    finally:
        os.chmod(root / "multi30k", 0o755)


def test_downloads_are_bounded(tmp_path):
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * 5000)
    with pytest.raises(DownloadError, match=r"larger than the limit of 1000 bytes"):
        fetch_file(big.as_uri(), tmp_path / "out", sha256="0" * 64, max_bytes=1000)
    assert not (tmp_path / "out").exists()


def test_gunzip_is_bounded(tmp_path):
    bomb = tmp_path / "bomb.gz"
    bomb.write_bytes(gzip.compress(b"\0" * 10_000_000))  # 10 MB from about 10 kB
    assert bomb.stat().st_size < 50_000
    with pytest.raises(DownloadError, match=r"decompresses to more than the limit of 100000 bytes"):
        fetch_file(bomb.as_uri(), tmp_path / "out", sha256="0" * 64, gunzip=True, max_bytes=100_000)
    assert not (tmp_path / "out").exists()
