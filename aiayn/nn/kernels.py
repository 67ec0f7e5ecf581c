"""The self-attention kernel, picked by name: ``softmax`` (the paper), ``local`` (sliding window), ``linear``.

A kernel takes the heads' queries, keys and values ``(B, H|Hkv, T, D)`` of the new positions and
returns ``(out (B, H, T, Dv), weights or None)``. It owns its generation cache, because each variant
remembers something different: ``softmax`` every key and value (:class:`LayerCache`, or
:class:`StaticLayerCache` preallocated), ``local`` the last ``window`` of them (:class:`RingBufferCache`),
``linear`` a fixed-size state (:class:`LinearAttentionState`); all are :class:`~aiayn.nn.cache.CacheLayer`. Cross-attention is always softmax (see :class:`MultiHeadAttention`).

Masks follow :mod:`aiayn.nn.masks` (bool, ``True`` = may attend). ``local`` and ``linear`` take a
key padding mask only, ``(B|1, 1, 1, S)``: they never form a ``(T, S)`` matrix to mask.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor

from aiayn.nn.attention import scaled_dot_product_attention
from aiayn.nn.cache import CacheLayer, LayerCache, StaticLayerCache
from aiayn.nn.linear_attention import (
    LinearAttentionState,
    causal_linear_attention,
    linear_attention,
)
from aiayn.nn.local_attention import (
    RingBufferCache,
    local_attention,
    local_attention_reference,
)

__all__ = ["ATTENTION_KINDS", "AttentionKernel", "LinearKernel", "LocalKernel", "SoftmaxKernel", "build_kernel"]

ATTENTION_KINDS: tuple[str, ...] = ("softmax", "local", "linear")

BiasFn = Callable[[int, int], "Tensor | None"]  # (T, S) -> additive score bias, from the positions (ALiBi)


class AttentionKernel(Protocol):
    name: str

    def __call__(
        self, q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, causal: bool, cache: CacheLayer | None,
        bias: BiasFn | None, dropout_p: float, backend: str, return_weights: bool,
    ) -> tuple[Tensor, Tensor | None]: ...

    def new_cache(self, max_len: int | None = None) -> CacheLayer:
        """An empty cache of this kernel's kind (``max_len``: preallocated where the kind grows)."""
        ...


