"""WMT14 English-German: the sentence files of a split, taken out of the archives of ``DATASETS["wmt14-en-de"]``.

The archives are found, downloaded and checked by :func:`aiayn.data.datasets.resolve_files` like
every data set's files. The English and German files of a split (``train`` = Europarl v7 + Common
Crawl + News Commentary, in that order) are then written beside them once, as ``<split>.en`` and
``<split>.de``, each atomically.
"""

from __future__ import annotations

import logging
import os
import tarfile
from pathlib import Path
from typing import BinaryIO

from aiayn.checkpoint.atomic_io import fsync_dir, temporary_sibling
from aiayn.data.datasets import resolve_files
from aiayn.data.errors import DataError
from aiayn.data.readers import ParallelText, read_parallel

__all__ = ["WMT14", "WMT14_MEMBERS", "LANGUAGES", "wmt14_files", "extract_sides", "load_wmt14"]

log = logging.getLogger(__name__)

WMT14 = "wmt14-en-de"
LANGUAGES = ("en", "de")
# split -> (archive, file name inside it with {} for the language), concatenated in this order
WMT14_MEMBERS: dict[str, tuple[tuple[str, str], ...]] = {
    "train": (
        ("training-parallel-europarl-v7.tgz", "europarl-v7.de-en.{}"),
        ("training-parallel-commoncrawl.tgz", "commoncrawl.de-en.{}"),
        ("training-parallel-nc-v12.tgz", "news-commentary-v12.de-en.{}"),
    ),
    "newstest2013": (("dev.tgz", "newstest2013.{}"),),
    "newstest2014": (("newstest2014.tgz", "newstest2014.{}"),),
}


def wmt14_files(split: str, *, data_dir: str | Path | None = None, download: bool = True) -> tuple[Path, Path]:
    """``(English file, German file)`` of ``split`` (``train``, ``newstest2013``, ``newstest2014``).

    Raises ``DataError`` listing the archives to put where when they are missing and cannot be downloaded.
    """
    if split not in WMT14_MEMBERS:
        raise ValueError(f"{WMT14} has no split {split!r}; valid splits: {sorted(WMT14_MEMBERS)}")
    archives = resolve_files(WMT14, split, data_dir=data_dir, download=download)
    directory = next(iter(archives.values())).parent
    sides = tuple(directory / f"{split}.{lang}" for lang in LANGUAGES)
    if not all(p.is_file() for p in sides):
        extract_sides(archives, WMT14_MEMBERS[split], sides)
    return sides[0], sides[1]


def load_wmt14(split: str, *, direction: str = "en-de", data_dir: str | Path | None = None, download: bool = True) -> ParallelText:
    """The sentence pairs of ``split``; ``direction`` ``en-de`` (the paper's) or ``de-en``."""
    if direction not in ("en-de", "de-en"):  # before anything is downloaded
        raise ValueError(f"direction must be 'en-de' or 'de-en', got {direction!r}")
    en, de = wmt14_files(split, data_dir=data_dir, download=download)
    return read_parallel(en, de) if direction == "en-de" else read_parallel(de, en)


def extract_sides(archives: dict[str, Path], members: tuple[tuple[str, str], ...], sides: tuple[Path, ...]) -> None:
    """Write ``sides[k]`` as the concatenation of each archive's member for language ``LANGUAGES[k]``.

    A member is found by its file name (archives differ in the folder they put it in). Raises
    ``DataError`` naming the archive and the file it lacks.
    """
    for lang, dest in zip(LANGUAGES, sides):
        tmp = temporary_sibling(dest)
        try:
            with open(tmp, "wb") as out:
                for archive, pattern in members:
                    _copy_member(archives[archive], pattern.format(lang), out)
            os.replace(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(dest.parent)
        log.info("wrote %s", dest)


def _copy_member(archive: Path, name: str, out: BinaryIO) -> None:
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                if member.isfile() and Path(member.name).name == name:
                    source = tar.extractfile(member)
                    assert source is not None  # a regular file
                    last = b"\n"
                    while chunk := source.read(1 << 20):
                        out.write(chunk)
                        last = chunk[-1:]
                    if last != b"\n":  # the next file's first line must not join this one's last
                        out.write(b"\n")
                    return
    except (tarfile.TarError, OSError, EOFError) as e:
        raise DataError(f"{archive}: not a readable tar archive ({e}); delete it to download it again") from None
    raise DataError(f"{archive}: holds no file named {name}; is it the archive of the data README?")
