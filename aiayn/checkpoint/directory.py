"""The checkpoint directory on disk: its file names, the atomic write with a ``COMPLETE`` marker
(each file's size and sha256), verification, and finding the checkpoints of a run.

What goes into the files (weights, optimizer, trainer and RNG state) is :mod:`aiayn.checkpoint.state`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from aiayn.checkpoint import atomic_io
from aiayn.checkpoint.errors import CorruptCheckpointError
from aiayn.checkpoint.weights import read_safetensors
from aiayn.untrusted import UntrustedInputError, read_json_file

__all__ = [
    "FORMAT", "MARKER", "MODEL_FILE", "CONFIG_FILE", "OPTIMIZER_TENSORS", "OPTIMIZER_JSON", "TRAINER_FILE",
    "RNG_TENSORS", "RNG_JSON", "RESERVED", "STEP_DIR", "CorruptCheckpointWarning", "checkpoint_name",
    "write_checkpoint_dir", "json_bytes", "verify_checkpoint", "read_json", "list_checkpoints",
    "latest_checkpoint", "resolve_checkpoint", "incomplete_checkpoints", "warn_incomplete", "set_aside_newer",
]

FORMAT = 1
MARKER = "COMPLETE"
MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
OPTIMIZER_TENSORS, OPTIMIZER_JSON = "optimizer.safetensors", "optimizer.json"
TRAINER_FILE = "trainer.json"
RNG_TENSORS, RNG_JSON = "rng.safetensors", "rng.json"
RESERVED = frozenset(
    {MARKER, MODEL_FILE, CONFIG_FILE, OPTIMIZER_TENSORS, OPTIMIZER_JSON, TRAINER_FILE, RNG_TENSORS, RNG_JSON}
)
STEP_DIR = re.compile(r"^step-(\d+)$")
log = logging.getLogger(__name__)


class CorruptCheckpointWarning(UserWarning):
    """A checkpoint was skipped because one of its files is corrupt."""


def checkpoint_name(step: int) -> str:
    """Directory name of the checkpoint at ``step`` (``step-000123``)."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    return f"step-{step:06d}"


