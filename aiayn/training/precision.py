"""The training precision: ``fp32``, ``bf16`` or ``fp16`` autocast, or ``auto``, which takes bf16 only
where bf16 matrix products are native.

On a CPU without AMX or AVX512-BF16 (an AVX2-only machine, for example) torch computes a bf16
matmul in a slow generic loop: measured at 150x slower than fp32 on a 2-core AMD EPYC (AVX2), where
a Multi30k recipe step took 70 s instead of 3.5 s. With AMX the same step is about 1.5x faster in bf16.
``auto`` follows the hardware; a named precision is obeyed, with a warning where it will be slow.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import torch

from aiayn.inference.precision import native_bf16

__all__ = ["PRECISIONS", "resolve_precision", "autocast_context"]

log = logging.getLogger(__name__)

PRECISIONS: tuple[str, ...] = ("auto", "fp32", "bf16", "fp16")


def resolve_precision(precision: str, device: torch.device) -> str:
    """``auto`` -> ``bf16`` where :func:`native_bf16`, else ``fp32``; a named precision is returned as is
    (``bf16`` without native support is logged as a warning: it runs, slowly)."""
    if precision == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    if precision == "bf16" and not native_bf16(device):
        log.warning(
            "train.precision=bf16 on a %s without native bf16 matmuls (no AMX or AVX512-BF16): bf16 steps may be "
            "many times slower than fp32 here; train.precision=auto chooses by the hardware", device.type,
        )
    return precision


def autocast_context(precision: str, device: torch.device) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    """A factory of the autocast context for a resolved ``precision`` (``fp32``: no autocast)."""
    if precision == "fp32":
        return contextlib.nullcontext
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return lambda: torch.autocast(device.type, dtype=dtype)
