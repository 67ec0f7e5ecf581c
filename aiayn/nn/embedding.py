"""Token embeddings, multiplied by sqrt(d_model) as in the paper (section 3.4)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["TokenEmbedding", "use_row_gradients"]


class TokenEmbedding(nn.Module):
    """Lookup ``(B, T) ids -> (B, T, d_model)``, times ``sqrt(d_model)`` when ``scale`` (section 3.4).

    Scaled tables start with std ``d_model^-0.5``, so that the scaled lookup has unit scale (like the
    sinusoids it is added to) and the same table, tied, suits the output projection.
    ``row_gradients`` (set by :func:`use_row_gradients`): the lookup's gradient as the looked-up rows (a sparse
    tensor), not a table of zeros but for them.
    """

    row_gradients = False

    def __init__(self, vocab_size: int, d_model: int, *, scale: bool = True, init_std: float = 0.02) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))
        nn.init.normal_(self.weight, std=d_model**-0.5 if scale else init_std)
        self.scale = math.sqrt(d_model) if scale else 1.0

    def forward(self, ids: Tensor) -> Tensor:
        x = F.embedding(ids, self.weight, sparse=self.row_gradients)  # (B, T, D)
        return x * self.scale if self.scale != 1.0 else x


def use_row_gradients(model: nn.Module) -> int:
    """Have each :class:`TokenEmbedding` of ``model`` whose table is also a Linear layer's weight (the output projection,
    tied: section 3.4) pass back its gradient as rows; returns how many. The table's gradient is then the output
    projection's (dense, computed first in the backward pass) with the looked-up rows added, where a dense lookup
    gradient zeroed a second table, filled its rows and added it whole: GPT-2 small's bf16-master step ran 1.03x
    faster (docs/benchmarks.md). Only for training whose loss reads the output projection at every step (language
    modelling, translation): a table whose only gradient were the rows would get a sparse one, which AdamW refuses."""
    tied = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    embeddings = [m for m in model.modules() if isinstance(m, TokenEmbedding) and id(m.weight) in tied]
    for m in embeddings:
        m.row_gradients = True
    return len(embeddings)
