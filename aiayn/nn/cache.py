"""Generation caches: what each kind of layer remembers between decoding steps, behind one protocol.

As in Hugging Face's ``cache_utils``, every cache is a :class:`CacheLayer`, one class per need:
:class:`LayerCache` (keys and values that grow; cross-attention fills it once), :class:`StaticLayerCache`
(preallocated, fixed shapes for ``torch.compile``), :class:`~aiayn.nn.local_attention.RingBufferCache`
(local attention's last ``window``), and the constant-size states of linear attention and the SSM
(:class:`~aiayn.nn.linear_attention.LinearAttentionState`, :class:`~aiayn.nn.ssm.SSMState`).
The two key/value caches share ``update(k, v, mask, causal)``, which the softmax kernel calls.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from aiayn.nn.masks import check_padding_mask

__all__ = ["CacheLayer", "KV_AUTO", "KV_DTYPES", "LayerCache", "StaticLayerCache", "KVCache"]

# The dtypes a KV cache (static or growing) may keep its keys and values in, whatever the activations' (read widened
# where they differ): bf16 under fp32 activations halves the bytes a decoding step reads from the cache (llama.cpp keeps
# fp16 by default).
KV_DTYPES = (torch.float32, torch.bfloat16)
KV_AUTO = "auto"  # a decoder's kv_dtype: the one chosen for its model (aiayn.decoding.adapters.auto_kv_dtype)


class CacheLayer(Protocol):
    """One layer's generation cache."""

    @property
    def length(self) -> int:
        """Positions processed so far: the position of the next token."""
        ...

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search reorders hypotheses every step)."""
        ...


class LayerCache:
    """Keys and values ``(B, Hkv, S, D)`` that grow by each step's (``torch.cat``); cross-attention fills
    it once from the encoder output (:meth:`set`) and then only reads it."""

    max_len = None  # it grows: no preallocated size (see StaticLayerCache)

    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.length = 0
        # the tensors' dtype: None, the first keys'; else one of KV_DTYPES (set before the first write, and checked, by
        # CausalLMDecoder's kv_dtype); later keys take the held ones' dtype
        self.dtype: torch.dtype | None = None

    @property
    def filled(self) -> bool:
        return self.k is not None

    def update(self, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> tuple[Tensor, Tensor, Tensor | None, bool]:
        """Add ``k, v (B, Hkv, T, D)`` after the cached ones, in the cache's dtype; attend over all of them (the mask
        covers them all)."""
        dtype = self.k.dtype if self.k is not None else self.dtype or k.dtype
        k, v = k.to(dtype), v.to(dtype)
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        self.length += k.shape[2]
        return self.k, self.v, mask, causal

    def allocate(self, batch: int, heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        """Empty keys and values ``(batch, heads, 0, head_dim)`` before the first :meth:`update` (which adds to them as it
        would have started with its own): the C++ decoding step appends a prompt's to them (aiayn.decoding.native_step)."""
        if self.k is None or self.v is None:
            self.k = torch.zeros(batch, heads, 0, head_dim, dtype=self.dtype or dtype, device=device)
            self.v = torch.zeros_like(self.k)

    def set(self, k: Tensor, v: Tensor) -> None:
        """Store cross-attention keys/values computed once from the encoder output."""
        self.k, self.v, self.length = k, v, k.shape[2]

    def reorder(self, index: Tensor) -> None:
        _keep_rows(self, index)

    def crop(self, length: int) -> None:
        """Forget every position from ``length`` on (speculative decoding drops its rejected drafts)."""
        _check_crop(length, self.length)
        if self.k is not None and self.v is not None:
            self.k, self.v = self.k[:, :, :length], self.v[:, :, :length]
        self.length = length


