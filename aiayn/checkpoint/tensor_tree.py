"""Split a nested state (an optimizer ``state_dict``) into tensors and JSON, and join them back exactly.

``flatten_tree`` replaces every tensor by ``{"__tensor__": name}`` and collects it under that name (for
a safetensors file); what JSON cannot hold is tagged so that ``unflatten_tree`` restores the very same
structure: tuples (``{"__tuple__": [...]}``), dicts with non-string keys such as the integer parameter
ids of an optimizer (``{"__items__": [[key, value], ...]}``) and non-finite floats
(``{"__float__": "nan"}``). Anything else (a numpy array, an object) is refused with its key path.
"""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor

__all__ = ["flatten_tree", "unflatten_tree"]

_TAGS = ("__tensor__", "__tuple__", "__items__", "__float__")


def flatten_tree(tree: Any, *, allow_tensors: bool = True) -> tuple[dict[str, Tensor], Any]:
    """``tree`` -> (tensors by name, JSON-ready structure); ``TypeError`` naming the path of a bad leaf.

    Tensor names are their key paths (``state.0.exp_avg``); tensors are detached, made contiguous and
    moved to the CPU. With ``allow_tensors=False`` a tensor is refused like any other non-JSON leaf.
    """
    tensors: dict[str, Tensor] = {}

    def encode(value: Any, path: str) -> Any:
        if isinstance(value, Tensor):
            if not allow_tensors:
                raise TypeError(f"{path or 'value'}: tensors are not allowed here, got a {value.dtype} tensor")
            name = path or "value"
            while name in tensors:  # keys holding dots could collide with a nested path
                name += "'"
            tensors[name] = value.detach().cpu().contiguous()
            return {"__tensor__": name}
        if value is None or isinstance(value, (bool, int, str)):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else {"__float__": repr(value)}
        if isinstance(value, tuple):
            return {"__tuple__": [encode(v, f"{path}.{i}".lstrip(".")) for i, v in enumerate(value)]}
        if isinstance(value, list):
            return [encode(v, f"{path}.{i}".lstrip(".")) for i, v in enumerate(value)]
        if isinstance(value, dict):
            if all(isinstance(k, str) and k not in _TAGS for k in value):
                return {k: encode(v, f"{path}.{k}".lstrip(".")) for k, v in value.items()}
            return {"__items__": [[encode(k, path), encode(v, f"{path}.{k}".lstrip("."))] for k, v in value.items()]}
        raise TypeError(
            f"{path or 'value'}: cannot store a {type(value).__name__}; expected a tensor, dict, list, tuple, "
            "int, float, bool, str or None"
        )

    return tensors, encode(tree, "")


def unflatten_tree(tensors: dict[str, Tensor], encoded: Any) -> Any:
    """Inverse of ``flatten_tree``; ``ValueError`` naming a tensor the structure refers to but is missing."""
    if isinstance(encoded, list):
        return [unflatten_tree(tensors, v) for v in encoded]
    if not isinstance(encoded, dict):
        return encoded
    if "__tensor__" in encoded:
        name = encoded["__tensor__"]
        if name not in tensors:
            raise ValueError(f"tensor {name!r} is referenced by the structure but missing from the tensors")
        return tensors[name]
    if "__tuple__" in encoded:
        return tuple(unflatten_tree(tensors, v) for v in encoded["__tuple__"])
    if "__items__" in encoded:
        return {unflatten_tree(tensors, k): unflatten_tree(tensors, v) for k, v in encoded["__items__"]}
    if "__float__" in encoded:
        return float(encoded["__float__"])
    return {k: unflatten_tree(tensors, v) for k, v in encoded.items()}