class SoftmaxKernel:
    """``softmax(Q K^T / sqrt(d_k)) V`` over every key (section 3.2.1), with a growing or a static KV cache."""

    name = "softmax"

    def __call__(
        self, q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, causal: bool, cache: CacheLayer | None,
        bias: BiasFn | None, dropout_p: float, backend: str, return_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        if cache is not None:
            if not isinstance(cache, (LayerCache, StaticLayerCache)):
                raise _wrong_cache(cache, self.name)
            k, v, mask, causal = cache.update(k, v, mask, causal)  # (B, Hkv, S, Dh): all positions so far
            if k.dtype != q.dtype:  # a KV cache kept in another dtype (cache.KV_DTYPES): attend in the queries'
                k, v = k.to(q.dtype), v.to(q.dtype)
        return scaled_dot_product_attention(
            q, k, v, mask=mask, bias=bias(q.shape[2], k.shape[2]) if bias is not None else None, causal=causal,
            dropout_p=dropout_p, backend=backend, return_weights=return_weights,
        )

    def new_cache(self, max_len: int | None = None) -> LayerCache | StaticLayerCache:
        return LayerCache() if max_len is None else StaticLayerCache(max_len)


class LocalKernel:
    """Sliding-window attention (blocked, ``O(n w)``); generation keeps a ring buffer of ``window`` keys."""

    name = "local"

    def __init__(self, window: int) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be a positive integer for attention='local', got {window!r}")
        self.window = window

    def __call__(
        self, q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, causal: bool, cache: CacheLayer | None,
        bias: BiasFn | None, dropout_p: float, backend: str, return_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        _no_bias(bias, self.name)
        if cache is not None and not isinstance(cache, RingBufferCache):
            raise _wrong_cache(cache, self.name)
        q_len = q.shape[2]
        if cache is not None:
            if not causal:
                raise ValueError("a generation cache needs causal attention (attention='local' in a decoder)")
            if q_len == 1 and not return_weights:
                # One new token sees exactly the buffer after it is written: the last `window` keys.
                # Their order in the ring does not matter (softmax sums over a set; positions are
                # already in the keys), so no reordering and no band mask.
                cache.append(k, v)
                slots = cache.slot_mask(_key_padding(mask, cache.length, self.name))
                out, _ = scaled_dot_product_attention(
                    q, cache.k, cache.v, mask=None if slots is None else slots[:, None, None, :], backend=backend,  # type: ignore[arg-type]
                )
                return out, None
            recent = cache.recent()
            cache.append(k, v)
            if recent is not None:  # keys: the buffer's last few, then the new ones
                k, v = (_cat(recent[0], k), _cat(recent[1], v))
        key_mask = _key_padding(mask, k.shape[2], self.name)
        if return_weights or q_len == 1 or k.shape[2] != q_len:
            # The reference: weights to show, or a few queries over a short buffer (at most window + T keys).
            out, weights = local_attention_reference(
                q, k, v, window=self.window, causal=causal, key_mask=key_mask,
                backend="math" if return_weights else backend, return_weights=return_weights,
            )
            return out, weights
        return local_attention(q, k, v, window=self.window, causal=causal, key_mask=key_mask, dropout_p=dropout_p), None

    def new_cache(self, max_len: int | None = None) -> RingBufferCache:
        return RingBufferCache(self.window)  # constant size: max_len does not matter


class LinearKernel:
    """Linear attention with ``phi = elu + 1``; generation carries a ``(D x Dv)`` state per head."""

    name = "linear"

    def __init__(self, chunk: int = 64) -> None:
        self.chunk = chunk

    def __call__(
        self, q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, causal: bool, cache: CacheLayer | None,
        bias: BiasFn | None, dropout_p: float, backend: str, return_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        if cache is not None and not isinstance(cache, LinearAttentionState):
            raise _wrong_cache(cache, self.name)
        if return_weights:
            raise ValueError(
                "return_weights=True: attention='linear' has no attention weights to return "
                "(it never forms the T x S matrix); use attention='softmax' or 'local' to look at weights"
            )
        _no_bias(bias, self.name)
        key_mask = _key_padding(mask, k.shape[2] if cache is None else cache.length + k.shape[2], self.name)
        if key_mask is not None and cache is not None:
            key_mask = key_mask[:, cache.length :]  # the earlier keys are already in the state
        if not causal:
            if cache is not None:
                raise ValueError("a generation cache needs causal attention (attention='linear' in a decoder)")
            return linear_attention(q, k, v, key_mask=key_mask), None
        state = cache.state if cache is not None else None
        out, new_state = causal_linear_attention(q, k, v, key_mask=key_mask, state=state, chunk=self.chunk)
        if cache is not None:
            cache.state, cache.length = new_state, cache.length + q.shape[2]
        return out, None

    def new_cache(self, max_len: int | None = None) -> LinearAttentionState:
        return LinearAttentionState()  # constant size: max_len does not matter


def build_kernel(attention: str, *, window: int | None = None) -> AttentionKernel:
    """The kernel named ``attention``; raises ``ValueError`` for an unknown name (listing the choices)
    or a ``window`` that does not fit it."""
    if attention not in ATTENTION_KINDS:
        raise ValueError(f"attention must be one of {ATTENTION_KINDS}, got {attention!r}")
    if attention != "local" and window is not None:
        raise ValueError(f"window={window!r} needs attention='local', got attention={attention!r}")
    if attention == "local":
        if window is None:
            raise ValueError("attention='local' needs a window (how many keys each query sees), got window=None")
        return LocalKernel(window)
    if attention == "linear":
        return LinearKernel()
    return SoftmaxKernel()


def _wrong_cache(cache: object, name: str) -> TypeError:
    return TypeError(f"attention={name!r} got a {type(cache).__name__} as its cache; build caches with model.new_cache()")


def _cat(old: Tensor, new: Tensor) -> Tensor:
    return torch.cat([old, new], dim=2)  # along the positions


def _no_bias(bias: BiasFn | None, name: str) -> None:
    if bias is not None and bias(1, 1) is not None:  # rotary/sinusoidal positions give no bias
        raise ValueError(f"attention={name!r} cannot add a score bias (positions='alibi'); use rotary, sinusoidal or learned positions")


def _key_padding(mask: Tensor | None, k_len: int, name: str) -> Tensor | None:
    """``(B|1, 1, 1, S)`` or ``(B|1, S)`` key padding mask -> ``(B|1, S)`` (the last ``k_len`` keys); ``None`` stays."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"attention mask must be a torch.bool tensor (True = may attend), got {got}")
    if mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[2] == 1:
        mask = mask[:, 0, 0]
    if mask.dim() != 2 or mask.shape[-1] < k_len:
        raise ValueError(
            f"attention={name!r} takes a key padding mask of shape (B, 1, 1, S) with S >= {k_len}, "
            f"got shape {tuple(mask.shape)}"
        )
    return mask[:, mask.shape[-1] - k_len :]
