"""What the three families share besides the blocks: positions, initialisation, input checks."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from aiayn.models.config import TransformerConfig
from aiayn.nn.embedding import TokenEmbedding
from aiayn.nn.masks import check_padding_mask
from aiayn.nn.positional import (
    ALiBiPositions,
    LearnedPositions,
    NoPositions,
    PositionalEncoding,
    RotaryPositions,
    SinusoidalPositions,
)

__all__ = ["build_positions", "init_weights", "check_token_ids", "resolve_padding"]


def build_positions(config: TransformerConfig) -> PositionalEncoding:
    """The position module named by ``config.positions``."""
    if config.positions == "sinusoidal":
        return SinusoidalPositions(config.d_model, config.max_len)
    if config.positions == "learned":
        return LearnedPositions(config.d_model, config.max_len)
    if config.positions == "rotary":
        return RotaryPositions(config.head_dim, config.rope_base)
    if config.positions == "alibi":
        return ALiBiPositions(config.n_heads)
    return NoPositions()


def init_weights(model: nn.Module, init_std: float | None, *, n_residual_layers: int | None = None) -> None:
    """Xavier-uniform linear weights (the Annotated Transformer; ``init_std=None``) or normal(0, std) (GPT/BERT).

    Biases start at zero, norms at gain 1; scaled token embeddings keep their own init (see
    TokenEmbedding). With ``n_residual_layers`` (GPT-2), the projections that feed the residual
    stream (``w_o``, ``w_2``) get std ``init_std / sqrt(2 n)`` so the stream's variance stays bounded.
    """
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            if init_std is None:
                nn.init.xavier_uniform_(module.weight)
            else:
                std = init_std
                if n_residual_layers and name.rsplit(".", 1)[-1] in ("w_o", "w_2"):
                    std = init_std / math.sqrt(2 * n_residual_layers)
                nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=init_std or 0.02)
        elif isinstance(module, TokenEmbedding) and init_std is not None and module.scale == 1.0:
            nn.init.normal_(module.weight, std=init_std)


def check_token_ids(ids: Tensor, vocab_size: int, name: str) -> None:
    """Raise before any compute if ``ids`` is not a ``(B, T)`` integer tensor with values in ``[0, vocab_size)``."""
    if not isinstance(ids, Tensor) or ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.is_complex():
        got = ids.dtype if isinstance(ids, Tensor) else type(ids).__name__
        raise TypeError(f"{name} must be an integer tensor of token ids, got {got}")
    if ids.dim() != 2:
        raise ValueError(f"{name} must have shape (B, T), got shape {tuple(ids.shape)}")
    if ids.numel() == 0 or torch.compiler.is_compiling():
        return  # a compiled graph cannot read values back (eager calls of the same model still check)
    low, high = torch.stack(torch.aminmax(ids)).tolist()  # one read-back for both bounds
    if high >= vocab_size:
        raise ValueError(f"{name} holds token id {high}, outside the vocabulary of vocab_size={vocab_size}")
    if low < 0:
        raise ValueError(f"{name} holds negative token id {low}; ids must be in [0, vocab_size={vocab_size})")


def resolve_padding(ids: Tensor, mask: Tensor | None, *, vocab_size: int, pad_id: int | None, name: str) -> Tensor | None:
    """Check ``ids (B, T)`` and its padding mask; derive the mask from ``pad_id`` when absent.

    Returns ``None`` when nothing is padded, so attention can take the fused, unmasked path.
    """
    check_token_ids(ids, vocab_size, name)
    if mask is not None:
        check_padding_mask(mask, f"{name}_mask", shape=tuple(ids.shape))
    elif pad_id is not None:
        mask = ids != pad_id
    if mask is not None and not torch.compiler.is_compiling() and bool(mask.all()):
        return None  # eagerly only: a compiled graph keeps the mask rather than branch on its values
    return mask
