"""Token-id shards on disk: a flat ``.bin`` of ids (uint16 or uint32) and an ``.idx.npy`` index of
``(offset, length)`` per line, read back through ``numpy.memmap`` so every process shares the page cache.

Sequence ``j`` of a shard is ``tokens[offset[j] : offset[j] + length[j]]``. Both files are written
atomically (the index last), so a shard is either whole or absent; :func:`open_shard` checks that
the ``.bin`` holds exactly the tokens its index describes before anything reads it.
"""

from __future__ import annotations

import io
import itertools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from aiayn.checkpoint.atomic_io import atomic_write_bytes
from aiayn.data.errors import DataError

__all__ = ["SHARD_DTYPES", "shard_dtype", "flatten", "write_shard", "Shard", "open_shard", "shard_files"]

log = logging.getLogger(__name__)

SHARD_DTYPES: dict[str, type[np.unsignedinteger]] = {"uint16": np.uint16, "uint32": np.uint32}
_UINT16_IDS = 1 << 16  # uint16 holds ids 0..65535


def shard_dtype(vocab_size: int, requested: str, tokenizer_file: str | Path) -> str:
    """The dtype of the shards: ``"auto"`` takes uint16 when every id fits, else uint32.

    Raises ``DataError`` naming ``tokenizer_file`` when ``requested`` is ``"uint16"`` and the
    vocabulary has more than 65536 ids, and ``ValueError`` for an unknown dtype.
    """
    if requested == "auto":
        return "uint16" if vocab_size <= _UINT16_IDS else "uint32"
    if requested not in SHARD_DTYPES:
        raise ValueError(f"dtype must be one of auto, {', '.join(SHARD_DTYPES)}; got {requested!r}")
    if requested == "uint16" and vocab_size > _UINT16_IDS:
        raise DataError(
            f"{tokenizer_file}: the vocabulary has {vocab_size} ids (largest {vocab_size - 1}), which do not fit uint16 "
            f"shards (ids 0..{_UINT16_IDS - 1}); pass dtype uint32 or auto"
        )
    return requested


def shard_files(directory: Path, name: str) -> tuple[Path, Path]:
    """``(<name>.bin, <name>.idx.npy)`` under ``directory``."""
    return directory / f"{name}.bin", directory / f"{name}.idx.npy"


