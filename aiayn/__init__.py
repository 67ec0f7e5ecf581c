"""aiayn: the Transformer of "Attention Is All You Need" and its three families, to build, train, run and inspect.

The names below are imported when first used (PEP 562), so that ``import aiayn`` (and the ``aiayn`` command's
launcher, :mod:`aiayn.allocator`) starts without loading torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> the module that defines it
_EXPORTS = {
    "load": "aiayn.api", "LoadedModel": "aiayn.api",
    **dict.fromkeys(("PRESETS", "DecoderOnly", "DecoderOnlyConfig", "EncoderDecoder", "EncoderDecoderConfig", "EncoderOnly", "EncoderOnlyConfig", "build_model", "preset"), "aiayn.models"),
}

__all__ = [
    "__version__", "build_model", "preset", "PRESETS", "EncoderDecoder", "DecoderOnly", "EncoderOnly",
    "EncoderDecoderConfig", "DecoderOnlyConfig", "EncoderOnlyConfig", "load", "LoadedModel",
]

if TYPE_CHECKING:
    from aiayn.api import LoadedModel, load
    from aiayn.models import (
        PRESETS,
        DecoderOnly,
        DecoderOnlyConfig,
        EncoderDecoder,
        EncoderDecoderConfig,
        EncoderOnly,
        EncoderOnlyConfig,
        build_model,
        preset,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'aiayn' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
