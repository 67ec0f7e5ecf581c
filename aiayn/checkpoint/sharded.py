"""Sharded training checkpoints (``train.parallel: fsdp``): model and optimizer as DCP shards, the rest as today.

Layout of ``run_dir/step-000123/``::

    dcp/.metadata, dcp/__R_0.distcp     torch.distributed.checkpoint: every rank writes its own shards
    config.json, trainer.json, rng.*, rank-{r}.*, <extra files>     as in a plain checkpoint (state.py)
    COMPLETE                            as in a plain checkpoint, with ``"sharded": "dcp"``

DCP stores each tensor with its global shape and the piece each rank held, so a checkpoint written
by N ranks loads into M ranks (resharding), or into one process without any process group
(``read_sharded_model_state``; ``consolidate`` turns it into the ordinary model directory). The
directory appears whole or not at all: every rank writes into a hidden temporary sibling, rank 0
adds the other files and the marker, then renames it into place.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import Tensor, nn

from aiayn.checkpoint import atomic_io
from aiayn.checkpoint.directory import (
    CONFIG_FILE,
    FORMAT,
    MARKER,
    RNG_JSON,
    RNG_TENSORS,
    TRAINER_FILE,
    checkpoint_name,
    json_bytes,
    read_json,
    verify_checkpoint,
)
from aiayn.checkpoint.rng_state import RngState, capture_rng_state
from aiayn.checkpoint.state import BestValue, Checkpoint, RankState, _check_metrics, _config_dict, _rank_files, _trainer_state
from aiayn.checkpoint.tensor_tree import flatten_tree
from aiayn.checkpoint.weights import read_safetensors, tensors_to_bytes

__all__ = [
    "SHARDED_DIR",
    "is_sharded",
    "save_sharded_checkpoint",
    "read_sharded_checkpoint",
    "load_sharded_state",
    "read_sharded_model_state",
    "read_sharded_weights",
    "consolidate",
]

SHARDED_DIR = "dcp"  # the DCP files, inside the checkpoint directory
SHARDED_KIND = "dcp"  # the marker's "sharded" field


def is_sharded(path: str | os.PathLike[str]) -> bool:
    """Whether the checkpoint directory ``path`` holds DCP shards (its marker says so)."""
    marker = Path(path) / MARKER
    return marker.is_file() and read_json(marker).get("sharded") == SHARDED_KIND


def save_sharded_checkpoint(
    run_dir: str | os.PathLike[str],
    *,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    config: Any,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    data_state: Mapping[str, Any],
    metrics: Mapping[str, float],
    best: BestValue | None,
    extra_files: Sequence[str | os.PathLike[str]],
    ranks: Sequence[RankState],
) -> Path | None:
    """Write ``run_dir/step-NNNNNN`` from every rank (a collective); return its path on rank 0, else None.

    ``ranks``: the generators and loader positions of ranks 1, 2, ... (rank 0 passes them).
    """
    from torch.distributed.checkpoint.state_dict import get_state_dict

    final = Path(run_dir) / checkpoint_name(step)
    is_main = dist.get_rank() == 0
    if is_main and final.exists():
        raise FileExistsError(f"checkpoint directory already exists: {final}")
    names: list[Any] = [atomic_io.temporary_sibling(final) if is_main else None]
    dist.broadcast_object_list(names, src=0)
    tmp: Path = names[0]
    model_state, optim_state = get_state_dict(model, optimizer)
    try:
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=tmp / SHARDED_DIR)
        if not is_main:
            dist.barrier()  # rank 0 finishes the directory
            return None
        trainer = {
            "format": FORMAT, "step": step,
            "scheduler": flatten_tree(scheduler.state_dict(), allow_tensors=False)[1],
            "data": dict(data_state), "metrics": _check_metrics(metrics),
            "best": None if best is None else dataclasses.asdict(best),
        }
        rng = capture_rng_state()
        files: list[tuple[str, bytes]] = [
            (CONFIG_FILE, json_bytes(_config_dict(config), "config")),
            (TRAINER_FILE, json_bytes(trainer, "trainer state")),
            (RNG_TENSORS, tensors_to_bytes(rng.tensors)),
            (RNG_JSON, json_bytes(rng.meta, "rng state")),
        ]
        for rank, state in enumerate(ranks, start=1):
            tensors_name, json_name = _rank_files(rank)
            files.append((tensors_name, tensors_to_bytes(state.rng.tensors)))
            files.append((json_name, json_bytes({"rng": state.rng.meta, "data": state.data}, f"state of rank {rank}")))
        files.extend((Path(p).name, Path(p).read_bytes()) for p in extra_files)
        for name, data in files:
            atomic_io.write_durable(tmp / name, data)
        entries = {
            str(f.relative_to(tmp)): {"size": f.stat().st_size, "sha256": _sha256(f)}
            for f in sorted(tmp.rglob("*")) if f.is_file()
        }
        marker = {"format": FORMAT, "step": step, "sharded": SHARDED_KIND, "files": entries}
        atomic_io.write_durable(tmp / MARKER, json_bytes(marker, "checkpoint marker"))
        atomic_io.fsync_dir(tmp / SHARDED_DIR)
        atomic_io.fsync_dir(tmp)
        os.rename(tmp, final)
        atomic_io.fsync_dir(final.parent)
    except BaseException:
        if is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    dist.barrier()
    return final


def read_sharded_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Verify a sharded checkpoint and read all but the shards (``model_state`` is empty: see ``load_sharded_state``).

    Raises ``ValueError`` naming the path when it is a plain checkpoint.
    """
    path = Path(path)
    marker = verify_checkpoint(path)
    if marker.get("sharded") != SHARDED_KIND:
        raise ValueError(
            f"{path} is a plain checkpoint (model.safetensors), not a sharded one: train.parallel=fsdp resumes only "
            "checkpoints written with train.parallel=fsdp; resume it with train.parallel=ddp, or start from its "
            "weights with train.init_from"
        )
    names = set(marker["files"])
    ranks: dict[int, RankState] = {}
    for rank in range(1, len(names)):
        tensors_name, json_name = _rank_files(rank)
        if json_name not in names:
            break
        meta = read_json(path / json_name)
        ranks[rank] = RankState(RngState(read_safetensors(path / tensors_name)[0], meta["rng"]), meta["data"])
    reserved = {CONFIG_FILE, TRAINER_FILE, RNG_TENSORS, RNG_JSON, MARKER} | {f for r in ranks for f in _rank_files(r)}
    return Checkpoint(
        path=path,
        step=int(marker["step"]),
        config=read_json(path / CONFIG_FILE),
        model_state={},
        optimizer_state=None,
        trainer=_trainer_state(read_json(path / TRAINER_FILE)),
        rng=RngState(read_safetensors(path / RNG_TENSORS)[0], read_json(path / RNG_JSON)),
        extra_files=tuple(sorted(n for n in names - reserved if not n.startswith(SHARDED_DIR + "/"))),
        ranks=ranks,
    )