class StaticLayerCache:
    """Keys and values of one self-attention layer in ``(B, Hkv, max_len, D)`` buffers (gpt-fast), allocated
    by the first :meth:`update`. The next column is a tensor advanced in place, so a step has fixed buffers
    and a compiled step reads nothing back to the host.

    Attention reads only the columns filled so far: eagerly on the CPU, where the filled length is a cheap
    host read, ``update`` returns the filled part as the growing cache does; elsewhere (compiled, or on a
    device where a host read would wait for it) it returns the first ``mask.shape[-1]`` columns (all
    ``max_len`` without a mask) and a mask hiding, for each query, the columns after its own. A compiled
    decoder passes a padding mask as wide as the filled part, its width marked dynamic, so one graph
    serves every length (see :class:`~aiayn.decoding.adapters.CausalLMDecoder`)."""

    def __init__(self, max_len: int) -> None:
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
            raise ValueError(f"max_len must be a positive integer for a static cache, got {max_len!r}")
        self.max_len = max_len
        # the buffers' dtype: None, the first keys'; else one of KV_DTYPES (set before the first write, and checked, by
        # CausalLMDecoder's kv_dtype)
        self.dtype: torch.dtype | None = None
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.next_column = torch.zeros(1, dtype=torch.long)

    @property
    def length(self) -> int:
        return int(self.next_column)  # a host read: for eager callers only

    def allocate(self, batch: int, heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        """The buffers ``(batch, heads, max_len, head_dim)``, once: by the first :meth:`update`, or before it where the C++
        decoding step writes a prompt's keys and values into them (aiayn.decoding.native_step)."""
        if self.k is None or self.v is None:
            self.k = torch.zeros(batch, heads, self.max_len, head_dim, dtype=self.dtype or dtype, device=device)
            self.v = torch.zeros_like(self.k)
            self.next_column = self.next_column.to(device)

    def update(self, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> tuple[Tensor, Tensor, Tensor | None, bool]:
        """Write ``k, v (B, Hkv, T, D)`` at the next ``T`` columns; return the keys and values to attend over
        (``(B, Hkv, S, D)``, ``S`` the filled length or, see above, the mask's width) with their mask and
        causal flag. ``mask``: a padding mask ``(B|1, 1, T|1, W)`` over the first ``W <= max_len`` columns.

        Raises ``ValueError`` (eagerly on the CPU) when the ``T`` columns do not fit ``max_len``."""
        self.allocate(k.shape[0], k.shape[1], k.shape[3], k.dtype, k.device)  # the first write: buffers of k's kind
        assert self.k is not None and self.v is not None
        if k.device.type == "cpu" and not torch.compiler.is_compiling():
            start = int(self.next_column)
            end = start + k.shape[2]
            if end > self.max_len:
                raise ValueError(f"static cache holds max_len={self.max_len} positions, asked for {end}")
            self.k.narrow(2, start, end - start).copy_(k)  # narrow: one op, where indexing by slices takes several
            self.v.narrow(2, start, end - start).copy_(v)
            self.next_column.fill_(end)
            return self.k.narrow(2, 0, end), self.v.narrow(2, 0, end), None if mask is None else mask[..., :end], causal
        columns = self.next_column + torch.arange(k.shape[2], device=k.device)  # (T,)
        self.k.index_copy_(2, columns, k.to(self.k.dtype))
        self.v.index_copy_(2, columns, v.to(self.v.dtype))
        self.next_column.add_(k.shape[2])
        width = self.k.shape[2] if mask is None else mask.shape[-1]  # the buffers' shape, not max_len: a graph need not specialise on it
        visible = (torch.arange(width, device=k.device)[None, :] <= columns[:, None])[None, None]  # (1, 1, T, W)
        return self.k[:, :, :width], self.v[:, :, :width], visible if mask is None else mask & visible, False

    def reorder(self, index: Tensor) -> None:
        _keep_rows(self, index)

    def crop(self, length: int) -> None:
        """Forget every position from ``length`` on: the next write goes there (later columns are hidden by ``update``)."""
        _check_crop(length, self.length)
        self.next_column.fill_(length)


class KVCache:
    """The caches of a whole decoder: one per layer for self-attention (the kind each layer keeps),
    and for cross-attention if any."""

    def __init__(self, n_layers: int, *, cross_attention: bool = False, self_caches: list[CacheLayer] | None = None) -> None:
        self.self_attn: list = self_caches if self_caches is not None else [LayerCache() for _ in range(n_layers)]
        self.cross_attn = [LayerCache() for _ in range(n_layers)] if cross_attention else None

    @property
    def length(self) -> int:
        """How many positions the decoder has processed: the position of the next token."""
        return self.self_attn[0].length if self.self_attn else 0

    def check_padding_mask(self, mask: Tensor, batch: int, new: int, name: str) -> None:
        """Raise ``TypeError``/``ValueError`` unless ``mask`` is a bool ``(B, S)`` padding mask over the positions
        so far, the ``new`` ones included: ``S = length + new``; with a static cache ``S <= max_len`` (its first
        ``S`` columns, at least those filled so far: the cache hides the unfilled ones itself, and reading its
        length would wait for a device)."""
        check_padding_mask(mask, name)
        static = self.self_attn[0] if self.self_attn and isinstance(self.self_attn[0], StaticLayerCache) else None
        if static is not None:
            max_len = static.max_len if static.k is None else static.k.shape[2]  # the buffers' shape: a graph need not specialise on it
            if mask.shape[0] != batch or mask.shape[1] > max_len:
                raise ValueError(f"{name} must have shape ({batch}, S) with S <= the static cache's max_len={max_len}, got {tuple(mask.shape)}")
        if static is None and tuple(mask.shape) != (batch, self.length + new):
            raise ValueError(f"{name} must have shape {(batch, self.length + new)} (every position so far), got {tuple(mask.shape)}")

    def reorder(self, index: Tensor, *, self_only: bool = False) -> None:
        """Keep batch rows ``index`` in every layer (``self_only``: leave the cross-attention caches,
        when every row keeps its source and so its encoder keys and values)."""
        for cache in self.self_attn + ([] if self_only else (self.cross_attn or [])):
            cache.reorder(index)

    @property
    def croppable(self) -> bool:
        """Whether every self-attention cache can roll back (:meth:`crop`); a ring buffer and recurrent states cannot."""
        return all(callable(getattr(cache, "crop", None)) for cache in self.self_attn)

    def crop(self, length: int) -> None:
        """Roll every self-attention cache back to its first ``length`` positions (cross-attention keeps the source).

        Raises ``ValueError`` for a cache that cannot roll back (see :attr:`croppable`) or a length out of range."""
        if not self.croppable:
            kinds = sorted({type(cache).__name__ for cache in self.self_attn if not callable(getattr(cache, "crop", None))})
            raise ValueError(f"cannot crop a {', '.join(kinds)}: only key/value caches (LayerCache, StaticLayerCache) roll back")
        for cache in self.self_attn:
            cache.crop(length)


def _keep_rows(cache: LayerCache | StaticLayerCache, index: Tensor) -> None:
    """Keep batch rows ``index`` of a key/value cache (beam search)."""
    if cache.k is not None and cache.v is not None:
        cache.k, cache.v = cache.k.index_select(0, index), cache.v.index_select(0, index)


def _check_crop(length: int, current: int) -> None:
    if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= current:
        raise ValueError(f"crop length={length!r} must be an integer in [0, {current}] (the positions cached)")
