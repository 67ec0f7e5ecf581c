"""Sharded training checkpoints (``train.parallel: fsdp``): model and optimizer as DCP shards, the rest as today.

Layout of ``run_dir/step-000123/``::

    dcp/.metadata, dcp/__R_0.distcp     torch.distributed.checkpoint: every rank writes its own shards
    config.json, trainer.json, rng.*, rank-{r}.*, <extra files>     as in a plain checkpoint (state.py)
    COMPLETE                            as in a plain checkpoint, with ``"sharded": "dcp"``

The files beside the shards, the marker and the rename are a plain checkpoint's, written by the same
code (``state.state_files``, ``directory.write_checkpoint_dir``).

DCP stores each tensor with its global shape and the piece each rank held, so a checkpoint written
by N ranks loads into M ranks (resharding), or into one process without any process group
(``read_sharded_model_state``; ``consolidate`` turns it into the ordinary model directory). The rest
is read by ``state.load_checkpoint(path, sharded=True)``. The
directory appears whole or not at all: every rank writes into a hidden temporary sibling, rank 0
adds the other files and the marker, then renames it into place.
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from aiayn.checkpoint import atomic_io
from aiayn.checkpoint.directory import CONFIG_FILE, MARKER, checkpoint_name, read_json, write_checkpoint_dir
from aiayn.checkpoint.state import BestValue, RankState, state_files

__all__ = [
    "SHARDED_DIR",
    "is_sharded",
    "save_sharded_checkpoint",
    "load_sharded_state",
    "read_sharded_model_state",
    "read_sharded_weights",
    "consolidate",
]

SHARDED_DIR = "dcp"  # the DCP files, inside the checkpoint directory
SHARDED_KIND = "dcp"  # the marker's "sharded" field


def _dcp() -> Any:
    """``torch.distributed.checkpoint``, imported when a sharded checkpoint is read or written: its import
    takes seconds, and every model load asks :func:`is_sharded` first."""
    import torch.distributed.checkpoint as dcp

    return dcp


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
    scaler: Mapping[str, Any] | None = None,
) -> Path | None:
    """Write ``run_dir/step-NNNNNN`` from every rank (a collective); return its path on rank 0, else None.

    ``ranks``: the generators and loader positions of ranks 1, 2, ... (rank 0 passes them); ``scaler``:
    fp16's ``GradScaler.state_dict()``. The other files are a plain checkpoint's (:func:`state_files`).
    """
    from torch.distributed.checkpoint.state_dict import get_state_dict

    final = Path(run_dir) / checkpoint_name(step)
    is_main = dist.get_rank() == 0
    if is_main and final.exists():
        raise FileExistsError(f"checkpoint directory already exists: {final}")
    files = state_files(  # checked before any shard is written
        step=step, config=config, scheduler=scheduler, data_state=data_state, metrics=metrics, best=best,
        extra_files=extra_files, save_rng=True, generators=None, ranks=ranks, scaler=scaler,
    ) if is_main else []
    names: list[Any] = [atomic_io.temporary_sibling(final) if is_main else None]
    dist.broadcast_object_list(names, src=0)
    tmp: Path = names[0]
    model_state, optim_state = get_state_dict(model, optimizer)
    try:
        _dcp().save({"model": model_state, "optim": optim_state}, checkpoint_id=tmp / SHARDED_DIR)
        if is_main:  # the other files and the marker, then the rename
            write_checkpoint_dir(final, files, {"step": step, "sharded": SHARDED_KIND}, tmp=tmp)
    except BaseException:
        if is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    dist.barrier()
    return final if is_main else None


def load_sharded_state(path: str | os.PathLike[str], model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load the shards of checkpoint ``path`` into a sharded ``model`` and its ``optimizer`` (a collective).

    DCP reshards: the checkpoint may come from any number of ranks.
    """
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_state, "optim": optim_state}
    _dcp().load(state, checkpoint_id=Path(path) / SHARDED_DIR)  # tensors in place; other values replaced in ``state``
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def read_sharded_model_state(path: str | os.PathLike[str], model: nn.Module) -> dict[str, Tensor]:
    """Load the whole model of sharded checkpoint ``path`` into ``model`` (one process, no process group)
    and return its state dict (tied weights stay one tensor)."""
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        _dcp().load(state, checkpoint_id=Path(path) / SHARDED_DIR, no_dist=True)  # in place, into the model's tensors
    return model.state_dict()


def read_sharded_weights(path: str | os.PathLike[str]) -> dict[str, Tensor]:
    """The whole model state of sharded checkpoint ``path``, in a model built from its ``config.json``."""
    from aiayn.models.config import config_from_dict
    from aiayn.models.presets import model_class

    config = config_from_dict(read_json(Path(path) / CONFIG_FILE))
    return read_sharded_model_state(path, model_class(config)(config))


def consolidate(checkpoint: str | os.PathLike[str], out: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
    """Write sharded ``checkpoint`` as the ordinary model directory ``out`` (model.safetensors, config, tokenizers)."""
    from aiayn.pretrained import load_pretrained, own_files, save_pretrained

    if not is_sharded(checkpoint):
        raise ValueError(f"{checkpoint} is not a sharded (DCP) checkpoint: it is loadable as it is")
    loaded = load_pretrained(checkpoint, pack=False)  # saved, never run
    return save_pretrained(out, loaded.model, loaded.src_tokenizer, loaded.tgt_tokenizer, overwrite=overwrite,
                           extra_files=own_files(loaded.path))

