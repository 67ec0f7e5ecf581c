"""Named data sets: resolution order, download with checksum, offline errors. Never the network."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import pytest

from aiayn.data import DATASETS, ENV_VAR, DataError, DownloadError, fetch_file, load_multi30k, load_sst2, resolve_files
from aiayn.data.datasets import DatasetSpec, RemoteFile, cache_dir

DE = "Ein Mann.\nZwei Frauen\u00a0lachen. \n"
EN = "A man.\nTwo women laugh.\n"


@pytest.fixture(autouse=True)
def isolated_env(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(ENV_VAR, raising=False)


def _write_set(root: Path, de: str = DE, en: str = EN) -> Path:
    (root / "multi30k").mkdir(parents=True)
    (root / "multi30k" / "val.de").write_text(de, encoding="utf-8")
    (root / "multi30k" / "val.en").write_text(en, encoding="utf-8")
    return root


@pytest.fixture()
def local_spec(tmp_path, monkeypatch):
    """The multi30k spec with the checksums of DE and EN, so files written by _write_set verify."""
    files = {
        name: RemoteFile((tmp_path / "nowhere" / name).as_uri(), hashlib.sha256(text.encode()).hexdigest())
        for name, text in (("val.de", DE), ("val.en", EN))
    }
    monkeypatch.setitem(DATASETS, "multi30k", DatasetSpec("multi30k", {"val": ("val.de", "val.en")}, files))


def _remote(tmp_path: Path, monkeypatch, *, corrupt: bool = False, missing: bool = False) -> Path:
    """A fake origin: gzipped files behind file:// URLs, swapped into the multi30k spec."""
    origin = tmp_path / "origin"
    origin.mkdir()
    files = {}
    for name, text in (("val.de", DE), ("val.en", EN)):
        data = text.encode()
        if not missing:
            (origin / f"{name}.gz").write_bytes(gzip.compress(b"tampered" if corrupt and name == "val.en" else data))
        files[name] = RemoteFile((origin / f"{name}.gz").as_uri(), hashlib.sha256(data).hexdigest(), gunzip=True)
    monkeypatch.setitem(DATASETS, "multi30k", DatasetSpec("multi30k", {"val": ("val.de", "val.en")}, files))
    return origin


def test_resolution_order(tmp_path, monkeypatch, local_spec) -> None:
    explicit = _write_set(tmp_path / "explicit")
    env = _write_set(tmp_path / "env")
    _write_set(cache_dir())
    monkeypatch.setenv(ENV_VAR, str(env))
    assert resolve_files("multi30k", "val", data_dir=explicit, download=False)["val.de"] == explicit / "multi30k" / "val.de"
    assert resolve_files("multi30k", "val", data_dir=tmp_path / "nothing_here", download=False)["val.de"] == env / "multi30k" / "val.de"
    monkeypatch.delenv(ENV_VAR)
    assert resolve_files("multi30k", "val", download=False)["val.de"] == cache_dir() / "multi30k" / "val.de"
    assert cache_dir() == tmp_path / "xdg" / "aiayn" / "data"


def test_directions(tmp_path, local_spec) -> None:
    root = _write_set(tmp_path / "d")
    de_en = load_multi30k("val", data_dir=root)
    en_de = load_multi30k("val", direction="en-de", data_dir=root)
    assert de_en.src == en_de.tgt == ["Ein Mann.", "Zwei Frauen\u00a0lachen. "]
    assert de_en.tgt == en_de.src == ["A man.", "Two women laugh."]
    with pytest.raises(ValueError, match="direction must be one of"):
        load_multi30k("val", direction="de-fr", data_dir=root)


def test_download_checks_sha256_and_writes_into_the_cache(tmp_path, monkeypatch) -> None:
    _remote(tmp_path, monkeypatch)
    pairs = load_multi30k("val")
    assert pairs.src == ["Ein Mann.", "Zwei Frauen\u00a0lachen. "]
    cached = cache_dir() / "multi30k"
    # No temp files left behind; each file's checksum is remembered beside it.
    assert sorted(p.name for p in cached.iterdir()) == ["val.de", "val.de.sha256", "val.en", "val.en.sha256"]
    assert (cached / "val.de").read_text(encoding="utf-8") == DE


@pytest.mark.reliability
def test_checksum_mismatch_writes_nothing(tmp_path, monkeypatch) -> None:
    origin = _remote(tmp_path, monkeypatch, corrupt=True)
    spec = DATASETS["multi30k"].files["val.en"]
    dest = tmp_path / "out" / "val.en"
    with pytest.raises(DownloadError, match=f"checksum mismatch for .*expected sha256 {spec.sha256}, got "):
        fetch_file(spec.url, dest, sha256=spec.sha256, gunzip=True)
    assert not dest.exists() and not any(dest.parent.glob("*"))
    with pytest.raises(DataError, match="checksum mismatch"):
        resolve_files("multi30k", "val")
    assert not (cache_dir() / "multi30k" / "val.en").exists()
    assert origin.exists()


def test_offline_error_says_what_to_put_where(tmp_path, monkeypatch) -> None:
    _remote(tmp_path, monkeypatch, missing=True)
    with pytest.raises(DataError) as e:
        load_multi30k("val", data_dir=tmp_path / "mine")
    msg = str(e.value)
    assert "files ['val.de', 'val.en'] not found" in msg
    assert str(tmp_path / "mine" / "multi30k") in msg and "data_dir" in msg
    assert "the download failed: could not download file://" in msg
    assert str(cache_dir() / "multi30k" / "val.de") in msg and str(cache_dir() / "multi30k" / "val.en") in msg
    assert ENV_VAR in msg and "--data-dir" in msg
    with pytest.raises(DataError, match=r"downloads are off \(download=False\)"):
        load_multi30k("val", download=False)


def test_real_addresses_are_the_readme_ones() -> None:
    m30k = DATASETS["multi30k"].files
    base = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
    assert m30k["test2016.de"].url == base + "test_2016_flickr.de.gz" and m30k["test2016.de"].gunzip
    assert m30k["train.en"].sha256 == "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6"
    assert set(DATASETS) == {"multi30k", "tinyshakespeare", "sst2", "wmt14-en-de"}


def test_unknown_names(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"unknown data set 'wmt14'; known data sets: \['multi30k', 'sst2', 'tinyshakespeare', 'wmt14-en-de'\]"):
        resolve_files("wmt14", "train")
    with pytest.raises(ValueError, match=r"sst2 has no split 'test'; valid splits: \['dev', 'train'\]"):
        load_sst2("test", data_dir=tmp_path)
