"""The Linear layers' matmuls in fp32 training, forward and backward, through oneDNN where it is the faster here.

torch sends an fp32 ``F.linear`` and its two backward products to MKL's sgemm. On some CPUs that is the slow
choice: on a 2-core AMD EPYC with AVX-512 (Zen 5) MKL ran at 0.198 TFLOP/s (half its AVX-512 rate: AVX2 code) where oneDNN, torch's
other matmul library, ran at 0.437 (2048 x 2048, ``benchmarks/train_throughput.py``'s peak line, docs/benchmarks.md).
Where MKL runs AVX-512 code the two may be even. So :func:`use_training_kernels` times both per shape, on this machine
(:func:`~aiayn.inference.kernel_choice.choose_training_kernels`, cached with inference's choices), and gives the
layers where oneDNN won a forward that calls :class:`OneDNNLinearFunction`: the same three products

    y = x W^T + b,     dL/dx = dL/dy W,     dL/dW = (dL/dy)^T x,     dL/db = sum of dL/dy over the rows,

each one oneDNN matmul, transposes passed as strides (oneDNN copies a strided right-hand side itself). Only the kernel
changes: the parameters, their names and checkpoints stay ``nn.Linear``'s.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["OneDNNLinear", "OneDNNLinearFunction", "linear", "training_kernel_choice", "training_kernel_layers",
           "use_training_kernels"]

log = logging.getLogger(__name__)


def _onednn(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight^T (+ bias)`` by oneDNN, for 2-D ``x (rows, in)`` and ``weight (out, in)`` of any strides."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class OneDNNLinearFunction(torch.autograd.Function):
    """``F.linear`` with its forward and both backward products computed by oneDNN (fp32, CPU)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        rows = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(rows, weight)
        ctx.has_bias = bias is not None
        return _onednn(rows, weight, bias).view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        rows, weight = ctx.saved_tensors
        grad_rows = grad_out.reshape(-1, grad_out.shape[-1])  # (rows, out)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _onednn(grad_rows, weight.t()).view(*grad_out.shape[:-1], weight.shape[1])  # dL/dy W
        if ctx.needs_input_grad[1]:
            grad_w = _onednn(grad_rows.t(), rows.t())  # (dL/dy)^T x: (out, rows) @ (rows, in)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad_rows.sum(0)
        return grad_x, grad_w, grad_b


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear`` through :class:`OneDNNLinearFunction` where it applies (plain fp32 CPU tensors, no autocast, not
    being compiled: the compiler picks its own kernels), else ``F.linear`` itself."""
    if (
        x.dtype != torch.float32 or weight.dtype != torch.float32 or x.device.type != "cpu"
        or type(weight) not in (Tensor, nn.Parameter) or torch.is_autocast_enabled("cpu")
        or torch.compiler.is_compiling() or x.numel() == 0
    ):
        return F.linear(x, weight, bias)
    return OneDNNLinearFunction.apply(x, weight, bias)


class OneDNNLinear(nn.Linear):
    """An ``nn.Linear`` whose products run through oneDNN (:func:`linear`); its state is ``nn.Linear``'s."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)


def training_kernel_layers(model: nn.Module) -> list[nn.Linear]:
    """The layers :func:`use_training_kernels` decides for: each CPU fp32 ``nn.Linear`` of ``model`` (none without oneDNN)."""
    if not torch.backends.mkldnn.is_available():
        return []
    return [m for m in model.modules() if type(m) is nn.Linear and m.weight.device.type == "cpu" and m.weight.dtype == torch.float32]


def training_kernel_choice(model: nn.Module, rows: int) -> list[str]:
    """The library timed faster here (or cached) for each layer of :func:`training_kernel_layers`, at ``rows`` rows
    (:func:`~aiayn.inference.kernel_choice.choose_training_kernels`); ``[]`` when there is none."""
    from aiayn.inference.kernel_choice import choose_training_kernels

    layers = training_kernel_layers(model)
    return choose_training_kernels([m.weight for m in layers], rows) if layers else []


def use_training_kernels(model: nn.Module, rows: int, *, kernels: list[str] | None = None) -> int:
    """Make each CPU fp32 ``nn.Linear`` of ``model`` whose shape oneDNN multiplies faster here an
    :class:`OneDNNLinear`, in place (its class changes; its parameters, hooks and keys stay); returns how many.

    ``rows`` is about a batch's tokens: the shapes are timed at that many rows (see
    :func:`~aiayn.inference.kernel_choice.choose_training_kernels`; ``$AIAYN_LINEAR_KERNEL=plain`` keeps MKL).
    ``kernels``: a choice made elsewhere, one per layer of :func:`training_kernel_layers` (distributed training:
    rank 0's :func:`training_kernel_choice`, timed while the other ranks wait), obeyed without timing."""
    layers = training_kernel_layers(model)
    if not layers:
        return 0
    chosen = training_kernel_choice(model, rows) if kernels is None else kernels
    if len(chosen) != len(layers):
        raise ValueError(f"kernels: {len(chosen)} choices for {len(layers)} fp32 Linear layers")
    for layer, kernel in zip(layers, chosen):
        if kernel == "onednn":
            layer.__class__ = OneDNNLinear
    count = chosen.count("onednn")
    log.info("fp32 training matmuls: oneDNN for %d of %d Linear layers, MKL for the rest (timed per shape here)", count, len(layers))
    return count