def load_sharded_state(path: str | os.PathLike[str], model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load the shards of checkpoint ``path`` into a sharded ``model`` and its ``optimizer`` (a collective).

    DCP reshards: the checkpoint may come from any number of ranks.
    """
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=Path(path) / SHARDED_DIR)  # tensors in place; other values replaced in ``state``
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def read_sharded_model_state(path: str | os.PathLike[str], model: nn.Module) -> dict[str, Tensor]:
    """Load the whole model of sharded checkpoint ``path`` into ``model`` (one process, no process group)
    and return its state dict (tied weights stay one tensor)."""
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=Path(path) / SHARDED_DIR, no_dist=True)  # in place, into the model's tensors
    return model.state_dict()


def read_sharded_weights(path: str | os.PathLike[str]) -> dict[str, Tensor]:
    """The whole model state of sharded checkpoint ``path``, in a model built from its ``config.json``."""
    from aiayn.models.config import config_from_dict
    from aiayn.models.presets import model_class

    config = config_from_dict(read_json(Path(path) / CONFIG_FILE))
    return read_sharded_model_state(path, model_class(config)(config))


def consolidate(checkpoint: str | os.PathLike[str], out: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
    """Write sharded ``checkpoint`` as the ordinary model directory ``out`` (model.safetensors, config, tokenizers)."""
    from aiayn.pretrained import load_pretrained, save_pretrained

    if not is_sharded(checkpoint):
        raise ValueError(f"{checkpoint} is not a sharded (DCP) checkpoint: it is loadable as it is")
    loaded = load_pretrained(checkpoint, pack=False)  # saved, never run
    return save_pretrained(out, loaded.model, loaded.src_tokenizer, loaded.tgt_tokenizer, overwrite=overwrite)


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
