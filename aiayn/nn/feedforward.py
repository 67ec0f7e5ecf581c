"""Position-wise feed-forward network (paper section 3.3) and its gated successor SwiGLU."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["PositionwiseFeedForward", "ACTIVATIONS"]

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
        self.dropout = nn.Dropout(activation_dropout)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, T, d_model) -> (B, T, d_model)``."""
        if self.w_gate_up is not None:
            gate, hidden = self.w_gate_up(x).chunk(2, dim=-1)  # (B, T, d_ff) each
            return self.w_2(self.dropout(F.silu(gate) * hidden))
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
            hidden = F.gelu(hidden, approximate="tanh")
        return self.w_2(self.dropout(hidden))