def flatten(seqs: Sequence[Sequence[int]], dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens end to end, lengths)`` of ``seqs``; ``DataError`` when an id does not fit ``dtype``."""
    lengths = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
    tokens = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64, count=int(lengths.sum()))
    if len(tokens) and int(tokens.max()) > np.iinfo(SHARD_DTYPES[dtype]).max:
        line = int(np.searchsorted(np.cumsum(lengths), int(np.argmax(tokens)), side="right"))
        raise DataError(f"token id {int(tokens.max())} (line {line + 1} of the batch) does not fit {dtype}")
    return tokens.astype(SHARD_DTYPES[dtype]), lengths


def write_shard(directory: Path, name: str, tokens: np.ndarray, lengths: np.ndarray) -> dict[str, int]:
    """Write shard ``name``: ``tokens`` (its dtype is the shard's) end to end, then the index, each
    atomically; return ``{lines, tokens}``."""
    index = np.zeros((len(lengths), 2), dtype=np.int64)  # (lines, [offset, length])
    np.cumsum(lengths[:-1], out=index[1:, 0])
    index[:, 1] = lengths
    n_tokens = int(lengths.sum())
    if n_tokens != len(tokens):
        raise ValueError(f"shard {name}: {len(tokens)} tokens but the lengths add up to {n_tokens}")
    bin_path, idx_path = shard_files(directory, name)
    atomic_write_bytes(bin_path, tokens.tobytes())
    buffer = io.BytesIO()
    np.save(buffer, index, allow_pickle=False)
    atomic_write_bytes(idx_path, buffer.getvalue())  # last: a shard with an index is whole
    return {"lines": len(lengths), "tokens": n_tokens}


@dataclass
class Shard:
    """One shard, memory-mapped on first use (a pickled shard, e.g. for a DataLoader worker, reopens its files)."""

    bin_path: Path
    idx_path: Path
    dtype: str
    _tokens: np.ndarray | None = field(default=None, repr=False)
    _index: np.ndarray | None = field(default=None, repr=False)

    @property
    def tokens(self) -> np.ndarray:
        if self._tokens is None:
            size = self.bin_path.stat().st_size
            # np.memmap refuses an empty file: an empty shard is an empty array.
            mapped = np.memmap(self.bin_path, dtype=SHARD_DTYPES[self.dtype], mode="r") if size else np.zeros(0, SHARD_DTYPES[self.dtype])
            self._tokens = np.asarray(mapped)  # a plain view of the mapping: slicing it skips memmap's per-slice bookkeeping
        return self._tokens

    @property
    def index(self) -> np.ndarray:
        """``(lines, 2)`` int64: offset and length of each line."""
        if self._index is None:
            self._index = np.asarray(np.load(self.idx_path, mmap_mode="r", allow_pickle=False))
        return self._index

    @property
    def lengths(self) -> np.ndarray:
        return self.index[:, 1]

    def __len__(self) -> int:
        return len(self.index)

    def __getstate__(self) -> dict[str, object]:
        return {"bin_path": self.bin_path, "idx_path": self.idx_path, "dtype": self.dtype, "_tokens": None, "_index": None}


def open_shard(directory: Path, name: str, dtype: str, *, lines: int, tokens: int) -> Shard:
    """Open shard ``name`` and check it against its index and the manifest's counts.

    Raises ``DataError`` naming the file (and, for a short ``.bin``, the first line whose tokens
    lie past its end) when the files are missing, the index is malformed, or the ``.bin`` size
    disagrees with the index.
    """
    bin_path, idx_path = shard_files(directory, name)
    for path in (bin_path, idx_path):
        if not path.is_file():
            raise DataError(f"{path}: shard file missing; run `aiayn prepare` again to finish the directory")
    shard = Shard(bin_path, idx_path, dtype)
    try:
        index = shard.index
    except ValueError as e:
        raise DataError(f"{idx_path}: not a shard index (.npy of int64 offset/length pairs): {e}") from None
    if index.ndim != 2 or index.shape[1] != 2 or index.dtype != np.int64:
        raise DataError(f"{idx_path}: expected an int64 array of shape (lines, 2), got {index.dtype} {index.shape}")
    if len(index) != lines:
        raise DataError(f"{idx_path}: the index has {len(index)} lines but the manifest records {lines}")
    itemsize = np.dtype(SHARD_DTYPES[dtype]).itemsize
    size = bin_path.stat().st_size
    ends = index[:, 0] + index[:, 1]
    expected = int(ends[-1]) if lines else 0
    if size != expected * itemsize or expected != tokens:
        past = np.flatnonzero(ends * itemsize > size)
        where = f"; line {int(past[0]) + 1} of the shard (index entry {int(past[0])}) ends past the end of the file" if len(past) else ""
        raise DataError(
            f"{bin_path}: {size} bytes, but its index {idx_path.name} describes {expected} {dtype} tokens "
            f"({expected * itemsize} bytes) and the manifest {tokens}{where}: the shard is damaged; run `aiayn prepare` again"
        )
    starts = index[:, 0]
    if lines and (starts[0] != 0 or np.any(starts[1:] != ends[:-1]) or np.any(index[:, 1] < 0)):
        bad = int(np.argmax(np.concatenate([[starts[0] != 0], starts[1:] != ends[:-1]]) | (index[:, 1] < 0)))
        raise DataError(f"{idx_path}: line {bad + 1} (index entry {bad}) does not start where the previous line ends")
    return shard
