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

bf16 training (autocast or master weights) asks another question of the same products. On an AMX Xeon (2 threads,
torch 2.13) oneDNN's bf16 product of 1,024 rows into 768 outputs ran at 1.1-1.3 TFLOP/s, where the same rows in two
calls of 512 ran at 1.9-2.1 (GPT-2 small's attention output and second FFN layer forward, and the input gradients of
its Q/K/V, first FFN layer and output projection); at 2,048 rows the split halved the speed instead. So for a batch
of fixed rows (language modelling), :func:`use_training_kernels` times, per shape at exactly those rows, the forward
and the input gradient each in one call and in two, and the forward and the weight gradient from transposed views or
with a transpose written out (:func:`~aiayn.inference.kernel_choice.choose_row_splits`: GPT-2's output projection runs
both twice as fast from written-out transposes), and gives the layers where another layout won a forward through
:class:`RowSplitLinearFunction`.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["OneDNNLinear", "OneDNNLinearFunction", "RowSplitLinear", "RowSplitLinearFunction", "forward_product", "layout_flags", "linear", "split_product", "transpose",
           "weight_grad_product",
           "training_kernel_choice", "training_kernel_layers", "use_training_kernels"]

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
        return self.product(x, self.weight, self.bias)

    def product(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """``F.linear(x, weight, bias)`` the way this layer's own runs (self-attention's fused Q/K/V use it)."""
        return linear(x, weight, bias)


def split_product(a: Tensor, b: Tensor, bias: Tensor | None, split: bool) -> Tensor:
    """``a @ b (+ bias)`` for 2-D ``a (rows, k)``, ``b (k, n)``: one call, or (``split``) the rows of ``a`` in two calls
    that write the two halves of one output (each row's sums are the same either way)."""
    if not split or a.shape[0] < 2:
        return a.mm(b) if bias is None else torch.addmm(bias, a, b)
    out = a.new_empty(a.shape[0], b.shape[1])
    half = a.shape[0] // 2
    for part in (slice(0, half), slice(half, None)):
        if bias is None:
            torch.mm(a[part], b, out=out[part])
        else:
            torch.addmm(bias, a[part], b, out=out[part])
    return out


class RowSplitLinearFunction(torch.autograd.Function):
    """``F.linear`` over bf16 tensors in the layout timed fastest here (:func:`layout_flags`): the forward's rows in one
    call or two, or over the weight's transpose written out (``transpose_forward``); the input gradient's rows in one
    call or two; the weight gradient as ``(dL/dy)^T x``, or (``transpose_weight_grad``) as ``(x^T dL/dy)^T`` with
    ``x^T`` written out. oneDNN copies a transposed operand into its own layout at every call, which costs most where
    the operand is large: GPT-2's output projection (50257 x 768) ran its forward and weight gradient at 1.1-1.2
    TFLOP/s from transposed views and at 2.2-2.4 from written-out transposes (AMX Xeon, 2026-12-06)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None, split_forward: bool, split_input_grad: bool,
                transpose_forward: bool = False, transpose_weight_grad: bool = False) -> Tensor:
        rows = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(rows, weight)
        ctx.has_bias, ctx.split_input_grad, ctx.transpose_weight_grad = bias is not None, split_input_grad, transpose_weight_grad
        return forward_product(rows, weight, bias, split_forward, transpose_forward).view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        rows, weight = ctx.saved_tensors
        grad_rows = grad_out.reshape(-1, grad_out.shape[-1])  # (rows, out)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = split_product(grad_rows, weight, None, ctx.split_input_grad).view(*grad_out.shape[:-1], weight.shape[1])
        if ctx.needs_input_grad[1]:
            grad_w = weight_grad_product(grad_rows, rows, ctx.transpose_weight_grad)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad_rows.sum(0)
        return grad_x, grad_w, grad_b, None, None, None, None


def forward_product(rows: Tensor, weight: Tensor, bias: Tensor | None, split: bool, transposed: bool) -> Tensor:
    """``rows @ weight^T (+ bias)``: over the weight's transpose written out (``transposed``), or over a transposed view
    with the rows in one call or (``split``) two. The layer runs it and the training choice times it."""
    if transposed:
        return split_product(rows, transpose(weight), bias, False)
    return split_product(rows, weight.t(), bias, split)


def weight_grad_product(grad_rows: Tensor, rows: Tensor, transposed: bool) -> Tensor:
    """``(dL/dy)^T x`` from transposed views, or (``transposed``) as ``(x^T dL/dy)^T``: ``x^T (in, rows) @ dL/dy
    (rows, out)`` with ``x^T`` written out, and its result transposed back. The layer runs it and the training choice
    times it."""
    return transpose(transpose(rows).mm(grad_rows)) if transposed else grad_rows.t().mm(rows)


def transpose(x: Tensor) -> Tensor:
    """``x.t()`` written contiguous, by our tiled kernel (``aiayn_native::transpose``; torch's copy of a transposed view
    took 85 ms over a 50257 x 768 bf16 matrix where ours took 15, AMX Xeon, 2026-12-06). Only called where the
    training choice timed it, so where the library built."""
    return torch.ops.aiayn_native.transpose(x)


def layout_flags(choice: str) -> dict[str, bool]:
    """A bf16 training choice (:data:`~aiayn.inference.kernel_choice.ROW_SPLITS`: ``plain`` or ``+``-joined parts) as
    :class:`RowSplitLinear`'s four flags."""
    parts = set() if choice == "plain" else set(choice.split("+"))
    return {"split_forward": "split-forward" in parts, "split_input_grad": "split-input-grad" in parts,
            "transpose_forward": "transposed-forward" in parts, "transpose_weight_grad": "transposed-weight-grad" in parts}


class RowSplitLinear(nn.Linear):
    """An ``nn.Linear`` whose bf16 training products take the layout timed faster here (split rows, transposes written
    out: :class:`RowSplitLinearFunction`'s flags, set by :func:`use_training_kernels`); fp32 without autocast, other
    devices and graphs being compiled run ``F.linear``. Its state is ``nn.Linear``'s."""

    split_forward = False
    split_input_grad = False
    transpose_forward = False
    transpose_weight_grad = False

    def forward(self, x: Tensor) -> Tensor:
        return self.product(x, self.weight, self.bias)

    def product(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """``F.linear(x, weight, bias)`` the way this layer's own runs (self-attention's fused Q/K/V use it)."""
        if weight.dtype == torch.float32 and torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16:
            # what autocast does to F.linear's arguments, done here since the products below are ours
            x, weight, bias = x.to(torch.bfloat16), weight.to(torch.bfloat16), None if bias is None else bias.to(torch.bfloat16)
        if (x.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16 or x.device.type != "cpu" or x.numel() == 0
                or torch.compiler.is_compiling()):
            return F.linear(x, weight, bias)
        return RowSplitLinearFunction.apply(x, weight, bias, self.split_forward, self.split_input_grad, self.transpose_forward,
                                            self.transpose_weight_grad)


def training_kernel_layers(model: nn.Module) -> list[nn.Linear]:
    """The layers :func:`use_training_kernels` decides for: each CPU fp32 ``nn.Linear`` of ``model`` (none without oneDNN)."""
    if not torch.backends.mkldnn.is_available():
        return []
    return [m for m in model.modules() if type(m) is nn.Linear and m.weight.device.type == "cpu" and m.weight.dtype == torch.float32]


def training_kernel_choice(model: nn.Module, rows: int, dtype: torch.dtype = torch.float32) -> list[str]:
    """The kernel timed faster here (or cached) for each layer of :func:`training_kernel_layers`, at ``rows`` rows, for
    products in ``dtype``: fp32's library (:func:`~aiayn.inference.kernel_choice.choose_training_kernels`) or bf16's
    row splits (:func:`~aiayn.inference.kernel_choice.choose_row_splits`); ``[]`` when there is no layer."""
    from aiayn.inference.kernel_choice import choose_row_splits, choose_training_kernels

    layers = training_kernel_layers(model)
    if not layers:
        return []
    weights = _product_weights(model, layers)
    return choose_row_splits(weights, rows) if dtype == torch.bfloat16 else choose_training_kernels(weights, rows)


def _product_weights(model: nn.Module, layers: list[nn.Linear]) -> list[Tensor]:
    """A weight of the shape each layer's training products have: its own, but for a self-attention's ``w_q``, whose
    products in training are Q, K and V's in one (:meth:`~aiayn.nn.multihead.MultiHeadAttention._project_self`), a
    random one of the three's shape (the choices of ``w_k`` and ``w_v`` are then unused)."""
    from aiayn.nn.multihead import MultiHeadAttention  # here: it imports this module

    fused = {id(m.w_q): m for m in model.modules() if isinstance(m, MultiHeadAttention) and not m.cross}
    by_shape: dict[tuple[int, int], Tensor] = {}  # one random weight per fused shape: every layer's is alike
    weights = []
    for layer in layers:
        attention = fused.get(id(layer))
        if attention is None:
            weights.append(layer.weight)
            continue
        shape = (sum(getattr(attention, name).out_features for name in ("w_q", "w_k", "w_v")), layer.in_features)
        if shape not in by_shape:
            by_shape[shape] = layer.weight.new_empty(shape).normal_()  # values as a weight's (no denormals)
        weights.append(by_shape[shape])
    return weights


def use_training_kernels(model: nn.Module, rows: int, *, kernels: list[str] | None = None, dtype: torch.dtype = torch.float32) -> int:
    """Give each CPU fp32 ``nn.Linear`` of ``model`` the training kernel timed faster here for its shape, in place (its
    class changes; its parameters, hooks and keys stay); returns how many changed. ``dtype``: the products' dtype,
    ``float32`` (oneDNN's layers where it beat MKL: :class:`OneDNNLinear`) or ``bfloat16`` (autocast or master
    weights: :class:`RowSplitLinear` where splitting the rows of a product beat one call).

    ``rows`` is about a batch's tokens: the shapes are timed at that many rows (fp32 capped, see
    :func:`~aiayn.inference.kernel_choice.choose_training_kernels`; bf16 exactly, so only for batches of fixed rows;
    ``$AIAYN_LINEAR_KERNEL=plain`` keeps torch's ``F.linear``). ``kernels``: a choice made elsewhere, one per layer of
    :func:`training_kernel_layers` (distributed training: rank 0's :func:`training_kernel_choice`, timed while the
    other ranks wait), obeyed without timing."""
    layers = training_kernel_layers(model)
    if not layers:
        return 0
    chosen = training_kernel_choice(model, rows, dtype) if kernels is None else kernels
    if len(chosen) != len(layers):
        raise ValueError(f"kernels: {len(chosen)} choices for {len(layers)} fp32 Linear layers")
    if dtype == torch.bfloat16:
        for layer, kernel in zip(layers, chosen):
            if kernel != "plain":
                layer.__class__ = RowSplitLinear
                for flag, value in layout_flags(kernel).items():
                    setattr(layer, flag, value)
        count = len(chosen) - chosen.count("plain")
        log.info("bf16 training matmuls: rows split in two calls or a transpose written out for %d of %d Linear layers "
                 "(timed per shape at %d rows here)", count, len(layers), rows)
        return count
    for layer, kernel in zip(layers, chosen):
        if kernel == "onednn":
            layer.__class__ = OneDNNLinear
    count = chosen.count("onednn")
    log.info("fp32 training matmuls: oneDNN for %d of %d Linear layers, MKL for the rest (timed per shape here)", count, len(layers))
    return count
