"""Key/value caches for incremental decoding: each step attends to what earlier steps computed."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["LayerCache", "KVCache", "StaticLayerCache", "StaticKVCache"]


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

    def __init__(
        self, n_layers: int, *, cross_attention: bool = False, max_len: int | None = None, self_caches: list | None = None
    ) -> None:
        # self_caches: the layers' own kinds (a ring buffer for local attention, a state for linear attention or an SSM)
        self.self_attn = self_caches if self_caches is not None else [LayerCache(max_len) for _ in range(n_layers)]
        self.cross_attn = [LayerCache() for _ in range(n_layers)] if cross_attention else None

    @property
    def length(self) -> int:
        """How many positions the decoder has processed: the position of the next token."""
        return self.self_attn[0].length if self.self_attn else 0

    def reorder(self, index: Tensor, *, self_only: bool = False) -> None:
        """Keep batch rows ``index`` in every layer (``self_only``: leave the cross-attention caches,
        when every row keeps its source and so its encoder keys and values)."""
        for cache in self.self_attn + ([] if self_only else (self.cross_attn or [])):
            cache.reorder(index)


class StaticLayerCache:
    """Keys and values of one self-attention layer in fixed ``(B, Hkv, S_max, D)`` buffers (gpt-fast).

    ``append`` writes the new step at the columns in ``write_at`` (a tensor set by the caller
    before each forward) and returns the whole buffers, so every step has the same shapes (one
    ``torch.compile`` graph for all steps); the caller's mask hides the columns not written yet.
    """

    def __init__(self, batch: int, kv_heads: int, max_len: int, head_dim: int, *, dtype: torch.dtype, device: torch.device) -> None:
        self.k = torch.zeros(batch, kv_heads, max_len, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.write_at = torch.zeros(1, dtype=torch.long, device=device)  # (T,) columns of the next append

    filled = True  # never a cross-attention cache: the property only matters there

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write ``k, v (B, Hkv, T, D)`` at columns ``write_at (T,)``; return the full buffers."""
        self.k.index_copy_(2, self.write_at, k.to(self.k.dtype))
        self.v.index_copy_(2, self.write_at, v.to(self.v.dtype))
        return self.k, self.v

    def reorder(self, index: Tensor) -> None:
        self.k = self.k.index_select(0, index)
        self.v = self.v.index_select(0, index)


class StaticKVCache:
    """The static caches of a decoder-only stack; ``write_at`` is shared by every layer."""

    def __init__(self, n_layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int, *, dtype: torch.dtype, device: torch.device) -> None:
        self.max_len = max_len
        self.self_attn = [StaticLayerCache(batch, kv_heads, max_len, head_dim, dtype=dtype, device=device) for _ in range(n_layers)]
        self.cross_attn = None

    def set_write_columns(self, columns: Tensor) -> None:
        """Where the next forward's ``T`` tokens go, ``columns (T,)``, in every layer."""
        for layer in self.self_attn:
            layer.write_at = columns

    def reorder(self, index: Tensor, *, self_only: bool = False) -> None:
        for layer in self.self_attn:  # no cross-attention here: self_only changes nothing
            layer.reorder(index)
