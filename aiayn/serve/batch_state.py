"""The running batch of continuous batching: decoder states that join, leave and split, row by row.

A decoder-only batch is one :class:`~aiayn.decoding.protocol.DecodeState` whose rows are
left-padded to a common width (the layout :class:`~aiayn.decoding.adapters.CausalLMDecoder` already
decodes exactly: column ``c`` of row ``b`` is position ``c - pads[b]``, padding masked). A new
request is prefilled alone and joins by left-padding the shorter side (its KV cache included); a
finished one leaves by ``select``; columns that are padding in every row are trimmed.

A state without a cache (a sequence past learned positions: the decoder re-encodes a sliding window
every step) joins by its tokens alone, and the joined batch goes on without a cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.decoding.protocol import DecodeState
from aiayn.nn.cache import KVCache, LayerCache

__all__ = ["join", "restore", "snapshot", "subset", "trim"]


def joinable(cache: KVCache) -> bool:
    """Whether rows with this kind of cache can join and leave a batch: growing full-attention
    key/value caches only (a ring buffer or a recurrent state would need its own surgery)."""
    return cache.cross_attn is None and all(type(layer) is LayerCache and layer.max_len is None for layer in cache.self_attn)


def join(a: DecodeState, b: DecodeState, pad_id: int) -> DecodeState:
    """Rows of ``a`` then rows of ``b`` in one state, both left-padded to the wider one's width."""
    width = max(_width(a), _width(b))
    cached = a.cache is not None and b.cache is not None
    return DecodeState(
        tokens=torch.cat([_left(a.tokens, width, pad_id), _left(b.tokens, width, pad_id)]),
        mask=torch.cat([_left(a.mask, width, False), _left(b.mask, width, False)]),
        max_new_tokens=torch.cat([a.max_new_tokens, b.max_new_tokens]),
        pads=torch.cat([a.pads + width - _width(a), b.pads + width - _width(b)]),
        cache=_join_caches(_cache(a), _cache(b), width) if cached else None,
    )


def subset(state: DecodeState, index: Tensor) -> DecodeState:
    """A new state holding rows ``index`` (``state`` is left as it is)."""
    cache = None
    if state.cache is not None:
        cache = KVCache(len(_cache(state).self_attn))
        for new, old in zip(cache.self_attn, _cache(state).self_attn):
            _fill(new, old.k.index_select(0, index), old.v.index_select(0, index), old.length)
    return DecodeState(
        tokens=state.tokens.index_select(0, index), mask=state.mask.index_select(0, index),
        max_new_tokens=state.max_new_tokens.index_select(0, index), pads=state.pads.index_select(0, index), cache=cache,
    )


def trim(state: DecodeState) -> None:
    """Drop the leading columns that are padding in every row (after the longest row left)."""
    drop = int(state.pads.min())
    if drop == 0:
        return
    state.tokens, state.mask, state.pads = state.tokens[:, drop:], state.mask[:, drop:], state.pads - drop
    for layer in _cache(state).self_attn if state.cache is not None else ():
        _fill(layer, layer.k[:, :, drop:], layer.v[:, :, drop:], layer.length - drop)


def snapshot(state: DecodeState) -> tuple[Tensor, Tensor, list[tuple[Tensor | None, Tensor | None, int]]]:
    """What a step changes, to undo a step that raised halfway (a dynamic cache appends by ``torch.cat``,
    so the old tensors are untouched and keeping references is enough)."""
    layers = _cache(state).self_attn if state.cache is not None and joinable(state.cache) else ()  # else: nothing to undo by
    return state.tokens, state.mask, [(layer.k, layer.v, layer.length) for layer in layers]


def restore(state: DecodeState, saved: tuple[Tensor, Tensor, list[tuple[Tensor | None, Tensor | None, int]]]) -> None:
    state.tokens, state.mask, layers = saved
    for layer, (k, v, length) in zip(_cache(state).self_attn if state.cache is not None else (), layers):
        layer.k, layer.v, layer.length = k, v, length


def _width(state: DecodeState) -> int:
    return state.tokens.shape[1]


def _cache(state: DecodeState) -> KVCache:
    if state.cache is None or state.cache.cross_attn is not None:
        raise ValueError("continuous batching needs a decoder-only state with a KV cache")
    return state.cache


def _left(x: Tensor, width: int, value: int | bool) -> Tensor:
    """``x (B, L)`` left-padded with ``value`` to ``(B, width)``."""
    return F.pad(x, (width - x.shape[1], 0), value=value)


def _join_caches(a: KVCache, b: KVCache, width: int) -> KVCache:
    joined = KVCache(len(a.self_attn))
    for new, la, lb in zip(joined.self_attn, a.self_attn, b.self_attn):
        if la.max_len is not None or lb.max_len is not None:
            raise ValueError("continuous batching joins dynamic caches only (static_cache=False)")
        # (B, Hkv, L, D): zeros on the left of the time axis; the padding mask hides them.
        k = torch.cat([F.pad(la.k, (0, 0, width - la.length, 0)), F.pad(lb.k, (0, 0, width - lb.length, 0))])
        v = torch.cat([F.pad(la.v, (0, 0, width - la.length, 0)), F.pad(lb.v, (0, 0, width - lb.length, 0))])
        _fill(new, k, v, width)
    return joined


def _fill(layer: LayerCache, k: Tensor, v: Tensor, length: int) -> None:
    layer.k, layer.v, layer.length = k, v, length
