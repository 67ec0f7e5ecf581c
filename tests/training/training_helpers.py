"""Tiny models and comparison helpers shared by the training tests."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn


class TinyModel(nn.Module):
    """Embedding, linear, norm, dropout and an output projection tied to the embedding (by default)."""

    def __init__(self, vocab: int = 11, d: int = 8, tied: bool = True) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.proj = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.drop = nn.Dropout(0.25)
        self.out = nn.Linear(d, vocab, bias=False)
        if tied:
            self.out.weight = self.embed.weight
        self.register_buffer("counter", torch.zeros((), dtype=torch.int64))

    def forward(self, ids: Tensor) -> Tensor:
        x = self.drop(self.embed(ids))
        return self.out(self.norm(torch.relu(self.proj(x))))


def assert_same(a: Any, b: Any, path: str = "") -> None:
    """Exact structural equality: same container types, same keys, tensors equal in dtype, shape and values."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{tuple(a.shape)} != {b.dtype}{tuple(b.shape)}"
        assert torch.equal(a, b), f"{path}: tensor values differ"
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), f"{path}: nan != {b!r}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"
