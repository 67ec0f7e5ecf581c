"""Token embeddings, multiplied by sqrt(d_model) as in the paper (section 3.4)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["TokenEmbedding"]


class TokenEmbedding(nn.Module):
    """Lookup ``(B, T) ids -> (B, T, d_model)``, times ``sqrt(d_model)`` when ``scale`` (section 3.4).

    Scaled tables start with std ``d_model^-0.5``, so that the scaled lookup has unit scale (like the
    sinusoids it is added to) and the same table, tied, suits the output projection.
    """

    def __init__(self, vocab_size: int, d_model: int, *, scale: bool = True, init_std: float = 0.02) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))
        nn.init.normal_(self.weight, std=d_model**-0.5 if scale else init_std)
        self.scale = math.sqrt(d_model) if scale else 1.0

    def forward(self, ids: Tensor) -> Tensor:
        x = F.embedding(ids, self.weight)  # (B, T, D)
        return x * self.scale if self.scale != 1.0 else x
