"""Model weights on disk: safetensors with tied weights kept tied, strict loading, pickle refused by default.

A ``state_dict`` of a model with tied weights (shared embedding and output projection, section 3.4)
holds one tensor under two names; safetensors refuses shared memory, so the file keeps one copy and
records the other names in its metadata (``aiayn.aliases``), and reading gives both names back, bound
to one tensor. Pickle files (``.pt``, ``.bin``, ...) can run code when loaded: they are read only when
the caller passes ``trust_pickle=True``, and then with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import logging
import pickle
from collections.abc import Mapping
from pathlib import Path

import safetensors.torch
import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor, nn

from aiayn.checkpoint.errors import CorruptCheckpointError

__all__ = [
    "CorruptCheckpointError",
    "PICKLE_SUFFIXES",
    "check_finite",
    "state_dict_to_bytes",
    "tensors_to_bytes",
    "read_safetensors",
    "read_weights",
    "load_state_dict_checked",
    "check_state_fits",
]

log = logging.getLogger(__name__)
ALIASES_KEY = "aiayn.aliases"
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl")
_MAX_LISTED = 50  # keys listed per kind of mismatch before "... and N more"


def check_finite(tensors: Mapping[str, Tensor], *, what: str = "weight") -> None:
    """``ValueError`` naming the first floating tensor that holds a NaN or an infinity."""
    for name, t in tensors.items():
        if t.is_floating_point() or t.is_complex():
            bad = ~torch.isfinite(t)
            if bool(bad.any()):
                raise ValueError(
                    f"{what} {name!r} has {int(bad.sum())} non-finite values (of {t.numel()}, "
                    f"shape {tuple(t.shape)}); refusing to save a checkpoint with non-finite weights"
                )


def tensors_to_bytes(tensors: Mapping[str, Tensor], metadata: dict[str, str] | None = None) -> bytes:
    """Serialize independent tensors to safetensors bytes (detached, contiguous, on the CPU)."""
    ready = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    return safetensors.torch.save(ready, metadata=metadata)


def state_dict_to_bytes(state: Mapping[str, Tensor]) -> bytes:
    """Serialize a model ``state_dict`` to safetensors bytes, storing tied tensors once."""
    tensors, aliases = _dedupe(state)
    metadata = {ALIASES_KEY: json.dumps(aliases, sort_keys=True)} if aliases else None
    return tensors_to_bytes(tensors, metadata)


def _dedupe(state: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Keep one name per identical view (the others become aliases); copy views that only overlap."""
    first: dict[tuple[object, ...], str] = {}
    tensors: dict[str, Tensor] = {}
    aliases: dict[str, str] = {}
    for name, t in state.items():
        if t.numel() == 0:  # every empty tensor has data_ptr 0: never alias them
            tensors[name] = t
            continue
        view = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if view in first:
            aliases[name] = first[view]
        else:
            first[view] = name
            tensors[name] = t
    storages: dict[tuple[object, int], int] = {}
    for t in tensors.values():
        if t.numel():
            key = (t.device, t.untyped_storage().data_ptr())
            storages[key] = storages.get(key, 0) + 1
    for name, t in tensors.items():
        if t.numel() and storages[(t.device, t.untyped_storage().data_ptr())] > 1:
            tensors[name] = t.clone()  # partly overlapping views: safetensors needs separate memory
    return tensors, aliases


