"""Read and check a safetensors header before anything else touches the file (untrusted input).

A safetensors file is an 8-byte little-endian header length, a JSON header
(``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``) and the data.
The header size and entry count are capped before parsing (so a hostile file cannot cost unbounded
memory or time), and every record is checked: a known dtype, a shape of non-negative ints, offsets
inside the data that tile it without overlap, and a byte span equal to shape x dtype size. Every
error names the file and the tensor.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from aiayn.checkpoint.errors import CorruptCheckpointError

__all__ = ["MAX_HEADER_BYTES", "MAX_ENTRIES", "DTYPES", "TensorRecord", "read_header", "meta_state", "check_weights_file"]

MAX_HEADER_BYTES = 4 * 1024 * 1024  # 4 MiB; real headers (per shard) are well under 1 MiB
MAX_ENTRIES = 20_000  # tensors per file; GPT-2 has ~150, a paper-big optimizer state ~1,000

DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "U16": torch.uint16,
    "I32": torch.int32, "U32": torch.uint32, "I64": torch.int64, "U64": torch.uint64,
    "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
    "F8_E5M2": torch.float8_e5m2, "F8_E4M3": torch.float8_e4m3fn,
}


@dataclass(frozen=True)
class TensorRecord:
    """One tensor's entry in the header: its dtype, shape and byte span in the data section."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    end: int


def read_header(path: str | os.PathLike[str]) -> tuple[dict[str, TensorRecord], dict[str, str]]:
    """(records by name, metadata) of the safetensors file ``path``, checked; no tensor data is read.

    Raises ``FileNotFoundError`` for a missing file and ``CorruptCheckpointError`` naming the file
    (and the tensor) for a header that is too large, not JSON, or holds a bad record.
    """
    path = check_weights_file(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise CorruptCheckpointError(path, f"{size} bytes is too short for a safetensors header length")
        (length,) = struct.unpack("<Q", prefix)
        if length > MAX_HEADER_BYTES:
            raise CorruptCheckpointError(
                path, f"header of {length} bytes exceeds the limit of {MAX_HEADER_BYTES} (not read)"
            )
        if 8 + length > size:
            raise CorruptCheckpointError(path, f"header of {length} bytes runs past the end of the file ({size} bytes)")
        raw = f.read(length)
    if raw.count(b'"dtype"') > MAX_ENTRIES:  # a cheap count before parsing; checked again after
        raise CorruptCheckpointError(path, f"header lists more than the limit of {MAX_ENTRIES} tensors (not parsed)")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CorruptCheckpointError(path, f"header is not valid JSON ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(header, dict):
        raise CorruptCheckpointError(path, f"header must be a JSON object, got {type(header).__name__}")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise CorruptCheckpointError(path, "__metadata__ must map strings to strings")
    if len(header) > MAX_ENTRIES:
        raise CorruptCheckpointError(path, f"header lists {len(header)} tensors, more than the limit of {MAX_ENTRIES}")
    data_size = size - 8 - length
    records = {name: _record(path, name, entry, data_size) for name, entry in header.items()}
    _check_tiling(path, records, data_size)
    return records, metadata


def check_weights_file(path: str | os.PathLike[str]) -> Path:
    """``path`` if it is a regular weights file and not a symbolic link (one could point anywhere on the
    machine); ``FileNotFoundError`` when absent, ``CorruptCheckpointError`` naming it otherwise. Every
    weights file alike: ours, a checkpoint's, a Hugging Face single file or shard."""
    path = Path(path)
    if path.is_symlink():
        raise CorruptCheckpointError(
            path, f"is a symbolic link (to {os.readlink(path)}); weights are read from plain files only: copy the file "
            "into the directory (a Hugging Face cache links its files: download with --local-dir instead)"
        )
    if not path.exists():
        raise FileNotFoundError(f"no such weights file: {path}")
    if not path.is_file():
        raise CorruptCheckpointError(path, "is not a regular file (a directory, FIFO or device); refusing to read it")
    return path


def _record(path: Path, name: str, entry: object, data_size: int) -> TensorRecord:
    def bad(reason: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(path, f"tensor {name!r}: {reason}")

    if not isinstance(entry, dict):
        raise bad(f"expected an object with dtype, shape and data_offsets, got {type(entry).__name__}")
    dtype_name = entry.get("dtype")
    if dtype_name not in DTYPES:
        raise bad(f"unknown dtype {dtype_name!r}; known: {', '.join(DTYPES)}")
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise bad(f"shape must be a list of ints >= 0, got {shape!r}")
    offsets = entry.get("data_offsets")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
        raise bad(f"data_offsets must be [begin, end] ints, got {offsets!r}")
    begin, end = offsets
    if not 0 <= begin <= end <= data_size:
        raise bad(f"data_offsets [{begin}, {end}] are outside the data section (0 to {data_size} bytes)")
    dtype = DTYPES[dtype_name]
    expected = math.prod(shape) * dtype.itemsize
    if end - begin != expected:
        raise bad(f"shape {shape} of {dtype_name} needs {expected} bytes but data_offsets span {end - begin}")
    return TensorRecord(name, dtype, tuple(shape), begin, end)


def _check_tiling(path: Path, records: dict[str, TensorRecord], data_size: int) -> None:
    """The byte spans must cover the data section exactly, in order, without overlap or gap."""
    position, previous = 0, None
    for record in sorted(records.values(), key=lambda r: (r.begin, r.end)):
        if record.begin < position:
            raise CorruptCheckpointError(
                path, f"tensor {record.name!r}: data_offsets [{record.begin}, {record.end}] overlap tensor {previous!r}"
            )
        if record.begin > position:
            raise CorruptCheckpointError(
                path, f"tensor {record.name!r}: a gap of {record.begin - position} bytes before its data_offsets"
            )
        position, previous = record.end, record.name
    if position != data_size:
        raise CorruptCheckpointError(path, f"{data_size - position} bytes after the last tensor's data are not described")


def meta_state(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """The file's tensors as ``meta`` tensors (shape and dtype, no memory), aiayn's aliases expanded.

    For comparing a file with a model built on the ``meta`` device before allocating either.
    """
    records, metadata = read_header(path)
    state = {name: torch.empty(r.shape, dtype=r.dtype, device="meta") for name, r in records.items()}
    aliases = metadata.get("aiayn.aliases")
    if aliases is not None:
        try:
            for alias, canonical in json.loads(aliases).items():
                state[alias] = state[canonical]
        except (ValueError, KeyError, AttributeError, TypeError) as e:
            raise CorruptCheckpointError(Path(path), f"bad aiayn.aliases metadata ({e!r})") from e
    return state
