"""Which checkpoints to keep: the last ``keep_last`` and the best by a metric; never the newest nor the best.

The best checkpoint is found from the metrics recorded in each checkpoint's ``trainer.json``, so
rotation holds no state of its own and survives restarts.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from aiayn.checkpoint import atomic_io
from aiayn.checkpoint.state import (
    BestValue,
    CorruptCheckpointError,
    CorruptCheckpointWarning,
    list_checkpoints,
    read_trainer_state,
    verify_checkpoint,
)

__all__ = ["RetentionConfig", "is_better", "update_best", "best_checkpoint", "rotate_checkpoints"]

_MODES = ("min", "max")
log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RetentionConfig:
    """Keep the last ``keep_last`` checkpoints and the best by ``metric`` (``mode``: lower or higher is better;
    ``metric=None``: no best). The defaults are the training loop's, so a partial ``retention:`` block in
    YAML and the same keys given with ``--set`` mean the same."""

    keep_last: int = 3
    metric: str | None = "val_loss"
    mode: Literal["min", "max"] = "min"

    def __post_init__(self) -> None:
        if isinstance(self.keep_last, bool) or not isinstance(self.keep_last, int) or self.keep_last < 1:
            raise ValueError(f"keep_last must be an int >= 1, got {self.keep_last!r}")
        if self.mode not in _MODES:
            raise ValueError(f"mode must be one of {', '.join(_MODES)}, got {self.mode!r}")
        if self.metric is not None and not self.metric:
            raise ValueError("metric must be a metric name or None, got ''")


def is_better(value: float, than: float, mode: Literal["min", "max"]) -> bool:
    """Whether ``value`` strictly improves on ``than`` (ties keep the earlier checkpoint)."""
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {', '.join(_MODES)}, got {mode!r}")
    return value < than if mode == "min" else value > than


def update_best(
    best: BestValue | None, metrics: Mapping[str, float], *, step: int, retention: RetentionConfig
) -> BestValue | None:
    """``best`` after a checkpoint at ``step`` with ``metrics`` (unchanged when the metric is absent)."""
    if retention.metric is None or retention.metric not in metrics:
        return best
    value = float(metrics[retention.metric])
    if best is None or is_better(value, best.value, retention.mode):
        return BestValue(metric=retention.metric, mode=retention.mode, value=value, step=step)
    return best


def best_checkpoint(run_dir: str | os.PathLike[str], *, metric: str, mode: Literal["min", "max"]) -> Path | None:
    """The complete checkpoint with the best recorded ``metric`` (None if none records it).

    Checkpoints whose ``trainer.json`` cannot be read are skipped with a warning.
    """
    found: tuple[float, Path] | None = None
    for path in list_checkpoints(run_dir):
        try:
            trainer = read_trainer_state(path)
        except CorruptCheckpointError as e:
            message = f"ignoring {path.name} when looking for the best checkpoint: {e}"
            warnings.warn(message, CorruptCheckpointWarning, stacklevel=2)
            continue
        if trainer is None or metric not in trainer.metrics:
            continue
        value = trainer.metrics[metric]
        if found is None or is_better(value, found[0], mode):
            found = (value, path)
    return None if found is None else found[1]


def rotate_checkpoints(run_dir: str | os.PathLike[str], retention: RetentionConfig) -> list[Path]:
    """Delete checkpoints outside the last ``keep_last`` and the best; return the deleted paths.

    Nothing is deleted when the newest checkpoint fails a (size-only) verification, so a bad save never
    costs the good ones. Leftover temporary directories of interrupted saves are removed too.
    """
    run_dir = Path(run_dir)
    checkpoints = list_checkpoints(run_dir)
    if not checkpoints:
        return []
    try:
        verify_checkpoint(checkpoints[-1], check_hashes=False)
    except CorruptCheckpointError as e:
        message = f"not rotating checkpoints in {run_dir}: newest is corrupt: {e}"
        warnings.warn(message, CorruptCheckpointWarning, stacklevel=2)
        return []
    keep = set(checkpoints[-retention.keep_last :])
    if retention.metric is not None:
        best = best_checkpoint(run_dir, metric=retention.metric, mode=retention.mode)
        if best is not None:
            keep.add(best)
    removed = [path for path in checkpoints if path not in keep]
    for path in removed:
        _remove(path)
    for leftover in run_dir.glob(".tmp-step-*"):
        log.warning("removing %s: the leftover of an interrupted save", leftover)
        shutil.rmtree(leftover, ignore_errors=True)
    atomic_io.fsync_dir(run_dir)
    return removed


def _remove(path: Path) -> None:
    """Rename out of the ``step-*`` namespace first, so a crash mid-delete never leaves a half checkpoint."""
    doomed = atomic_io.temporary_sibling(path)
    os.rename(path, doomed)
    shutil.rmtree(doomed)