def write_checkpoint_dir(
    final: str | os.PathLike[str],
    files: Sequence[tuple[str, Callable[[], bytes]]],
    marker_fields: Mapping[str, Any],
    *,
    tmp: Path | None = None,
) -> Path:
    """Write ``files`` (name, producer of bytes) and the ``COMPLETE`` marker, then rename into ``final``.

    The files are produced and written one at a time into a temporary sibling that is fsynced and
    renamed; on any error it is removed and ``final`` is untouched. ``tmp``: that sibling, already
    holding files others wrote (every rank's DCP shards, see sharded.py); they are listed too. Raises
    ``FileExistsError`` if ``final`` exists and ``OSError`` (same errno) naming ``final`` and the file being written.
    """
    final = Path(final)
    if final.exists():
        raise FileExistsError(f"checkpoint directory already exists: {final}")
    final.parent.mkdir(parents=True, exist_ok=True)
    prefilled = tmp is not None
    tmp = tmp if tmp is not None else atomic_io.temporary_sibling(final)
    current = "(creating the temporary directory)"
    try:
        entries: dict[str, dict[str, Any]] = {}
        if prefilled:
            current = "(listing the files already written)"
            entries = _list_written(tmp)
        else:
            tmp.mkdir()
        for name, produce in files:
            current = name
            data = produce()
            atomic_io.write_durable(tmp / name, data)
            entries[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        current = MARKER
        marker = {"format": FORMAT, **marker_fields, "files": entries}
        atomic_io.write_durable(tmp / MARKER, json_bytes(marker, "checkpoint marker"))
        atomic_io.fsync_dir(tmp)
        current = "(rename into place)"
        os.rename(tmp, final)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        reason = e.strerror or str(e)
        raise OSError(e.errno, f"{reason} while saving checkpoint {final} (at {current})", str(final)) from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_io.fsync_dir(final.parent)
    return final


def _list_written(tmp: Path) -> dict[str, dict[str, Any]]:
    """Marker entries of the files below ``tmp`` (``dcp/__0_0.distcp``), their folders fsynced."""
    entries = {}
    for f in sorted(tmp.rglob("*")):
        if f.is_dir():
            atomic_io.fsync_dir(f)
        elif f.is_file():
            entries[f.relative_to(tmp).as_posix()] = {"size": f.stat().st_size, "sha256": atomic_io.file_sha256(f)}
    return entries


def json_bytes(obj: Any, what: str) -> bytes:
    try:
        return json.dumps(obj, indent=2, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise type(e)(f"cannot store {what} as JSON: {e}") from e


def verify_checkpoint(path: str | os.PathLike[str], *, check_hashes: bool = True) -> dict[str, Any]:
    """Check a checkpoint directory against its marker and return the marker.

    Every listed file must exist with its recorded size (and sha256 when ``check_hashes``), JSON
    files must parse and safetensors headers must read. Raises ``FileNotFoundError`` naming a missing
    directory or marker and ``CorruptCheckpointError`` naming the first bad file.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"no such checkpoint directory: {path}")
    if not (path / MARKER).is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint: it has no {MARKER} marker (interrupted save?)")
    marker = read_json(path / MARKER)
    files = marker.get("files") if isinstance(marker, dict) else None
    if not isinstance(marker, dict) or marker.get("format") != FORMAT or not isinstance(files, dict):
        raise CorruptCheckpointError(path / MARKER, f"expected a format-{FORMAT} marker with a 'files' table")
    if isinstance(marker.get("step"), bool) or not isinstance(marker.get("step"), int):
        raise CorruptCheckpointError(path / MARKER, f"expected an int 'step', got {marker.get('step')!r}")
    # A sharded checkpoint (train.parallel=fsdp, see sharded.py) holds DCP shards instead of the model file.
    for required in (("dcp/.metadata", CONFIG_FILE) if marker.get("sharded") == "dcp" else (MODEL_FILE, CONFIG_FILE)):
        if required not in files:
            raise CorruptCheckpointError(path / required, f"not listed in {MARKER}")
    for pair in ((OPTIMIZER_TENSORS, OPTIMIZER_JSON), (RNG_TENSORS, RNG_JSON)):
        for name, other in (pair, pair[::-1]):
            if name in files and other not in files:
                raise CorruptCheckpointError(path / other, f"not listed in {MARKER} although {name} is")
    for name, entry in files.items():
        _check_file_name(path, name)
        _verify_file(path / name, entry, check_hashes)
    return marker


def _check_file_name(path: Path, name: str) -> None:
    """A marker entry must name a file inside the checkpoint: a relative path whose parts are plain names
    (``dcp/.metadata`` for sharded state), no ``..``, no backslash, not absolute."""
    parts = name.split("/")
    if (not name or "\\" in name or "\0" in name or Path(name).is_absolute()
            or any(part in ("", ".", "..") for part in parts)):
        raise CorruptCheckpointError(path / MARKER, f"lists {name!r}, which is not a file name inside {path}")
    if (path / name).is_symlink():
        raise CorruptCheckpointError(path / name, "is a symbolic link; a checkpoint holds plain files only")
    if any((path / "/".join(parts[: i + 1])).is_symlink() for i in range(len(parts) - 1)):
        raise CorruptCheckpointError(path / name, "lies under a symbolic link; a checkpoint holds plain files only")


def _verify_file(file: Path, entry: Any, check_hash: bool) -> None:
    if not isinstance(entry, dict):
        raise CorruptCheckpointError(file, f"{MARKER} entry should be a dict with size and sha256, got {entry!r}")
    if not file.is_file():
        raise CorruptCheckpointError(file, f"listed in {MARKER} but missing")
    size = file.stat().st_size
    if size != entry.get("size"):
        raise CorruptCheckpointError(file, f"size is {size} bytes, {MARKER} records {entry.get('size')}")
    if check_hash:
        digest = atomic_io.file_sha256(file)
        if digest != entry.get("sha256"):
            raise CorruptCheckpointError(file, f"sha256 {digest} does not match {entry.get('sha256')} in {MARKER}")
    if file.suffix == ".json":
        read_json(file)
    elif file.suffix == ".safetensors":
        read_safetensors(file)


def read_json(file: Path) -> Any:
    """A checkpoint's JSON file through the bounded reader (size, depth, regular file); ``CorruptCheckpointError``
    naming the file otherwise, so a hostile marker makes a resume fall back instead of crashing."""
    try:
        return read_json_file(file, what="checkpoint JSON file")
    except UntrustedInputError as e:
        raise CorruptCheckpointError(file, str(e).removeprefix(f"{file}: ")) from None


def list_checkpoints(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Checkpoint directories of ``run_dir`` that hold a marker, oldest step first (not verified).

    A missing ``run_dir`` holds no checkpoints: the result is empty.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = []
    for child in run_dir.iterdir():
        match = STEP_DIR.match(child.name)
        if match and child.is_symlink():
            message = f"ignoring {child}: a checkpoint must be a directory of the run, not a symbolic link"
            warnings.warn(message, CorruptCheckpointWarning, stacklevel=2)
        elif match and child.is_dir() and (child / MARKER).is_file():
            found.append((int(match.group(1)), child))
    return [p for _, p in sorted(found)]


def incomplete_checkpoints(run_dir: str | os.PathLike[str]) -> list[Path]:
    """``step-*`` directories of ``run_dir`` without a ``COMPLETE`` marker, and leftover ``.tmp-step-*``
    directories: what a save killed half-way leaves behind."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    return sorted(
        child for child in run_dir.iterdir()
        if not child.is_symlink() and child.is_dir() and (
            child.name.startswith(".tmp-step-") or (STEP_DIR.match(child.name) and not (child / MARKER).is_file())
        )
    )


def warn_incomplete(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Warn about each interrupted save in ``run_dir`` (see ``incomplete_checkpoints``); return them."""
    found = incomplete_checkpoints(run_dir)
    for path in found:
        warnings.warn(
            f"skipping {path}: an interrupted save (no {MARKER} marker); it is not a checkpoint",
            CorruptCheckpointWarning, stacklevel=2,
        )
    return found


def latest_checkpoint(run_dir: str | os.PathLike[str]) -> Path:
    """The newest checkpoint of ``run_dir`` that verifies; corrupt ones are skipped with a warning.

    Raises ``FileNotFoundError`` naming ``run_dir`` when it does not exist or holds no complete
    checkpoint (listing the corrupt ones skipped).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"resume path does not exist: {run_dir}")
    skipped: list[str] = []
    incomplete = warn_incomplete(run_dir)
    for candidate in reversed(list_checkpoints(run_dir)):
        try:
            verify_checkpoint(candidate)
            return candidate
        except CorruptCheckpointError as e:
            warnings.warn(f"skipping checkpoint {candidate.name}: {e}", CorruptCheckpointWarning, stacklevel=2)
            skipped.append(str(e))
    if skipped:
        detail = f"; skipped corrupt ones: {'; '.join(skipped)}"
    else:
        detail = f" (a step-NNNNNN directory with a {MARKER} marker)"
    if incomplete:
        detail += f"; interrupted saves (no {MARKER}): {', '.join(p.name for p in incomplete)}"
    raise FileNotFoundError(f"no complete checkpoint in {run_dir}{detail}")


def set_aside_newer(run_dir: str | os.PathLike[str], step: int) -> list[Path]:
    """Move the checkpoints newer than ``step`` out of the way, since resuming from ``step`` redoes them.

    A valid one becomes ``superseded-step-N-<time>`` (it is kept, never called corrupt), one that fails
    verification ``corrupt-step-N-<time>``, an interrupted save ``incomplete-step-N-<time>``. Returns the
    new paths.
    """
    moved = []
    interrupted = [p for p in incomplete_checkpoints(run_dir) if STEP_DIR.match(p.name)]
    for path in sorted([*list_checkpoints(run_dir), *interrupted]):
        if int(STEP_DIR.match(path.name).group(1)) <= step:  # type: ignore[union-attr]
            continue
        try:
            verify_checkpoint(path)
            kind, why = "superseded", "valid, but newer than the checkpoint resumed from"
        except FileNotFoundError:
            kind, why = "incomplete", f"an interrupted save without {MARKER}"
        except CorruptCheckpointError as e:
            kind, why = "corrupt", str(e)
        aside = path.with_name(f"{kind}-{path.name}-{int(time.time())}")
        path.rename(aside)
        log.warning("set aside %s as %s (%s): resuming from step %d redoes it", path, aside.name, why, step)
        moved.append(aside)
    return moved


def resolve_checkpoint(path: str | os.PathLike[str]) -> Path:
    """A checkpoint directory as given (verified), or the latest complete one of a run directory."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"resume path does not exist: {path}")
    if not path.is_dir():
        raise NotADirectoryError(f"resume path must be a checkpoint or run directory, got the file {path}")
    if (path / MARKER).is_file() or STEP_DIR.match(path.name):
        verify_checkpoint(path)
        return path
    return latest_checkpoint(path)
