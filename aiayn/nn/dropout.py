"""Dropout (Srivastava et al. 2014; the paper's P_drop, section 5.4): in training, each element is zeroed with probability
``p`` and the rest are scaled by ``1 / (1 - p)``, so that the expected output is the input; outside training, the
identity.

On the CPU, where it was timed faster for the dtype (:func:`aiayn.inference.kernel_choice.choose_dropout`), the mask comes
from our kernel (``aiayn/inference/dropout.cpp``): a counter-based generator (Philox4x32-10) keyed by a seed drawn
from torch's generator at each call, so runs stay reproducible under ``torch.manual_seed`` and resume exactly, and the
backward pass regenerates the mask from the seed instead of keeping it. torch's CPU dropout draws its mask on one
thread: 6 ms a million elements on a Zen 4 EPYC, where ours took 0.4 (docs/benchmarks.md). Elsewhere (another device,
float64, inside a compiled graph), torch's ``F.dropout``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.inference import gemv, kernel_choice

__all__ = ["Dropout", "dropout", "takes_kernel"]


def takes_kernel(x: Tensor, p: float) -> bool:
    """Whether :func:`dropout` of ``x`` at rate ``p`` in training goes through our kernel (see the module docstring)."""
    return (0.0 < p < 1.0 and x.device.type == "cpu" and x.dtype in gemv.DTYPES and not torch.compiler.is_compiling()
            and kernel_choice.choose_dropout(x.dtype) == "native")


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``x`` with dropout at rate ``p`` in training (``F.dropout``'s contract), ``x`` itself otherwise or at ``p = 0``."""
    if not training or p == 0.0:
        return x
    if takes_kernel(x, p):
        seed = int(torch.randint(-(1 << 63), (1 << 63) - 1, (), dtype=torch.int64))  # torch's generator: reproducible
        return _SeededDropout.apply(x, p, seed)
    return F.dropout(x, p, True)


class Dropout(nn.Dropout):
    """``nn.Dropout`` (the same arguments, state and ``repr``) through :func:`dropout`."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)


class _SeededDropout(torch.autograd.Function):
    """Our kernel's dropout; its gradient is the same mask (the same seed) over the incoming gradient."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, p: float, seed: int) -> Tensor:
        ctx.p, ctx.seed = p, seed
        return gemv.dropout(x, p, seed)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        return gemv.dropout(grad, ctx.p, ctx.seed), None, None
