"""A corpus tokenized once (``aiayn prepare``) into memory-mapped token-id shards, and reading it back for training.

A prepared directory holds the tokenizer, per split and side the shards of :mod:`aiayn.data.shards`
(``train.src.00000.bin`` + ``.idx.npy``, ...), and ``manifest.json``: the source files' sha256 and
line counts, the tokenizer's sha256 and the settings. Training opens the shards with
``numpy.memmap`` and reads them as :class:`~aiayn.data.prepared_pairs.PreparedPairs`: nothing is
tokenized again, every rank shares the page cache, and the process's memory does not hold the corpus.
A source file or tokenizer that changed since is refused, naming it. A prepare that stops part way keeps its finished shards
(``manifest.partial.json`` says which) and continues from there when run again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from aiayn.checkpoint.atomic_io import atomic_write_bytes, file_sha256
from aiayn.data.datasets import resolve_files
from aiayn.data.encoded import TooLong
from aiayn.data.errors import DataError
from aiayn.data.prepared_pairs import PreparedPairs, PreparedSide
from aiayn.data.readers import read_lines
from aiayn.data.shards import flatten, open_shard, shard_dtype, write_shard
from aiayn.data.verified import check_file, remember
from aiayn.data.wmt14 import wmt14_files
from aiayn.tokenization.base import Tokenizer
from aiayn.tokenization.bpe import BPETokenizer
from aiayn.tokenization.io import default_file_name, load_tokenizer, load_tokenizer_pair
from aiayn.tokenization.special import encode_sources, special_ids

__all__ = [
    "MANIFEST", "PARTIAL", "PrepareSettings", "prepare", "open_prepared", "Prepared", "PreparedPairs",
    "tokenizer_sha256", "count_lines", "CORPORA", "corpus_files",
]

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
PARTIAL = "manifest.partial.json"  # the manifest of a prepare still under way: what is done so far
FORMAT, VERSION = "aiayn-prepared", 1
SIDES = ("src", "tgt")
_OUTPUT_NEUTRAL = ("batch_lines",)  # settings that do not change the shards: a resume may change them


@dataclass(frozen=True)
class PrepareSettings:
    """How to prepare: the tokenizer (learned byte-level BPE of ``vocab_size`` ids, or the saved one at
    ``tokenizer``), the shard dtype (``auto``: uint16 when the vocabulary fits) and sizes."""

    vocab_size: int = 37_000  # the paper's shared source-target vocabulary (section 5.1)
    tokenizer: str | None = None  # a saved tokenizer (file or directory) to use instead of learning one
    dtype: str = "auto"  # auto | uint16 | uint32
    shard_lines: int = 1_000_000  # lines per shard: the unit of resuming
    batch_lines: int = 20_000  # lines per call of the tokenizer's (multi-threaded) batch encoding
    min_frequency: int = 2  # BPE: a merge seen fewer times is not learned

    def __post_init__(self) -> None:
        for name in ("vocab_size", "shard_lines", "batch_lines", "min_frequency"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


CORPORA = ("wmt14-en-de", "multi30k")


def corpus_files(name: str, *, direction: str | None = None, data_dir: str | Path | None = None,
                 download: bool = True) -> dict[str, tuple[Path, Path]]:
    """The ``train`` and ``val`` (source, target) files of a named corpus, found or downloaded as
    :mod:`aiayn.data.datasets` does: ``wmt14-en-de`` (val = newstest2013; ``direction`` en-de) or
    ``multi30k`` (``direction`` de-en by default)."""
    if name == "wmt14-en-de":
        direction = direction or "en-de"
        if direction not in ("en-de", "de-en"):
            raise ValueError(f"direction must be 'en-de' or 'de-en', got {direction!r}")
        splits, missing = {}, []
        for split, name in (("train", "train"), ("val", "newstest2013")):
            try:
                splits[split] = wmt14_files(name, data_dir=data_dir, download=download)
            except DataError as e:  # say at once every archive to put where, not one split at a time
                missing.append(str(e))
        if missing:
            raise DataError("\n\n".join(missing))
        return {k: (en, de) if direction == "en-de" else (de, en) for k, (en, de) in splits.items()}
    if name == "multi30k":
        src, tgt = (direction or "de-en").split("-")
        found = {s: resolve_files("multi30k", s, data_dir=data_dir, download=download) for s in ("train", "val")}
        return {s: (files[f"{s}.{src}"], files[f"{s}.{tgt}"]) for s, files in found.items()}
    raise ValueError(f"unknown corpus {name!r}; known corpora: {', '.join(CORPORA)} (or give the files)")


def count_lines(path: Path) -> tuple[int, str]:
    """``(lines, sha256)`` of a text file in one read; lines as :func:`~aiayn.data.readers.read_lines` counts them."""
    digest, lines, last = hashlib.sha256(), 0, b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n"), digest.hexdigest()


def tokenizer_sha256(tokenizer: Tokenizer) -> str:
    """sha256 of the tokenizer as saved: the same tokenizer gives the same hash wherever it was loaded from."""
    return hashlib.sha256(_tokenizer_bytes(tokenizer)).hexdigest()


def _tokenizer_bytes(tokenizer: Tokenizer) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        return tokenizer.save(Path(tmp) / default_file_name(tokenizer)).read_bytes()


def prepare(out_dir: str | Path, splits: dict[str, tuple[Path, Path]], settings: PrepareSettings | None = None) -> Path:
    """Tokenize ``splits`` (name -> (source file, target file); ``"train"`` required) into ``out_dir``.

    Learns the tokenizer on the training split unless ``settings.tokenizer`` names one. Resumes a
    prepare that stopped part way; a finished directory with the same sources and settings is left
    as it is. Raises ``DataError`` (before any tokenizing) for sides with different line counts, a
    vocabulary too large for the dtype, or a directory prepared from other sources or settings,
    naming the file and what differs. Returns the manifest's path.
    """
    settings = settings or PrepareSettings()
    if "train" not in splits:
        raise ValueError(f"splits must include 'train', got {sorted(splits)}")
    out = Path(out_dir)
    if settings.tokenizer is None:  # a vocabulary the dtype cannot hold is refused before it is learned
        shard_dtype(settings.vocab_size, settings.dtype, f"the BPE to learn (vocab_size={settings.vocab_size})")
    sources = {name: _check_pair(Path(src), Path(tgt)) for name, (src, tgt) in splits.items()}
    out.mkdir(parents=True, exist_ok=True)
    done = _previous(out, sources, settings)
    if done is not None and done.get("complete"):
        log.info("%s is already prepared from these files: nothing to do", out)
        return out / MANIFEST
    tokenizer, tok_record = _tokenizer(out, splits["train"], sources["train"]["lines"], settings, done)
    dtype = shard_dtype(tokenizer.vocab_size, settings.dtype, out / tok_record["file"])
    manifest: dict[str, Any] = {
        "format": FORMAT, "version": VERSION, "complete": False, "sources": sources, "tokenizer": tok_record,
        "settings": asdict(settings) | {"shard_dtype": dtype, "src_eos": True, "eos_id": special_ids(tokenizer).need("eos", "prepare")},
        "shards": (done or {}).get("shards", {}),
    }
    _write_json(out / PARTIAL, manifest)
    for split, (src_path, tgt_path) in splits.items():
        n = sources[split]["lines"]
        for side, path in zip(SIDES, (src_path, tgt_path)):
            _prepare_side(out, manifest, split, side, Path(path), n, tokenizer, settings, dtype)
    manifest["complete"] = True
    _write_json(out / MANIFEST, manifest)
    (out / PARTIAL).unlink(missing_ok=True)
    log.info("prepared %s: %s", out, ", ".join(f"{s} {sources[s]['lines']} pairs" for s in splits))
    return out / MANIFEST


def _check_pair(src: Path, tgt: Path) -> dict[str, Any]:
    """Line counts and sha256 of both sides; ``DataError`` naming the files and the first line without a partner."""
    for path in (src, tgt):
        if not path.is_file():
            raise DataError(f"{path}: no such file")
    (n_src, sha_src), (n_tgt, sha_tgt) = count_lines(src), count_lines(tgt)
    if n_src != n_tgt:
        longer = src if n_src > n_tgt else tgt
        raise DataError(
            f"parallel files differ in length: {src} has {n_src} lines, {tgt} has {n_tgt}; line {min(n_src, n_tgt) + 1} "
            f"of {longer} has no partner (line i of one file must translate line i of the other)"
        )
    if n_src == 0:
        raise DataError(f"{src}: file is empty (0 lines); expected one sentence per line")
    remember(src, sha_src)  # training checks the sources against the manifest: hashed once, here
    remember(tgt, sha_tgt)
    return {"lines": n_src, "src": {"path": str(src.resolve()), "sha256": sha_src}, "tgt": {"path": str(tgt.resolve()), "sha256": sha_tgt}}


def _previous(out: Path, sources: dict[str, Any], settings: PrepareSettings) -> dict[str, Any] | None:
    """The manifest already in ``out`` (finished, else partial) when it matches; ``DataError`` naming what differs."""
    for name in (MANIFEST, PARTIAL):
        if not (out / name).is_file():
            continue
        old = _read_json(out / name)
        changed = _differences(old.get("sources", {}), sources, "sources")
        new_settings = {k: v for k, v in asdict(settings).items() if k not in _OUTPUT_NEUTRAL}
        old_settings = {k: v for k, v in old.get("settings", {}).items() if k in new_settings}
        changed += _differences(old_settings, new_settings, "settings")
        if changed:
            raise DataError(
                f"{out / name}: {out} was prepared from other files or settings ({'; '.join(changed)}); "
                "prepare into another directory, or delete this one to start over"
            )
        return old
    return None


def _differences(old: Any, new: Any, path: str) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in sorted(set(old) | set(new)) for d in _differences(old.get(k), new.get(k), f"{path}.{k}")]
    return [] if old == new else [f"{path}: was {old!r}, now {new!r}"]


def _tokenizer(
    out: Path, train: tuple[Path, Path], lines: int, settings: PrepareSettings, done: dict[str, Any] | None,
) -> tuple[Tokenizer, dict[str, Any]]:
    """The tokenizer of the run: the one a partial prepare already wrote, the given one, or one learned on
    ``train`` (``lines`` pairs, as :func:`_check_pair` counted them)."""
    if done is not None:  # resuming: the tokenizer is already there, checked against its hash
        return _load_checked_tokenizer(out, done["tokenizer"], out / PARTIAL), done["tokenizer"]
    if settings.tokenizer is not None:
        src, tgt = load_tokenizer_pair(settings.tokenizer)
        if src is not tgt:
            raise ValueError(f"{settings.tokenizer}: a source/target pair of tokenizers; prepare takes one shared tokenizer (the paper's)")
        tokenizer: Tokenizer = src
    else:
        log.info("learning a byte-level BPE of %d ids on %s and %s", settings.vocab_size, *train)
        tokenizer = BPETokenizer.train(_lines_of(train), settings.vocab_size, min_frequency=settings.min_frequency, length=2 * lines)
    data = _tokenizer_bytes(tokenizer)
    name = default_file_name(tokenizer)
    shard_dtype(tokenizer.vocab_size, settings.dtype, settings.tokenizer or out / name)  # before anything is written
    atomic_write_bytes(out / name, data)
    record = {"file": name, "sha256": hashlib.sha256(data).hexdigest(), "vocab_size": tokenizer.vocab_size,
              "kind": type(tokenizer).__name__, "given": settings.tokenizer}
    return tokenizer, record


def _lines_of(files: Sequence[Path]) -> Iterator[str]:
    for path in files:  # one side in memory at a time
        yield from read_lines(path)


def _load_checked_tokenizer(out: Path, record: dict[str, Any], manifest: Path) -> Tokenizer:
    path = out / record["file"]
    if not path.is_file():
        raise DataError(f"{path}: the tokenizer that {manifest} records is missing; prepare again")
    got = file_sha256(path)
    if got != record["sha256"]:
        raise DataError(
            f"{path} has sha256 {got}, but {manifest} (tokenizer.sha256) records {record['sha256']}: the manifest is "
            "from another tokenizer, so its shards hold other ids; prepare again"
        )
    return load_tokenizer(path)


def _prepare_side(
    out: Path, manifest: dict[str, Any], split: str, side: str, path: Path, n: int,
    tokenizer: Tokenizer, settings: PrepareSettings, dtype: str,
) -> None:
    """Write the missing shards of one side of one split; each finished shard is recorded at once."""
    records: list[dict[str, Any]] = manifest["shards"].setdefault(f"{split}.{side}", [])
    n_shards = math.ceil(n / settings.shard_lines)
    if len(records) == n_shards:
        return
    lines = read_lines(path)
    encode = (lambda texts: encode_sources(tokenizer, texts)) if side == "src" else tokenizer.encode_batch  # sources as in decoding
    for k in range(len(records), n_shards):
        name = f"{split}.{side}.{k:05d}"
        chunk = lines[k * settings.shard_lines : (k + 1) * settings.shard_lines]
        pieces = [flatten(encode(chunk[start : start + settings.batch_lines]), dtype)
                  for start in range(0, len(chunk), settings.batch_lines)]  # ids as arrays a batch at a time: compact
        tokens, lengths = (np.concatenate([piece[i] for piece in pieces]) for i in (0, 1))
        records.append({"name": name, **write_shard(out, name, tokens, lengths)})
        _write_json(out / PARTIAL, manifest)
        log.info("%s: shard %d of %d written", f"{split}.{side}", k + 1, n_shards)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    atomic_write_bytes(path, (json.dumps(data, indent=1) + "\n").encode())


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise DataError(f"{path}: not a prepared-corpus manifest (invalid JSON: {e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise DataError(f"{path}: not a prepared-corpus manifest (expected \"format\": \"{FORMAT}\")")
    if data.get("version") != VERSION:
        raise DataError(f"{path}: manifest version {data.get('version')!r}, this aiayn reads version {VERSION}; prepare again")
    return data


@dataclass
class Prepared:
    """An opened prepared directory: its manifest, its tokenizer, and its splits as datasets."""

    directory: Path
    manifest: dict[str, Any]
    tokenizer: Tokenizer

    @property
    def splits(self) -> list[str]:
        return sorted(self.manifest["sources"])

    def pairs(self, split: str, *, max_len: int | None = None, too_long: TooLong = "error") -> PreparedPairs:
        """The pairs of ``split``, their shards checked against their indexes and the manifest."""
        if split not in self.manifest["sources"]:
            raise DataError(f"{self.directory / MANIFEST}: no split {split!r}; this directory has {self.splits}")
        settings = self.manifest["settings"]
        sides = []
        for side in SIDES:
            shards = [open_shard(self.directory, r["name"], settings["shard_dtype"], lines=r["lines"], tokens=r["tokens"])
                      for r in self.manifest["shards"][f"{split}.{side}"]]
            sides.append(PreparedSide(shards, settings["shard_lines"]))
        return PreparedPairs(sides[0], sides[1], max_len=max_len, too_long=too_long, eos_id=settings["eos_id"])


def open_prepared(directory: str | Path, *, tokenizers: tuple[Tokenizer, Tokenizer] | None = None) -> Prepared:
    """Open a prepared directory for training, refusing it when it no longer matches its manifest.

    Checks (``DataError`` naming the file and what changed): the manifest is whole, the tokenizer file
    is the one the manifest records, ``tokenizers`` (a resumed run's) are that tokenizer, and each
    source file still present has the recorded sha256 (hashed only when its size or time changed).
    """
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        partial = " (an interrupted prepare: run `aiayn prepare` again to finish it)" if (directory / PARTIAL).is_file() else ""
        raise DataError(f"{path}: no manifest, so {directory} is not a prepared corpus{partial}; make one with `aiayn prepare`")
    manifest = _read_json(path)
    if not manifest.get("complete"):
        raise DataError(f"{path}: the prepare did not finish; run `aiayn prepare` again")
    tokenizer = _load_checked_tokenizer(directory, manifest["tokenizer"], path)
    if tokenizers is not None:
        for role, given in zip(SIDES, tokenizers):
            got = tokenizer_sha256(given)
            if got != manifest["tokenizer"]["sha256"]:
                raise DataError(
                    f"{path}: the shards were written with the tokenizer of sha256 {manifest['tokenizer']['sha256']}, "
                    f"but the run's {role} tokenizer (its checkpoint's) has {got}: the manifest is from another tokenizer"
                )
    for split, record in manifest["sources"].items():
        for side in SIDES:
            _check_source(Path(record[side]["path"]), record[side]["sha256"], path, f"sources.{split}.{side}")
    return Prepared(directory, manifest, tokenizer)


def _check_source(source: Path, sha256: str, manifest: Path, key: str) -> None:
    if not source.is_file():
        log.warning("%s: %s is gone; training on its shards without checking it", manifest, source)
        return
    try:
        check_file(source, sha256)
    except DataError:
        raise DataError(
            f"{source} changed since it was prepared: {manifest} ({key}.sha256) records {sha256}. "
            "Its shards hold the old text; run `aiayn prepare` again (into a new directory) or restore the file"
        ) from None
