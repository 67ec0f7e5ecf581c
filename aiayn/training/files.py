"""``data.dataset=files``: your own files read in the task's format, each error naming its setting.

Translation reads ``[source_file, target_file]`` (aligned lines) or ``[pairs]`` (one TSV, CSV or
JSON-lines table of pairs); ``lm`` reads ``[text]``; ``mlm`` and ``classification`` read ``[table]``.
Without ``data.val_files`` a validation split is held out of the training files: the last 10% of
the text for ``lm`` (nanoGPT's split), else 10% of the examples drawn with a fixed seed, so that
``aiayn evaluate --split val`` finds the same ones.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import numpy as np

from aiayn.data import DataError, LabeledText, ParallelText, read_classification, read_pairs, read_parallel, read_text, split_text
from aiayn.data.errors import naming_setting
from aiayn.training.config import DataSection

__all__ = ["read_task_files", "own_splits", "HOLD_OUT_FRACTION"]

log = logging.getLogger(__name__)
HOLD_OUT_FRACTION = 0.1
_HOLD_OUT_SEED = 0  # fixed, not train.seed: evaluation must find the same held-out examples


def read_task_files(
    data: DataSection, files: Sequence[str], setting: str, *, label_names: Sequence[str] | None = None,
    known_from: str | None = None,
) -> Any:
    """``files`` read in the format of ``data.task``: parallel text, plain text or labelled text.

    ``label_names`` (with ``known_from``, where they come from): the training labels a validation or
    test file must use. Raises ``DataError`` that starts with ``setting`` (``data.train_files``).
    """
    files = list(files)
    with naming_setting(setting):
        if data.task == "translation":
            if len(files) == 2:
                return read_parallel(files[0], files[1])
            if len(files) == 1:
                return read_pairs(files[0], source_column=_column(data.source_column), target_column=_column(data.target_column),
                                  header=_header(data))
            raise DataError(f"expected [source_file, target_file] or [pairs_file] (TSV, CSV or JSON lines) for translation, got {files}")
        if len(files) != 1:
            kind = "[text_file]" if data.task == "lm" else "[table_file] (TSV, CSV or JSON lines)"
            raise DataError(f"expected {kind} for data.task={data.task}, got {files}")
        if data.task == "lm":
            return read_text(files[0])
        return read_classification(files[0], label_names=label_names, known_from=known_from, text_column=_column(data.text_column),
                                   label_column=_column(data.label_column), header=_header(data))


def own_splits(data: DataSection) -> tuple[Any, Any]:
    """The (train, validation) data of ``data.train_files`` / ``data.val_files``, holding 10% out of
    the training files when there are no validation files."""
    train = read_task_files(data, data.train_files, "data.train_files")
    if isinstance(train, LabeledText) and data.task == "classification":
        _check_classes(train, data)
    if data.val_files:
        return train, read_split_files(data, data.val_files, "data.val_files", train)
    return _hold_out(train, data)


def read_split_files(data: DataSection, files: Sequence[str], setting: str, train: Any) -> Any:
    """Validation or test files, whose labels must be the training file's."""
    if not isinstance(train, LabeledText):
        return read_task_files(data, files, setting)
    return read_task_files(data, files, setting, label_names=train.label_names,
                           known_from=f"data.train_files ({data.train_files[0]})")


def _hold_out(train: Any, data: DataSection) -> tuple[Any, Any]:
    if isinstance(train, str):
        return split_text(train, 1.0 - HOLD_OUT_FRACTION)
    n = len(train)
    if n < 2:
        raise DataError(f"data.train_files: {data.train_files} holds {n} example(s), too few to hold any out for validation: "
                        "give data.val_files or more examples")
    k = max(1, round(n * HOLD_OUT_FRACTION))
    order = np.random.default_rng(_HOLD_OUT_SEED).permutation(n)
    keep, held = sorted(order[k:].tolist()), sorted(order[:k].tolist())
    log.info("data.val_files not given: %d of the %d examples of data.train_files are held out for validation", k, n)
    return _subset(train, keep), _subset(train, held)


def _subset(raw: Any, indices: list[int]) -> Any:
    if isinstance(raw, ParallelText):
        return ParallelText([raw.src[i] for i in indices], [raw.tgt[i] for i in indices])
    return LabeledText([raw.texts[i] for i in indices], [raw.labels[i] for i in indices], raw.label_names)


def _check_classes(train: LabeledText, data: DataSection) -> None:
    if len(train.label_names) < 2:
        column = f"data.label_column={data.label_column!r}" if data.label_column is not None else "data.label_column (the default: 'label', or column 0)"
        raise DataError(
            f"data.train_files: {data.train_files[0]}: the label column holds one class only ({train.label_names}): "
            f"a classifier needs at least 2; check that {column} picks the labels, or add examples of the other classes"
        )


def _column(value: str | int | None) -> str | None:
    return None if value is None else str(value)


def _header(data: DataSection) -> bool | None:
    return None if data.header == "auto" else bool(data.header)
