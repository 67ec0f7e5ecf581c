"""Checkpoint averaging (section 6.1: the base models average the last 5 checkpoints, the big ones 20).

Floating tensors are summed in float64 and cast back to their dtype; integer and boolean buffers
(step counters, masks) are taken from the last checkpoint. Tied weights stay tied in the result.
``average_last`` also copies the newest checkpoint's extra files (tokenizers, the training config),
so its output loads with ``aiayn.pretrained.load_pretrained`` like a checkpoint does.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from aiayn.checkpoint.directory import read_json
from aiayn.checkpoint.state import (
    CONFIG_FILE,
    MODEL_FILE,
    RESERVED,
    CorruptCheckpointError,
    CorruptCheckpointWarning,
    list_checkpoints,
    verify_checkpoint,
    write_checkpoint_dir,
)
from aiayn.checkpoint.weights import check_finite, read_safetensors, read_weights, state_dict_to_bytes
from aiayn.models.config import with_defaults
from aiayn.tokenization.bpe import BPE_FILE
from aiayn.tokenization.char import CHAR_FILE

__all__ = ["average_checkpoints", "average_last"]

# Tokenizer files a checkpoint may carry (shared, or a source/target pair): they must agree across
# the averaged checkpoints, since the weights are only meaningful with the vocabulary they were trained on.
_TOKENIZER_FILES = frozenset(f"{prefix}{name}" for prefix in ("", "src_", "tgt_") for name in (BPE_FILE, CHAR_FILE))


def average_checkpoints(paths: Sequence[str | os.PathLike[str]], *, verified: bool = False) -> dict[str, Tensor]:
    """Average the model weights of checkpoint directories or ``.safetensors`` files, in order.

    Checkpoint directories are verified against their marker, without re-hashing when ``verified``
    (the caller has just checked them, as :func:`average_last` does). Raises ``ValueError`` for an empty list and, naming the file, when names, shapes or dtypes differ
    from the first one.
    """
    if not paths:
        raise ValueError("average_checkpoints needs at least one path, got none")
    sums: dict[str, Tensor] = {}  # by canonical name: tied weights are summed once
    first: dict[str, Tensor] = {}
    first_source = ""
    last: dict[str, Tensor] = {}
    for p in paths:
        source, state = _read_model(Path(p), verified)
        if not first:
            first, first_source = state, source
        else:
            _check_same_layout(first, first_source, state, source)
        for name, canonical in _canonical_names(state).items():
            t = state[name]
            if name == canonical and t.is_floating_point():
                if name not in sums:
                    sums[name] = torch.zeros(t.shape, dtype=torch.float64)
                sums[name].add_(t.double())
        last = state
    averaged = {name: (total / len(paths)).to(last[name].dtype) for name, total in sums.items()}
    return {
        name: averaged[canonical] if t.is_floating_point() else t
        for (name, canonical), t in zip(_canonical_names(last).items(), last.values())
    }


def _canonical_names(state: dict[str, Tensor]) -> dict[str, str]:
    """Each name -> the first name bound to the same tensor object (itself unless tied)."""
    first_name: dict[int, str] = {}
    return {name: first_name.setdefault(id(t), name) for name, t in state.items()}


def _read_model(path: Path, verified: bool) -> tuple[str, dict[str, Tensor]]:
    if path.is_dir():
        if verify_checkpoint(path, check_hashes=not verified).get("sharded"):  # train.parallel=fsdp: DCP shards, read whole
            from aiayn.checkpoint.sharded import read_sharded_weights

            return str(path), read_sharded_weights(path)
        file = path / MODEL_FILE
        return str(file), read_safetensors(file)[0]
    return str(path), read_weights(path)


def _check_same_layout(ref: dict[str, Tensor], ref_source: str, state: dict[str, Tensor], source: str) -> None:
    missing = [k for k in ref if k not in state]
    unexpected = [k for k in state if k not in ref]
    differ = [
        f"{k}: {tuple(state[k].shape)} {state[k].dtype} vs {tuple(ref[k].shape)} {ref[k].dtype}"
        for k in ref
        if k in state and (state[k].shape != ref[k].shape or state[k].dtype != ref[k].dtype)
    ]
    if not missing and not unexpected and _canonical_names(state) != _canonical_names(ref):
        differ.append("tied weights differ")
    if missing or unexpected or differ:
        raise ValueError(
            f"cannot average {source} with {ref_source}: missing {missing}, unexpected {unexpected}, "
            f"shape/dtype differences {differ}"
        )


def average_last(run_dir: str | os.PathLike[str], n: int, out_dir: str | os.PathLike[str]) -> Path:
    """Average the last ``n`` complete checkpoints of ``run_dir`` into a new checkpoint at ``out_dir``.

    The result holds the averaged weights, the config (which must be the same in all ``n``) and the
    newest checkpoint's extra files (tokenizers, which must be the same in all ``n``; the training
    config), and is written atomically; corrupt checkpoints are skipped with a warning. Raises
    ``ValueError`` when fewer than ``n`` checkpoints verify or the configs or tokenizers differ,
    ``FileExistsError`` if ``out_dir`` exists.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory does not exist: {run_dir}")
    chosen: list[Path] = []
    markers = []
    for path in reversed(list_checkpoints(run_dir)):
        try:
            markers.append(verify_checkpoint(path))
        except CorruptCheckpointError as e:
            warnings.warn(f"not averaging {path.name}: {e}", CorruptCheckpointWarning, stacklevel=2)
            continue
        chosen.append(path)
        if len(chosen) == n:
            break
    if len(chosen) < n:
        names = [p.name for p in chosen]
        hint = f"; to average those, pass n={len(chosen)} (--last {len(chosen)})" if len(chosen) > 1 else ""
        raise ValueError(f"average_last needs {n} complete checkpoints in {run_dir}, found {len(chosen)}: {names}{hint}")
    chosen.reverse()
    configs = [with_defaults(read_json(p / CONFIG_FILE)) for p in chosen]  # the bounded reader of checkpoints
    for path, config in zip(chosen, configs):
        if config != configs[-1]:
            raise ValueError(
                f"cannot average checkpoints with different configs: {path / CONFIG_FILE} vs {chosen[-1] / CONFIG_FILE}"
            )
    extras = _extra_files(chosen, markers[::-1])
    state = average_checkpoints(chosen, verified=True)  # hashed once, above
    check_finite(state)
    config_bytes = (chosen[-1] / CONFIG_FILE).read_bytes()
    files = [(MODEL_FILE, lambda: state_dict_to_bytes(state)), (CONFIG_FILE, lambda: config_bytes)]
    files.extend((name, (chosen[-1] / name).read_bytes) for name in extras)
    marker = {"step": int(markers[0]["step"]), "averaged_from": [p.name for p in chosen]}
    return write_checkpoint_dir(Path(out_dir), files, marker)


def _extra_files(chosen: list[Path], markers: list[dict]) -> list[str]:
    """Names of the newest checkpoint's extra files, after checking that tokenizers agree (by sha256)."""
    newest = markers[-1]["files"]
    for path, marker in zip(chosen[:-1], markers[:-1]):
        files = marker["files"]
        for name in sorted(_TOKENIZER_FILES & (set(files) | set(newest))):
            if files.get(name, {}).get("sha256") != newest.get(name, {}).get("sha256"):
                raise ValueError(
                    f"cannot average checkpoints with different tokenizers: {path / name} vs {chosen[-1] / name}"
                )
    return sorted(name for name in newest if name not in RESERVED)
