"""Training checkpoints without pickle: one directory per step, written atomically, verified on load.

Layout of ``run_dir/step-000123/``::

    model.safetensors                   model weights (tied weights stored once, see weights.py)
    config.json                         the model/run config (a dataclass goes through config_io.to_dict)
    optimizer.safetensors, .json        optimizer state_dict: its tensors, and the rest as tagged JSON
    trainer.json                        step, scheduler state, data-iterator state, metrics, best value
    rng.safetensors, rng.json           torch/CUDA/numpy/Python generator states
    rank-{r}.safetensors, .json         data-parallel rank r >= 1: its generators and loader position
    <extra files>                       copied in for the caller (tokenizer.json, ...)
    COMPLETE                            written last: format, step, and each file's size and sha256

Everything is written into a hidden temporary sibling, fsynced, then renamed into place, so a
directory named ``step-*`` either holds a ``COMPLETE`` marker or is not a checkpoint (that machinery,
verification and finding checkpoints: :mod:`aiayn.checkpoint.directory`). One process (rank 0)
writes to a run directory. Memory note: each file is serialized in memory before it is written, one
file at a time.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor, nn

from aiayn.checkpoint.directory import (
    CONFIG_FILE,
    FORMAT,
    MARKER,
    MODEL_FILE,
    OPTIMIZER_JSON,
    OPTIMIZER_TENSORS,
    RESERVED,
    RNG_JSON,
    RNG_TENSORS,
    TRAINER_FILE,
    CorruptCheckpointWarning,
    checkpoint_name,
    json_bytes,
    latest_checkpoint,
    list_checkpoints,
    read_json,
    resolve_checkpoint,
    verify_checkpoint,
    write_checkpoint_dir,
)
from aiayn.checkpoint.rng_state import Generator, RngState, capture_rng_state, restore_rng_state
from aiayn.checkpoint.tensor_tree import flatten_tree, unflatten_tree
from aiayn.checkpoint.weights import (
    CorruptCheckpointError,
    check_finite,
    load_state_dict_checked,
    read_safetensors,
    read_weights,
    state_dict_to_bytes,
    tensors_to_bytes,
)
from aiayn.config_io import to_dict

__all__ = [
    "BestValue",
    "TrainerState",
    "Checkpoint",
    "RankState",
    "CorruptCheckpointError",
    "CorruptCheckpointWarning",
    "checkpoint_name",
    "save_checkpoint",
    "state_files",
    "write_checkpoint_dir",
    "verify_checkpoint",
    "list_checkpoints",
    "latest_checkpoint",
    "resolve_checkpoint",
    "load_checkpoint",
    "read_trainer_state",
    "load_model_weights",
    "restore_training_state",
    # the directory format, from directory.py
    "FORMAT", "MARKER", "MODEL_FILE", "CONFIG_FILE", "RESERVED",
]

_RANK_JSON = re.compile(r"rank-(\d+)\.json")


def _rank_files(rank: int) -> tuple[str, str]:
    return f"rank-{rank}.safetensors", f"rank-{rank}.json"


class RankState(NamedTuple):
    """What differs between data-parallel ranks: their generators (dropout masks) and loader position."""

    rng: RngState
    data: dict[str, Any] | None


@dataclasses.dataclass(frozen=True)
class BestValue:
    """The best value of the watched metric so far and the step that reached it."""

    metric: str
    mode: Literal["min", "max"]
    value: float
    step: int


@dataclasses.dataclass(frozen=True)
class TrainerState:
    """Contents of ``trainer.json``: what the loop needs besides weights, optimizer and RNG."""

    step: int
    scheduler: dict[str, Any] | None
    data: dict[str, Any] | None
    metrics: dict[str, float]
    best: BestValue | None
    scaler: dict[str, Any] | None = None  # fp16's GradScaler (scale, growth tracker); None without one
    # the kernels the run computed with, as aiayn.inference.kernel_choice.choices_made gives them: a resume takes them
    # back (pin_choices); None in checkpoints saved before they were recorded
    kernels: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A loaded, verified checkpoint; ``extra_files`` are names of caller files inside ``path``."""

    path: Path
    step: int
    config: dict[str, Any]
    model_state: dict[str, Tensor]
    optimizer_state: dict[str, Any] | None
    trainer: TrainerState | None
    rng: RngState | None
    extra_files: tuple[str, ...]
    ranks: dict[int, RankState] = dataclasses.field(default_factory=dict)  # data-parallel ranks >= 1


