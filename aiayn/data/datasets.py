"""Named data sets (``multi30k``, ``tinyshakespeare``, ``sst2``): where their files are, and loading them.

Files are looked for, in this order, in ``<data_dir>/<name>/`` (the ``data_dir`` argument, the
CLI's ``--data-dir``), in ``$AIAYN_DATA_DIR/<name>/``, and in the user cache
``$XDG_CACHE_HOME/aiayn/data/<name>/`` (``~/.cache/aiayn/data/<name>/``); if none has them they are
downloaded from their original public address into the cache, checked against the sha256 sums
of ``shared/data/README.md``. Files found are checked against the same sums once (the result is
remembered beside each file, see :mod:`aiayn.data.verified`). Offline, the error lists the files to
put where.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from aiayn.data.download import MAX_BYTES, fetch_file
from aiayn.data.errors import DataError, DownloadError
from aiayn.data.lm import split_text
from aiayn.data.readers import LabeledText, ParallelText, read_classification, read_parallel, read_text
from aiayn.data.verified import check_file, remember
from aiayn.environment import user_cache_dir

__all__ = [
    "ENV_VAR",
    "RemoteFile",
    "DatasetSpec",
    "DATASETS",
    "MULTI30K_DIRECTIONS",
    "SST2_LABELS",
    "SST2_CLASS_NAMES",
    "cache_dir",
    "search_dirs",
    "resolve_files",
    "load_multi30k",
    "load_tinyshakespeare",
    "load_sst2",
]

ENV_VAR = "AIAYN_DATA_DIR"
MULTI30K_DIRECTIONS = ("de-en", "en-de")


@dataclass(frozen=True)
class RemoteFile:
    """Where a file comes from; ``sha256`` is of the file as stored (after ``gunzip``)."""

    url: str
    sha256: str
    gunzip: bool = False
    max_bytes: int = MAX_BYTES  # a larger bound for the WMT14 archives


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    splits: dict[str, tuple[str, ...]]  # split -> file names under <dir>/<name>/
    files: dict[str, RemoteFile]  # file name -> origin


_M30K = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{}.gz"
_SST2 = "https://raw.githubusercontent.com/YJiangcm/SST-2-sentiment-analysis/master/data/{}.tsv"
_SHAKESPEARE = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"

DATASETS: dict[str, DatasetSpec] = {
    "multi30k": DatasetSpec(
        "multi30k",
        splits={s: (f"{s}.de", f"{s}.en") for s in ("train", "val", "test2016")},
        files={
            "train.en": RemoteFile(_M30K.format("train.en"), "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6", True),
            "train.de": RemoteFile(_M30K.format("train.de"), "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72", True),
            "val.en": RemoteFile(_M30K.format("val.en"), "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227", True),
            "val.de": RemoteFile(_M30K.format("val.de"), "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660", True),
            "test2016.en": RemoteFile(_M30K.format("test_2016_flickr.en"), "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182", True),
            "test2016.de": RemoteFile(_M30K.format("test_2016_flickr.de"), "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16", True),
        },
    ),
    "tinyshakespeare": DatasetSpec(
        "tinyshakespeare",
        splits={"train": ("input.txt",), "val": ("input.txt",)},
        files={"input.txt": RemoteFile(_SHAKESPEARE, "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed")},
    ),
    "sst2": DatasetSpec(
        "sst2",
        splits={"train": ("train.tsv",), "dev": ("dev.tsv",)},
        files={
            "train.tsv": RemoteFile(_SST2.format("train"), "5b56af66a194e685c0fbde5f58c4355ab00f5485a29bfcae1085b4b9f8b1a6c3"),
            "dev.tsv": RemoteFile(_SST2.format("dev"), "c9ddb67ce3068540c5bb6562e1f34788302dd06d570e6ca0d5e61f7d5ef2bfad"),
        },
    ),
}

# WMT14 English-German as the paper used it (4.5M training pairs; newstest2013 to validate, newstest2014 to test):
# the archives of statmt.org, from which aiayn.data.wmt14 takes the sentence files. News Commentary is v12, as in
# fairseq's prepare-wmt14en2de.sh (WMT14 itself shipped v9); newstest2014 is the plain-text copy that Google's
# official Transformer evaluates on. The sums are of the archives (from a public download script; see docs/training.md).
_GB = 1 << 30
DATASETS["wmt14-en-de"] = DatasetSpec(
    "wmt14-en-de",
    splits={
        "train": ("training-parallel-europarl-v7.tgz", "training-parallel-commoncrawl.tgz", "training-parallel-nc-v12.tgz"),
        "newstest2013": ("dev.tgz",),
        "newstest2014": ("newstest2014.tgz",),
    },
    files={
        "training-parallel-europarl-v7.tgz": RemoteFile(
            "http://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz",
            "0224c7c710c8a063dfd893b0cc0830202d61f4c75c17eb8e31836103d27d96e7", max_bytes=2 * _GB),
        "training-parallel-commoncrawl.tgz": RemoteFile(
            "http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz",
            "c7a74e2ea01ac6c920123108627e35278d4ccb5701e15428ffa34de86fa3a9e5", max_bytes=2 * _GB),
        "training-parallel-nc-v12.tgz": RemoteFile(
            "http://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz",
            "2b45f30ef1d550d302fd17dd3a5cbe19134ccc4c2cf50c2dae534aee600101a2", max_bytes=2 * _GB),
        "dev.tgz": RemoteFile(
            "http://data.statmt.org/wmt17/translation-task/dev.tgz",
            "9d5ff04a28496b7796904ea65e50e3837bab14dbdca88b1e063105f17513dca9", max_bytes=_GB),
        "newstest2014.tgz": RemoteFile(
            "https://storage.googleapis.com/tf-perf-public/official_transformer/test_data/newstest2014.tgz",
            "1d07bf20db2f4607bb5f3c228e24c1fa17bdfb66d650cc5e713353606fde0800"),
    },
)

SST2_LABELS = ["0", "1"]  # 0 = negative, 1 = positive
SST2_CLASS_NAMES = ["negative", "positive"]  # what the labels mean, for classify's output


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/aiayn/data``, else ``~/.cache/aiayn/data``."""
    return user_cache_dir() / "data"


