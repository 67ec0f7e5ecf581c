"""Activation checkpointing per Transformer block: keep each block's input, recompute its inside in backward.

Peak activation memory then grows with one block's intermediates instead of all of them, for about
one more forward pass of compute (Chen et al., 2016). The composable ``checkpoint`` hooks the block
itself, so parameter names (checkpoint keys) do not change, and it composes with ``fully_shard``.
Dropout masks are replayed exactly (the generator state is saved), so gradients do not change.
"""

from __future__ import annotations

from torch import nn
from torch.distributed._composable import checkpoint

from aiayn.nn.blocks import TransformerLayer

__all__ = ["transformer_blocks", "apply_activation_checkpointing"]


def transformer_blocks(model: nn.Module) -> list[TransformerLayer]:
    """The model's Transformer blocks (layers), in order: the units to checkpoint and to shard."""
    return [m for m in model.modules() if isinstance(m, TransformerLayer)]


def apply_activation_checkpointing(model: nn.Module) -> int:
    """Checkpoint every block of ``model`` in place; return how many. Raises ``ValueError`` if it has none."""
    blocks = transformer_blocks(model)
    if not blocks:
        raise ValueError(
            f"train.activation_checkpointing=true needs a model with Transformer blocks; {type(model).__name__} has none"
        )
    for block in blocks:
        checkpoint(block)
    return len(blocks)