# --------------------------------------------------------------------------- saving


def save_checkpoint(
    run_dir: str | os.PathLike[str],
    *,
    step: int,
    model: nn.Module,
    config: Any,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    data_state: Mapping[str, Any] | None = None,
    metrics: Mapping[str, float] | None = None,
    best: BestValue | None = None,
    extra_files: Sequence[str | os.PathLike[str]] = (),
    save_rng: bool = True,
    generators: Mapping[str, Generator] | None = None,
    ranks: Sequence[RankState] = (),
    scaler: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``run_dir/step-NNNNNN`` atomically and return its path.

    ``config`` is a dataclass (stored with its ``to_dict()`` method if it has one, else
    ``config_io.to_dict``) or a JSON-ready mapping; ``data_state`` a JSON-ready dict from the data
    iterator; ``generators`` named generators saved with the global RNG states; ``ranks`` the
    generators and loader positions of data-parallel ranks 1, 2, ... (``rank-{r}.*``); ``scaler`` the
    fp16 ``GradScaler.state_dict()``. Everything is checked
    before anything is written. Raises ``ValueError`` naming the first non-finite weight or a
    non-finite metric, ``TypeError`` naming what cannot be stored, ``FileExistsError`` if the
    checkpoint exists, and ``OSError`` (same errno) naming the checkpoint and file when a write fails,
    after removing the partial files.
    """
    final = Path(run_dir) / checkpoint_name(step)
    model_state = model.state_dict()
    check_finite(model_state)
    files: list[tuple[str, Callable[[], bytes]]] = [(MODEL_FILE, lambda: state_dict_to_bytes(model_state))]
    if optimizer is not None:
        opt_tensors, opt_tree = flatten_tree(optimizer.state_dict())
        files.append((OPTIMIZER_TENSORS, lambda: tensors_to_bytes(opt_tensors)))
        files.append((OPTIMIZER_JSON, _constant(json_bytes({"format": FORMAT, "state": opt_tree}, "optimizer state"))))
    files += state_files(
        step=step, config=config, scheduler=scheduler, data_state=data_state, metrics=metrics, best=best,
        extra_files=extra_files, save_rng=save_rng, generators=generators, ranks=ranks, scaler=scaler,
    )
    return write_checkpoint_dir(final, files, {"step": step})


def state_files(
    *,
    step: int,
    config: Any,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    data_state: Mapping[str, Any] | None,
    metrics: Mapping[str, float] | None,
    best: BestValue | None,
    extra_files: Sequence[str | os.PathLike[str]],
    save_rng: bool,
    generators: Mapping[str, Generator] | None,
    ranks: Sequence[RankState],
    scaler: Mapping[str, Any] | None,
) -> list[tuple[str, Callable[[], bytes]]]:
    """Every file of a checkpoint but the model and optimizer (config, trainer record, generators, ranks,
    extra files) for :func:`write_checkpoint_dir`: a plain save and a sharded one write the same.
    Everything is checked (and the generators captured) now; ``ValueError``/``TypeError`` as in
    :func:`save_checkpoint`."""
    trainer = {
        "format": FORMAT,
        "step": step,
        "scheduler": None if scheduler is None else flatten_tree(scheduler.state_dict(), allow_tensors=False)[1],
        "data": None if data_state is None else dict(data_state),
        "metrics": _check_metrics(metrics or {}),
        "best": None if best is None else dataclasses.asdict(best),
        "scaler": None if scaler is None else dict(scaler),
        "kernels": _kernel_choices(),
    }
    files = [
        (CONFIG_FILE, _constant(json_bytes(_config_dict(config), "config"))),
        (TRAINER_FILE, _constant(json_bytes(trainer, "trainer state (data_state, metrics)"))),
    ]
    if save_rng:
        rng = capture_rng_state(generators)
        files.append((RNG_TENSORS, _constant(tensors_to_bytes(rng.tensors))))
        files.append((RNG_JSON, _constant(json_bytes(rng.meta, "rng state"))))
    for rank, state in enumerate(ranks, start=1):
        tensors_name, json_name = _rank_files(rank)
        files.append((tensors_name, _constant(tensors_to_bytes(state.rng.tensors))))
        files.append((json_name, _constant(json_bytes({"rng": state.rng.meta, "data": state.data}, f"state of rank {rank}"))))
    return files + _extra_files(extra_files)


def _kernel_choices() -> dict[str, Any]:
    """The kernels this process chose (a resume computes with the same: :func:`aiayn.inference.kernel_choice.pin_choices`)."""
    from aiayn.inference.kernel_choice import choices_made  # here: kernel_choice imports this package

    return choices_made()


def _checked_kernels(record: Any) -> dict[str, Any] | None:
    """A trainer record's kernels, checked (``ValueError`` for another form: the file is then corrupt)."""
    from aiayn.inference.kernel_choice import check_choice_record

    return None if record is None else check_choice_record(record, "kernels")


def _constant(data: bytes) -> Callable[[], bytes]:
    return lambda: data


def _config_dict(config: Any) -> dict[str, Any]:
    """A config as JSON-ready dict: its own ``to_dict()`` if it has one (model configs add ``family``)."""
    own = getattr(config, "to_dict", None)
    if callable(own) and not isinstance(config, type):
        data = own()
        if not isinstance(data, Mapping):
            raise TypeError(f"config.to_dict() must return a mapping, got {type(data).__name__}")
        return dict(data)
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return to_dict(config)
    if isinstance(config, Mapping):
        return dict(config)
    raise TypeError(f"config must be a dataclass instance or a mapping, got {type(config).__name__}")


def _check_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"metrics[{name!r}] must be a finite number, got {value!r}")
        out[name] = float(value)
    return out