def search_dirs(data_dir: str | Path | None = None) -> list[tuple[Path, str]]:
    """The data roots looked in, in order, each with how it was chosen."""
    dirs = []
    if data_dir is not None:
        dirs.append((Path(data_dir), "the data_dir argument (--data-dir)"))
    if os.environ.get(ENV_VAR):
        dirs.append((Path(os.environ[ENV_VAR]), f"${ENV_VAR}"))
    dirs.append((cache_dir(), "the user cache"))
    return dirs


def resolve_files(
    name: str, split: str, *, data_dir: str | Path | None = None, download: bool = True
) -> dict[str, Path]:
    """Paths of the files of ``split`` of data set ``name`` (file name -> path), downloading them into
    the cache when no data root has them. Raises ``DataError`` naming the files to put where."""
    spec = _spec(name)
    if split not in spec.splits:
        raise ValueError(f"{name} has no split {split!r}; valid splits: {sorted(spec.splits)}")
    needed = spec.splits[split]
    for root, _ in search_dirs(data_dir):
        paths = {f: root / name / f for f in needed}
        if all(p.is_file() for p in paths.values()):
            for f, path in paths.items():
                check_file(path, spec.files[f].sha256)  # once; remembered beside the file
            return paths
    failure = "downloads are off (download=False)"
    if download:
        target = cache_dir() / name
        try:
            for f in needed:
                if not (target / f).is_file():
                    fetch_file(spec.files[f].url, target / f, sha256=spec.files[f].sha256, gunzip=spec.files[f].gunzip,
                               max_bytes=spec.files[f].max_bytes)
                    remember(target / f, spec.files[f].sha256)
                check_file(target / f, spec.files[f].sha256)
            return {f: target / f for f in needed}
        except DownloadError as e:
            failure = f"the download failed: {e}"
    raise DataError(_missing_message(spec, split, needed, data_dir, failure))


def load_multi30k(
    split: str, *, direction: str = "de-en", data_dir: str | Path | None = None, download: bool = True
) -> ParallelText:
    """Multi30k task 1 (``train`` 29000, ``val`` 1014, ``test2016`` 1000 pairs); ``direction`` is
    ``"de-en"`` (German source) or ``"en-de"``."""
    if direction not in MULTI30K_DIRECTIONS:
        raise ValueError(f"direction must be one of {MULTI30K_DIRECTIONS}, got {direction!r}")
    src, tgt = direction.split("-")
    files = resolve_files("multi30k", split, data_dir=data_dir, download=download)
    return read_parallel(files[f"{split}.{src}"], files[f"{split}.{tgt}"])


def load_tinyshakespeare(split: str, *, data_dir: str | Path | None = None, download: bool = True) -> str:
    """Tiny Shakespeare text: ``train`` is the first 90% of the characters, ``val`` the last 10%."""
    files = resolve_files("tinyshakespeare", split, data_dir=data_dir, download=download)
    train, val = split_text(read_text(files["input.txt"]), 0.9)
    return train if split == "train" else val


def load_sst2(split: str, *, data_dir: str | Path | None = None, download: bool = True) -> LabeledText:
    """SST-2 (``train`` 6920, ``dev`` 872 sentences); labels 0 = negative, 1 = positive."""
    files = resolve_files("sst2", split, data_dir=data_dir, download=download)
    return read_classification(files[f"{split}.tsv"], label_names=SST2_LABELS, format="tsv")


def _spec(name: str) -> DatasetSpec:
    if name not in DATASETS:
        raise ValueError(f"unknown data set {name!r}; known data sets: {sorted(DATASETS)}")
    return DATASETS[name]


def _missing_message(spec: DatasetSpec, split: str, needed: tuple[str, ...], data_dir: str | Path | None, failure: str) -> str:
    looked = "\n".join(f"  {root / spec.name}/  ({why})" for root, why in search_dirs(data_dir))
    cache = cache_dir() / spec.name
    put = "\n".join(f"  {cache / f}" for f in needed)
    origins = "\n".join(
        f"  {f}: {spec.files[f].url}" + (" (gunzip it)" if spec.files[f].gunzip else "") for f in needed
    )
    return (
        f"data set {spec.name!r}, split {split!r}: files {list(needed)} not found; looked in\n{looked}\n"
        f"and {failure}.\n"
        f"Put the files at\n{put}\n"
        f"or under <dir>/{spec.name}/ and pass data_dir=<dir> (--data-dir <dir>) or set {ENV_VAR}=<dir>.\n"
        f"Original files (sha256 in the data README):\n{origins}"
    )
