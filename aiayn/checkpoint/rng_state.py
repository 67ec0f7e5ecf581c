"""Capture and restore every random generator a run draws from, so a resumed run draws the same numbers.

Covered: torch's CPU generator, the CUDA generators once CUDA is in use, numpy's global (legacy)
generator, Python's ``random`` and any named ``torch.Generator`` / ``numpy.random.Generator`` the
caller owns (a data loader's shuffling generator, say). The state is split like a checkpoint file
pair: byte tensors (torch states) for safetensors, the rest as JSON.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

__all__ = ["RngState", "capture_rng_state", "restore_rng_state"]

RNG_FORMAT = 1

Generator = torch.Generator | np.random.Generator


class RngState(NamedTuple):
    """Generator states: ``tensors`` (torch byte states, for safetensors) and JSON-ready ``meta``."""

    tensors: dict[str, Tensor]
    meta: dict[str, Any]


def capture_rng_state(generators: Mapping[str, Generator] | None = None) -> RngState:
    """Snapshot the global torch/CUDA/numpy/Python generators and the named ``generators``."""
    tensors: dict[str, Tensor] = {"torch.cpu": torch.get_rng_state()}
    n_cuda = 0
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # an unused CUDA generator needs no saving
        states = torch.cuda.get_rng_state_all()
        n_cuda = len(states)
        tensors.update({f"torch.cuda.{i}": s for i, s in enumerate(states)})
    version, internal, gauss_next = random.getstate()
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    meta: dict[str, Any] = {
        "format": RNG_FORMAT,
        "cuda_devices": n_cuda,
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
        "numpy": {
            "bit_generator": name,
            "keys": np.asarray(keys).tolist(),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "generators": {},
    }
    for gen_name, gen in (generators or {}).items():
        if isinstance(gen, torch.Generator):
            tensors[f"generator.{gen_name}"] = gen.get_state()
            meta["generators"][gen_name] = {"kind": "torch"}
        elif isinstance(gen, np.random.Generator):
            meta["generators"][gen_name] = {"kind": "numpy", "state": _arrays_to_json(gen.bit_generator.state)}
        else:
            raise TypeError(
                f"generators[{gen_name!r}] must be a torch.Generator or numpy.random.Generator, "
                f"got {type(gen).__name__}"
            )
    return RngState(tensors, meta)


def restore_rng_state(
    tensors: Mapping[str, Tensor], meta: Mapping[str, Any], generators: Mapping[str, Generator] | None = None
) -> None:
    """Put back a state from ``capture_rng_state``; the named ``generators`` are restored in place.

    CUDA states are restored only when this process sees as many CUDA devices as were saved (a warning
    says so otherwise, e.g. when a GPU run is resumed on a CPU for debugging). Raises ``ValueError``
    for an unknown format, a missing entry or a generator name that was not saved, ``TypeError`` when
    a generator is not of the saved kind.
    """
    if meta.get("format") != RNG_FORMAT:
        raise ValueError(f"rng state format must be {RNG_FORMAT}, got {meta.get('format')!r}")
    missing = [key for key in ("cuda_devices", "python", "numpy") if key not in meta]
    if missing:
        raise ValueError(f"rng state lacks the entries {missing}; keys present: {sorted(meta)}")
    if "torch.cpu" not in tensors:
        raise ValueError(f"rng state has no 'torch.cpu' tensor; tensors present: {sorted(tensors)}")
    torch.set_rng_state(tensors["torch.cpu"])
    n_cuda = int(meta["cuda_devices"])
    if n_cuda:
        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if available == n_cuda:
            torch.cuda.set_rng_state_all([tensors[f"torch.cuda.{i}"] for i in range(n_cuda)])
        else:
            warnings.warn(
                f"rng state holds {n_cuda} CUDA generator states but this process sees {available} CUDA devices; "
                "CUDA generators not restored",
                stacklevel=2,
            )
    py = meta["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss_next"]))
    npy = meta["numpy"]
    keys = np.asarray(npy["keys"], dtype=np.uint32)
    np.random.set_state((npy["bit_generator"], keys, npy["pos"], npy["has_gauss"], npy["cached_gaussian"]))
    saved = meta.get("generators", {})
    for gen_name, gen in (generators or {}).items():
        if gen_name not in saved:
            raise ValueError(f"generator {gen_name!r} is not in the rng state; saved generators: {sorted(saved)}")
        kind = saved[gen_name]["kind"]
        if kind == "torch" and isinstance(gen, torch.Generator):
            gen.set_state(tensors[f"generator.{gen_name}"])
        elif kind == "numpy" and isinstance(gen, np.random.Generator):
            gen.bit_generator.state = _arrays_from_json(saved[gen_name]["state"])
        else:
            raise TypeError(f"generator {gen_name!r} was saved as a {kind} generator, got a {type(gen).__name__}")


def _arrays_to_json(value: Any) -> Any:
    """numpy arrays and scalars inside a bit-generator state -> JSON-ready values (arrays tagged with dtype)."""
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _arrays_to_json(v) for k, v in value.items()}
    return value


def _arrays_from_json(value: Any) -> Any:
    if isinstance(value, dict):
        if "__ndarray__" in value:
            return np.asarray(value["__ndarray__"], dtype=value["dtype"])
        return {k: _arrays_from_json(v) for k, v in value.items()}
    return value
