"""Sliding-window (local) attention: each query attends only to the ``window`` keys nearest to it.

Causal: query ``i`` sees keys ``i - window + 1 .. i``. Bidirectional: ``window`` keys centred on
``i`` (``i - window // 2 .. i + (window - 1) // 2``). Cost and memory are ``O(n * window)``: the
sequence is cut into blocks of ``P >= window / 2`` queries, and each block attends only to its own
and its neighbouring key blocks (the n x n score matrix is never formed). The reference is the full
formula with a band mask (:func:`local_attention_reference`), which the tests compare against.

For generation, :class:`RingBufferCache` keeps only the last ``window`` keys and values, so the
memory of a sequence stays constant however long it grows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from aiayn.nn.attention import scaled_dot_product_attention

GROUP_QUERIES = 256  # queries per recomputed group when training on long sequences

__all__ = ["RingBufferCache", "local_attention", "local_attention_reference", "window_mask", "window_sides"]


def window_sides(window: int, causal: bool) -> tuple[int, int]:
    """How many keys a query sees to its left and to its right (itself excluded): they sum to ``window - 1``."""
    if window < 1:
        raise ValueError(f"window must be a positive integer, got {window}")
    if causal:
        return window - 1, 0
    left = window // 2
    return left, window - 1 - left


def window_mask(q_len: int, k_len: int, window: int, *, causal: bool, device: torch.device | None = None) -> Tensor:
    """``(T, S)`` bool band mask, ``True`` = may attend, aligned to the lower right like :func:`causal_mask`."""
    left, right = window_sides(window, causal)
    query = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)  # (T, 1): position among the keys
    diff = torch.arange(k_len, device=device)[None, :] - query  # (T, S): key position - query position
    return (diff >= -left) & (diff <= right)


def local_attention_reference(
    q: Tensor, k: Tensor, v: Tensor, *, window: int, causal: bool, key_mask: Tensor | None = None,
    backend: str = "sdpa", return_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """The full softmax attention under a band mask: ``O(n^2)``, the reference for the blocked kernel.

    ``key_mask``: ``(B|1, S)`` bool, ``True`` = real key. Returns ``(out (B, H, T, Dv), weights or None)``.
    """
    mask = window_mask(q.shape[2], k.shape[2], window, causal=causal, device=q.device)[None, None]  # (1, 1, T, S)
    if key_mask is not None:
        mask = mask & key_mask[:, None, None, :]
    return scaled_dot_product_attention(q, k, v, mask=mask, backend=backend, return_weights=return_weights)


def local_attention(
    q: Tensor, k: Tensor, v: Tensor, *, window: int, causal: bool, key_mask: Tensor | None = None,
    dropout_p: float = 0.0, block: int | None = None,
) -> Tensor:
    """Blocked sliding-window attention of ``q (B, H, n, D)`` over ``k, v (B, Hkv, n, D|Dv)`` -> ``(B, H, n, Dv)``.

    ``key_mask``: ``(B|1, n)`` bool, ``True`` = real key. A query with no key in its window gets
    zeros (and zero gradients). ``block``: queries per block (default: a quarter of the window's
    longer side, at least 16, at most ``n``); a block sees the window rounded up to whole blocks,
    plus its own block.
    """
    batch, heads, n, head_dim = q.shape
    kv_heads = k.shape[1]
    if k.shape[2] != n or v.shape[2] != n:
        raise ValueError(f"local_attention attends a sequence to itself: q, k, v need one length, got {q.shape[2]}, {k.shape[2]}, {v.shape[2]}")
    if heads % kv_heads:
        raise ValueError(f"local_attention: query heads {heads} must be a multiple of key/value heads {kv_heads}")
    left, right = window_sides(window, causal)
    if n == 0:
        return q.new_zeros(batch, heads, 0, v.shape[-1])
    if heads != kv_heads:  # grouped-query: each key/value head serves H / Hkv query heads
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
    longer = max(left, right)
    size = min(max(-(-longer // 4), 16), n) if block is None else block  # about a quarter of the window: little waste
    if size < 1:
        raise ValueError(f"block must be >= 1, got {size}")
    before = -(-left // size)  # key blocks to the left of a query block that the window can reach
    after = -(-right // size)
    n_blocks = -(-n // size)
    reach = before + after  # key blocks a query block needs beyond its own
    valid = torch.ones(1, n, dtype=torch.bool, device=q.device) if key_mask is None else key_mask  # (B|1, n)
    # Which (query, key) offsets are inside the window: the same (P, span) band for every block.
    row = torch.arange(size, device=q.device)[:, None]  # query offset in its block
    col = torch.arange((reach + 1) * size, device=q.device)[None, :] - before * size  # key offset from the block start
    band = (col - row >= -left) & (col - row <= right)
    half = q.dtype in (torch.float16, torch.bfloat16)

    def attend_blocks(q_g: Tensor, k_g: Tensor, v_g: Tensor, valid_g: Tensor, pad_q: int, pad_lo: int, pad_hi: int) -> Tensor:
        """A run of ``m`` query blocks over the keys they can see. The zero padding at both ends (never
        attended: its validity is False) is added here, so only one run's padded copies exist at a time."""
        q_g = F.pad(q_g * head_dim**-0.5, (0, 0, 0, pad_q))  # scaled by 1/sqrt(d_k) here: n*D work, not n*span
        k_g, v_g = (F.pad(x, (0, 0, pad_lo, pad_hi)) for x in (k_g, v_g))  # (B, H, (m + reach) P, D)
        valid_g = F.pad(valid_g, (pad_lo, pad_hi), value=False)
        m = q_g.shape[2] // size

        def neighbours(x: Tensor) -> Tensor:  # (..., (m + reach) P, E) -> (..., m, span, E), blocks side by side
            blocks = x.reshape(*x.shape[:-2], m + reach, size, x.shape[-1])
            return torch.cat([blocks[..., o : o + m, :, :] for o in range(reach + 1)], dim=-2)

        scores = q_g.view(batch, heads, m, size, head_dim) @ neighbours(k_g).transpose(-1, -2)  # (B, H, m, P, span)
        allowed = band[None] & neighbours(valid_g[..., None])[..., None, :, 0]  # (B|1, m, P, span)
        has_key = allowed.any(dim=-1, keepdim=True)
        allowed = (allowed | ~has_key)[:, None]  # empty rows attend anywhere, then are zeroed
        scores = scores.masked_fill(~allowed, float("-inf"))
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32 if half else None).to(q.dtype)
        if dropout_p > 0.0:
            weights = F.dropout(weights, p=dropout_p)
        out = (weights @ neighbours(v_g)).masked_fill(~has_key[:, None], 0.0)  # (B, H, m, P, Dv)
        return out.reshape(batch, heads, m * size, v.shape[-1])

    # Training on long sequences: runs of blocks, each recomputed in the backward pass (activation
    # checkpointing), so that only one run's scores exist at a time: memory O(n D), like the fused
    # SDPA kernel, instead of O(n w).
    training = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    step = max(1, GROUP_QUERIES // size) if training else n_blocks
    outs = []
    for first in range(0, n_blocks, step):
        last = min(first + step, n_blocks)
        start, end = (first - before) * size, (last + after) * size  # the keys this run of blocks can see
        keys = slice(max(start, 0), min(end, n))
        args = (q[:, :, first * size : last * size], k[:, :, keys], v[:, :, keys], valid[:, keys],
                max(0, last * size - n), max(0, -start), end - min(end, n))
        outs.append(attend_blocks(*args) if step >= n_blocks else checkpoint(attend_blocks, *args, use_reentrant=False))
    return (outs[0] if len(outs) == 1 else torch.cat(outs, dim=2))[:, :, :n]  # drop the padded queries


class RingBufferCache:
    """The last ``window`` keys and values ``(B, Hkv, window, D)`` of one local-attention layer.

    New keys overwrite the oldest in place, so memory per sequence is constant. ``length`` counts
    every position processed (the position of the next token), as with :class:`LayerCache`.
    """

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"window must be a positive integer, got {window}")
        self.window = window
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.length = 0

    @property
    def filled(self) -> bool:
        return self.k is not None

    def recent(self) -> tuple[Tensor, Tensor] | None:
        """The cached keys and values, oldest first, ``(B, Hkv, min(length, window), D)``; ``None`` when empty."""
        if self.k is None or self.v is None:
            return None
        count = min(self.length, self.window)
        index = (torch.arange(count, device=self.k.device) + self.length - count) % self.window
        return self.k.index_select(2, index), self.v.index_select(2, index)

    def append(self, k: Tensor, v: Tensor) -> None:
        """Write ``k, v (B, Hkv, T, D)`` over the oldest slots (only the last ``window`` of them matter)."""
        steps = k.shape[2]
        if self.k is None:
            self.k = k.new_zeros(k.shape[0], k.shape[1], self.window, k.shape[3])
            self.v = v.new_zeros(v.shape[0], v.shape[1], self.window, v.shape[3])
        keep = min(steps, self.window)
        index = (torch.arange(steps - keep, steps, device=k.device) + self.length) % self.window
        self.k[:, :, index] = k[:, :, steps - keep :]
        self.v[:, :, index] = v[:, :, steps - keep :]  # type: ignore[index]
        self.length += steps

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search)."""
        if self.k is not None and self.v is not None:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)
