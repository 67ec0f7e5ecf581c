"""The training precision: ``fp32``, ``bf16`` or ``fp16`` autocast, or ``auto``, which takes bf16 only
where bf16 matrix products are native. The names are inference's (``float32``, ``bfloat16``, ``float16``,
:data:`~aiayn.inference.precision.DTYPES`), with the short ones as aliases: one vocabulary.

On a CPU without AMX or AVX512-BF16 (an AVX2-only machine, for example) torch computes a bf16
matmul in a slow generic loop: measured at 150x slower than fp32 on a 2-core AMD EPYC (AVX2), where
a Multi30k recipe step took 70 s instead of 3.5 s. With AMX the same step is about 1.5x faster in bf16.
``auto`` follows the hardware; a named precision is obeyed, with a warning where it will be slow.

``bf16-master`` (``bfloat16-master``) trains bf16 parameters with an fp32 master copy, cast once per optimizer
step (:mod:`aiayn.training.master_weights`), instead of autocast's cast of every weight at every forward.
Where bf16 is native, ``auto`` takes it for a model of at least :data:`MASTER_MIN_PARAMS` parameters trained in
one process without ``train.compile``, and bf16 autocast otherwise. The rule is provisional: the casts it saves
grow with the model, but the threshold is not measured yet; ``benchmarks/train_throughput.py --dtypes
bf16,bf16-master`` times both per shape and prints whether the rule picked the faster one.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import torch

from aiayn.inference.precision import DTYPE_CHOICES, dtype_name, native_bf16, parse_dtype

__all__ = ["PRECISIONS", "MASTER", "MASTER_NAMES", "MASTER_MIN_PARAMS", "resolve_precision", "autocast_context"]

log = logging.getLogger(__name__)

MASTER = "bfloat16-master"  # bf16 parameters, fp32 masters; "bf16-master" is its short alias
MASTER_ALIASES = {"bf16-master": MASTER}
MASTER_NAMES = (MASTER, *MASTER_ALIASES)
PRECISIONS: tuple[str, ...] = ("auto", *DTYPE_CHOICES, *MASTER_NAMES)
MASTER_MIN_PARAMS = 50_000_000  # auto's rule, provisional: above the CPU recipes (<= ~25 M), below GPT-2 small (124 M)


def resolve_precision(
    precision: str, device: torch.device, *, n_params: int | None = None, master_ok: bool = False,
) -> str:
    """The precision's one name: ``auto`` -> where :func:`native_bf16`, ``bfloat16-master`` for a model of
    ``n_params >= MASTER_MIN_PARAMS`` when ``master_ok`` (one process, not compiled), else ``bfloat16``; without
    native bf16, ``float32``. ``bf16`` -> ``bfloat16`` (without native support logged as a warning: it runs,
    slowly; so does ``bf16-master``)."""
    if precision == "auto":
        if not native_bf16(device):
            return "float32"
        return MASTER if master_ok and n_params is not None and n_params >= MASTER_MIN_PARAMS else "bfloat16"
    name = MASTER if precision in MASTER_NAMES else dtype_name(precision, name="train.precision")
    if name in ("bfloat16", MASTER) and not native_bf16(device):
        log.warning(
            "train.precision=%s on a %s without native bf16 matmuls (no AMX or AVX512-BF16): bf16 steps may be "
            "many times slower than fp32 here; train.precision=auto chooses by the hardware", precision, device.type,
        )
    return name


def autocast_context(precision: str, device: torch.device) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    """A factory of the autocast context for a resolved ``precision`` (``float32``: no autocast; ``bfloat16-master``:
    bf16 autocast, for what runs on the fp32 masters, such as validation)."""
    dtype = torch.bfloat16 if precision == MASTER else parse_dtype(precision, name="train.precision")
    if dtype == torch.float32:
        return contextlib.nullcontext
    return lambda: torch.autocast(device.type, dtype=dtype)
