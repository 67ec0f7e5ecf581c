"""Position-wise feed-forward network (paper section 3.3) and its gated successor SwiGLU."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.inference import gemv, kernel_choice
from aiayn.nn.dropout import Dropout

__all__ = ["PositionwiseFeedForward", "ACTIVATIONS", "gelu_tanh", "native_gelu_tanh"]

ACTIVATIONS: tuple[str, ...] = ("relu", "gelu", "gelu_tanh", "silu", "swiglu", "relu2")


class PositionwiseFeedForward(nn.Module):
    """``FFN(x) = act(x W_1 + b_1) W_2 + b_2``, applied to each position separately.

    ``activation``: ``relu`` (the paper), ``gelu`` (BERT), ``gelu_tanh`` (GPT-2's approximation), ``silu``
    (swish; Marian/opus-mt), ``swiglu`` (Shazeer, 2020: ``(silu(x W_gate) * x W_1) W_2``, a third matrix ``w_gate``)
    or ``relu2`` (``relu(x)^2``, So et al., 2021, "Primer"; the modded-nanogpt speedruns use it).
    ``activation_dropout`` drops the hidden units (not in the paper; fairseq's option).
    """

    def __init__(
        self, d_model: int, d_ff: int, *, activation: str = "relu", bias: bool = True, activation_dropout: float = 0.0
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        self.activation = activation
        self.w_1 = nn.Linear(d_model, d_ff, bias=bias)
        self.w_gate = nn.Linear(d_model, d_ff, bias=bias) if activation == "swiglu" else None
        self.w_2 = nn.Linear(d_ff, d_model, bias=bias)
        self.w_gate_up: nn.Module | None = None  # SwiGLU's w_gate and w_1 as one layer, fused at load (aiayn.inference.fusion)
        self.dropout = Dropout(activation_dropout)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, T, d_model) -> (B, T, d_model)``."""
        if self.w_gate_up is not None:
            gate, hidden = self.w_gate_up(x).chunk(2, dim=-1)  # (B, T, d_ff) each
            hidden = F.silu(gate) * hidden
            return self.w_2(self.dropout(hidden) if self.training else hidden)
        hidden = self.w_1(x)  # (B, T, d_ff)
        if self.w_gate is not None:
            hidden = F.silu(self.w_gate(x)) * hidden
        elif self.activation == "relu":
            hidden = F.relu(hidden)
        elif self.activation == "gelu":
            hidden = F.gelu(hidden)
        elif self.activation == "silu":
            hidden = F.silu(hidden)
        elif self.activation == "relu2":
            hidden = F.relu(hidden).square()
        else:
            hidden = gelu_tanh(hidden)
        return self.w_2(self.dropout(hidden) if self.training else hidden)  # dropout is the identity outside training


def gelu_tanh(x: Tensor) -> Tensor:
    """``F.gelu(x, approximate="tanh")``, GPT-2's GELU, through our kernel (:func:`aiayn.inference.gemv.gelu_tanh`) on the
    CPU where it was timed faster for ``x``'s dtype on this machine (:func:`aiayn.inference.kernel_choice.choose_gelu_tanh`;
    torch's took 4.4x its exact GELU's time on an AMX Xeon), else torch's; torch's in a graph being compiled."""
    if torch.compiler.is_compiling() or not native_gelu_tanh(x.dtype, x.device):
        return F.gelu(x, approximate="tanh")
    if not (x.requires_grad and torch.is_grad_enabled()):
        return gemv.gelu_tanh(x)  # no gradient to keep: the kernel alone (autograd's Function costs more than it at one row)
    return _GeluTanh.apply(x)


def native_gelu_tanh(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether :func:`gelu_tanh` takes our kernel for eager inputs of ``dtype`` on ``device`` (the C++ decoding step asks
    the same: aiayn.decoding.native_step)."""
    return device.type == "cpu" and dtype in gemv.DTYPES and kernel_choice.choose_gelu_tanh(dtype) == "native"


class _GeluTanh(torch.autograd.Function):
    """:func:`aiayn.inference.gemv.gelu_tanh` with its gradient (:func:`~aiayn.inference.gemv.gelu_tanh_backward`)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return gemv.gelu_tanh(x)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return gemv.gelu_tanh_backward(grad, x)