def _extra_files(paths: Sequence[str | os.PathLike[str]]) -> list[tuple[str, Callable[[], bytes]]]:
    out: list[tuple[str, Callable[[], bytes]]] = []
    seen: set[str] = set()
    for p in paths:
        source = Path(p)
        if source.name in RESERVED or source.name in seen:
            raise ValueError(f"extra file {source} clashes with a checkpoint file named {source.name!r}")
        if not source.is_file():
            raise FileNotFoundError(f"extra file to copy into the checkpoint does not exist: {source}")
        seen.add(source.name)
        out.append((source.name, source.read_bytes))
    return out


# --------------------------------------------------------------------------- loading


def load_checkpoint(path: str | os.PathLike[str], *, verified: bool = False, sharded: bool = False) -> Checkpoint:
    """Verify and read one checkpoint directory; ``CorruptCheckpointError`` names a bad file.

    ``verified``: the caller has just verified it (:func:`latest_checkpoint`, :func:`resolve_checkpoint`),
    so the files are not hashed a second time (sizes and formats are still checked). ``sharded``: a
    ``train.parallel=fsdp`` checkpoint, read but for its DCP shards (``model_state`` is empty, see
    :func:`aiayn.checkpoint.sharded.load_sharded_state`). Raises ``ValueError`` naming the path when it
    is the other kind.
    """
    path = Path(path)
    marker = verify_checkpoint(path, check_hashes=not verified)
    if marker.get("sharded") and not sharded:
        raise ValueError(
            f"{path} is a sharded (DCP) checkpoint written with train.parallel=fsdp: resume it with "
            "train.parallel=fsdp, or write a model directory from it with `aiayn consolidate`"
        )
    if sharded and not marker.get("sharded"):
        raise ValueError(
            f"{path} is a plain checkpoint (model.safetensors), not a sharded one: train.parallel=fsdp resumes only "
            "checkpoints written with train.parallel=fsdp; resume it with train.parallel=ddp, or start from its "
            "weights with train.init_from"
        )
    names = set(marker["files"])
    model_state: dict[str, Tensor] = {} if sharded else read_safetensors(path / MODEL_FILE)[0]
    optimizer_state = None
    if OPTIMIZER_JSON in names:
        opt_tensors, _ = read_safetensors(path / OPTIMIZER_TENSORS)
        optimizer_state = _decode(path / OPTIMIZER_JSON, lambda d: unflatten_tree(opt_tensors, d["state"]))
    trainer = _decode(path / TRAINER_FILE, _trainer_state) if TRAINER_FILE in names else None
    rng = None
    if RNG_JSON in names:
        rng_tensors, _ = read_safetensors(path / RNG_TENSORS)
        rng = RngState(rng_tensors, read_json(path / RNG_JSON))
    ranks: dict[int, RankState] = {}
    for name in names:
        if match := _RANK_JSON.fullmatch(name):
            rank = int(match.group(1))
            rank_tensors, _ = read_safetensors(path / _rank_files(rank)[0])
            meta = read_json(path / name)
            ranks[rank] = RankState(RngState(rank_tensors, meta["rng"]), meta["data"])
    rank_files = {f for r in ranks for f in _rank_files(r)}
    return Checkpoint(
        path=path,
        step=int(marker["step"]),
        config=read_json(path / CONFIG_FILE),
        model_state=model_state,
        optimizer_state=optimizer_state,
        trainer=trainer,
        rng=rng,
        # caller files are plain names: a path with a folder is the DCP shards' (dcp/...)
        extra_files=tuple(sorted(n for n in names - RESERVED - rank_files if "/" not in n)),
        ranks=ranks,
    )