def read_safetensors(path: Path | str) -> tuple[dict[str, Tensor], dict[str, str]]:
    """(tensors with aliases expanded, metadata) of a safetensors file on the CPU.

    Raises ``FileNotFoundError`` for a missing file and ``CorruptCheckpointError`` naming the file when
    it cannot be parsed (truncated, not safetensors, a header over the size or entry limits, a bad
    tensor record, bad alias table).
    """
    from aiayn.checkpoint.safetensors_header import read_header  # it imports this package's errors

    path = Path(path)
    read_header(path)  # bounded and checked before the library parses it; names the file and tensor
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = dict(f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 -- safe_open has no __iter__
    except SafetensorError as e:
        raise CorruptCheckpointError(path, f"cannot read it as safetensors ({e})") from e
    if ALIASES_KEY in metadata:
        try:
            aliases = json.loads(metadata[ALIASES_KEY])
            for alias, canonical in aliases.items():
                tensors[alias] = tensors[canonical]
        except (ValueError, KeyError, AttributeError) as e:
            raise CorruptCheckpointError(path, f"bad {ALIASES_KEY} metadata ({e!r})") from e
    return tensors, metadata


def read_weights(path: Path | str, *, trust_pickle: bool = False) -> dict[str, Tensor]:
    """A state dict from a ``.safetensors`` file, or from a pickle file only with ``trust_pickle=True``.

    Raises ``ValueError`` for a pickle file without ``trust_pickle`` and for an unknown suffix,
    ``TypeError`` when a pickle holds something other than a mapping of names to tensors.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        return read_safetensors(path)[0]
    if suffix not in PICKLE_SUFFIXES:
        raise ValueError(
            f"cannot read weights from {path}: expected a .safetensors file, a checkpoint directory or a "
            f"pickle file ({', '.join(PICKLE_SUFFIXES)}), got suffix {suffix!r}"
        )
    if not trust_pickle:
        raise ValueError(
            f"refusing to load {path}: {suffix} files are pickles, which can run arbitrary code when loaded; "
            "convert it to safetensors, or pass trust_pickle=True if you trust where it came from"
        )
    if not path.is_file():
        raise FileNotFoundError(f"no such weights file: {path}")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise ValueError(f"cannot load {path} with torch.load(weights_only=True): {e}") from e
    if not isinstance(obj, Mapping) or not all(isinstance(k, str) and isinstance(v, Tensor) for k, v in obj.items()):
        what = f"a mapping with keys {list(obj)[:10]}" if isinstance(obj, Mapping) else type(obj).__name__
        raise TypeError(f"{path}: expected a state dict (a mapping of names to tensors), got {what}")
    return dict(obj)


def load_state_dict_checked(model: nn.Module, state: Mapping[str, Tensor], *, source: str) -> None:
    """Load ``state`` into ``model`` only if names and shapes match exactly; never a partial load.

    Raises ``ValueError`` listing the missing keys, the unexpected keys, the shape mismatches and the
    dtype mismatches, with ``source`` (the file) in the message. dtype policy: floating point is cast
    to the model's floating dtype (logged as a warning); anything else (integer or bool into float,
    float into integer, one integer width into another) is refused.
    """
    expected = model.state_dict()
    check_state_fits(expected, state, source=source)
    _log_casts(expected, state, source)
    model.load_state_dict(dict(state), strict=True)


def check_state_fits(expected: Mapping[str, Tensor], state: Mapping[str, Tensor], *, source: str) -> None:
    """The checks of ``load_state_dict_checked`` without loading: works on ``meta`` tensors too, so a
    config can be compared with a file's header before any memory is allocated."""
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    shapes = [
        f"{k}: file {tuple(state[k].shape)}, model {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    ]
    dtypes = [
        f"{k}: file {state[k].dtype}, model {v.dtype}"
        for k, v in expected.items()
        if k in state and state[k].dtype != v.dtype and not (state[k].is_floating_point() and v.is_floating_point())
    ]
    if missing or unexpected or shapes or dtypes:
        lines = [f"weights in {source} do not match the model (was its config changed?):"]
        for label, items in (
            ("missing from the file", missing),
            ("unexpected in the file", unexpected),
            ("shape mismatches", shapes),
            ("dtype mismatches (only floating point is cast to floating point)", dtypes),
        ):
            if items:
                listed = ", ".join(items[:_MAX_LISTED])
                more = f", ... and {len(items) - _MAX_LISTED} more" if len(items) > _MAX_LISTED else ""
                lines.append(f"  {label} ({len(items)}): {listed}{more}")
        raise ValueError("\n".join(lines))


def _log_casts(expected: Mapping[str, Tensor], state: Mapping[str, Tensor], source: str) -> None:
    """Say which floating dtypes are cast to the model's (fp16 weights into an fp32 model, say)."""
    casts: dict[tuple[torch.dtype, torch.dtype], int] = {}
    for k, v in expected.items():
        if state[k].dtype != v.dtype:
            casts[(state[k].dtype, v.dtype)] = casts.get((state[k].dtype, v.dtype), 0) + 1
    for (file_dtype, model_dtype), count in sorted(casts.items(), key=str):
        log.warning("%s: cast %d tensor(s) from %s to the model's %s", source, count, file_dtype, model_dtype)
