"""Key/value caches for incremental decoding: each step attends to what earlier steps computed."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["LayerCache", "KVCache"]


class LayerCache:
    """Keys and values ``(B, Hkv, S, D)`` of one attention layer.

    Self-attention appends the new step's keys/values; cross-attention fills it once from the
    encoder output and then only reads it. With ``max_len`` the storage is preallocated (a static
    cache: no reallocation per step, and fixed shapes for ``torch.compile``).
    """

    def __init__(self, max_len: int | None = None) -> None:
        self.max_len = max_len
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.length = 0

    @property
    def filled(self) -> bool:
        return self.k is not None

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add ``k, v (B, Hkv, T, D)`` after the cached ones; return all keys and values so far."""
        new_len = self.length + k.shape[2]
        if self.max_len is None:
            self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
            self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        else:
            if new_len > self.max_len:
                raise ValueError(f"static cache holds max_len={self.max_len} positions, asked for {new_len}")
            if self.k is None or self.v is None:
                self.k = k.new_empty(k.shape[0], k.shape[1], self.max_len, k.shape[3])
                self.v = v.new_empty(v.shape[0], v.shape[1], self.max_len, v.shape[3])
            self.k[:, :, self.length : new_len] = k
            self.v[:, :, self.length : new_len] = v
        self.length = new_len
        return self.k[:, :, :new_len], self.v[:, :, :new_len]

    def set(self, k: Tensor, v: Tensor) -> None:
        """Store cross-attention keys/values computed once from the encoder output."""
        self.k, self.v, self.length = k, v, k.shape[2]

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search reorders hypotheses every step)."""
        if self.k is not None and self.v is not None:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)


class KVCache:
    """The caches of a whole decoder: one per layer for self-attention, and for cross-attention if any."""

    def __init__(self, n_layers: int, *, cross_attention: bool = False, max_len: int | None = None) -> None:
        self.self_attn = [LayerCache(max_len) for _ in range(n_layers)]
        self.cross_attn = [LayerCache() for _ in range(n_layers)] if cross_attention else None

    @property
    def length(self) -> int:
        """How many positions the decoder has processed: the position of the next token."""
        return self.self_attn[0].length if self.self_attn else 0

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` in every layer."""
        for cache in self.self_attn + (self.cross_attn or []):
            cache.reorder(index)