def read_trainer_state(path: str | os.PathLike[str]) -> TrainerState | None:
    """``trainer.json`` of a checkpoint directory without verifying the rest (None if it has none)."""
    file = Path(path) / TRAINER_FILE
    return _decode(file, _trainer_state) if file.is_file() else None


def _decode(file: Path, build: Callable[[Any], Any]) -> Any:
    try:
        return build(read_json(file))
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, CorruptCheckpointError):
            raise
        raise CorruptCheckpointError(file, f"unexpected contents ({e!r})") from e


def _trainer_state(d: dict[str, Any]) -> TrainerState:
    return TrainerState(
        step=int(d["step"]),
        scheduler=None if d["scheduler"] is None else unflatten_tree({}, d["scheduler"]),
        data=d["data"],
        metrics=dict(d["metrics"]),
        best=None if d["best"] is None else BestValue(**d["best"]),
        scaler=d.get("scaler"),  # absent from checkpoints saved before fp16 scaling was recorded
        kernels=_checked_kernels(d.get("kernels")),  # absent from checkpoints saved before the kernels were recorded
    )


def load_model_weights(model: nn.Module, path: str | os.PathLike[str], *, trust_pickle: bool = False) -> Path:
    """Load weights into ``model`` from a checkpoint or run directory, a ``.safetensors`` or (trusted) pickle file.

    Returns the weights file read. Raises ``ValueError`` listing missing/unexpected keys and shape
    mismatches (no partial load), or refusing a pickle without ``trust_pickle``; see ``read_weights``.
    """
    path = Path(path)
    if path.is_dir():
        file = resolve_checkpoint(path) / MODEL_FILE
        state = read_safetensors(file)[0]
    else:
        file = path
        state = read_weights(path, trust_pickle=trust_pickle)
    load_state_dict_checked(model, state, source=str(file))
    return file


def restore_training_state(
    checkpoint: Checkpoint,
    *,
    model: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    rng: bool = True,
    generators: Mapping[str, Generator] | None = None,
) -> None:
    """Put a loaded checkpoint back into the given objects (and the global RNGs when ``rng``).

    Raises ``ValueError`` naming the checkpoint when it lacks a part that was asked for.
    """
    if model is not None:
        load_state_dict_checked(model, checkpoint.model_state, source=str(checkpoint.path / MODEL_FILE))
    if optimizer is not None:
        if checkpoint.optimizer_state is None:
            raise ValueError(f"checkpoint {checkpoint.path} holds no optimizer state")
        optimizer.load_state_dict(checkpoint.optimizer_state)
    if scheduler is not None:
        if checkpoint.trainer is None or checkpoint.trainer.scheduler is None:
            raise ValueError(f"checkpoint {checkpoint.path} holds no scheduler state")
        scheduler.load_state_dict(checkpoint.trainer.scheduler)
    if rng:
        if checkpoint.rng is None:
            raise ValueError(f"checkpoint {checkpoint.path} holds no rng state; pass rng=False to skip it")
        restore_rng_state(checkpoint.rng.tensors, checkpoint.rng.meta, generators)
