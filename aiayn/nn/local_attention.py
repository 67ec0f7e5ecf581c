"""Sliding-window (local) attention: each query attends only to the ``window`` keys nearest to it.

Causal: query ``i`` sees keys ``i - window + 1 .. i``. Bidirectional: ``window`` keys centred on
``i`` (``i - window // 2 .. i + (window - 1) // 2``). Cost and memory are ``O(n * window)``: the
sequence is cut into blocks of ``P`` queries (about half the window), and each block attends only
to its own and its neighbouring key blocks (the n x n score matrix is never formed). The blocks are
handed to PyTorch's fused attention kernel as if they were heads, with one band mask, so their
scores are not stored either. The reference is the full formula with a band mask
(:func:`local_attention_reference`), which the tests compare against.

For generation, :class:`RingBufferCache` keeps only the last ``window`` keys and values, so the
memory of a sequence stays constant however long it grows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from aiayn.nn.attention import repeat_kv, scaled_dot_product_attention

GROUP_QUERIES = 1024  # queries per recomputed group when training on long sequences

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
    zeros (and zero gradients). ``block``: queries per block (default: half the window's longer
    side, at least 16, at most ``n``); a block sees the window rounded up to whole blocks, plus its
    own block. Each block is one "head" of PyTorch's fused attention kernel with a band mask, so
    the scores are never stored.
    """
    batch, heads, n, head_dim = q.shape
    if k.shape[2] != n or v.shape[2] != n:
        raise ValueError(f"local_attention attends a sequence to itself: q, k, v need one length, got {q.shape[2]}, {k.shape[2]}, {v.shape[2]}")
    k, v = repeat_kv(k, v, heads)
    left, right = window_sides(window, causal)
    if n == 0:
        return q.new_zeros(batch, heads, 0, v.shape[-1])
    longer = max(left, right)
    size = min(max(-(-longer // 2), 16), n) if block is None else block  # half the window: a third of the keys wasted
    if size < 1:
        raise ValueError(f"block must be >= 1, got {size}")
    before = -(-left // size)  # key blocks to the left of a query block that the window can reach
    after = -(-right // size)
    reach = before + after  # key blocks a query block needs beyond its own
    span = (reach + 1) * size  # keys a block of queries is scored against
    n_blocks = -(-n // size)
    # Training on long sequences: runs ("groups") of blocks, each recomputed in the backward pass
    # (activation checkpointing), so that only one group's intermediates exist at a time: memory
    # O(n D), like the fused SDPA kernel over the whole sequence.
    training = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    n_groups = -(-n_blocks // max(1, GROUP_QUERIES // size)) if training else 1
    group_len = -(-n_blocks // n_groups) * size  # queries per group, evened out so the last group wastes little
    valid = torch.ones(1, n, dtype=torch.bool, device=q.device) if key_mask is None else key_mask  # (B|1, n)
    row = torch.arange(size, device=q.device)[:, None]  # query offset in its block
    col = torch.arange(span, device=q.device)[None, :] - before * size  # key offset from the block start
    band = (col - row >= -left) & (col - row <= right)  # the same (P, span) band for every block

    def attend_blocks(q_g: Tensor, k_parts: list[Tensor], v_parts: list[Tensor], valid_parts: list[Tensor], pad_lo: int, pad_hi: int) -> Tensor:
        """One group of query blocks over the keys they can see (given in pieces, joined here, and
        padded at the sequence's ends with invalid zero keys, so that only one group's copy exists)."""
        m = -(-q_g.shape[2] // size)
        q_g = F.pad(q_g, (0, 0, 0, m * size - q_g.shape[2]))
        k_g, v_g = (F.pad(torch.cat(x, dim=2), (0, 0, pad_lo, pad_hi)) for x in (k_parts, v_parts))  # (B, H, (m + reach) P, E)
        valid_g = F.pad(torch.cat(valid_parts, dim=-1), (pad_lo, pad_hi), value=False)[..., None]

        def neighbours(x: Tensor) -> Tensor:  # (..., (m + reach) P, E) -> (..., m, span, E): overlapping views
            return x.as_strided((*x.shape[:-2], m, span, x.shape[-1]), (*x.stride()[:-2], size * x.stride(-2), x.stride(-2), 1))

        allowed = band & neighbours(valid_g)[..., None, :, 0]  # (B|1, m, P, span)
        has_key = allowed.any(dim=-1, keepdim=True)  # a padded query may see no key: attend anywhere, then zero
        mask = (allowed | ~has_key)[:, None]  # (B|1, 1, m, P, span)
        if mask.shape[0] > 1:
            mask = mask.expand(batch, heads, m, size, span)
        blocks = q_g.reshape(batch * heads, m, size, head_dim)  # the blocks become the heads of one SDPA call
        keys, values = (neighbours(x).reshape(batch * heads, m, span, x.shape[-1]) for x in (k_g, v_g))
        out = F.scaled_dot_product_attention(blocks, keys, values, attn_mask=mask.reshape(-1, m, size, span), dropout_p=dropout_p)
        out = out.view(batch, heads, m, size, -1)
        if not bool(has_key.all()):
            out = out.masked_fill(~has_key[:, None], 0.0)
        return out.reshape(batch, heads, m * size, v.shape[-1])

    # split (not slicing) cuts the sequence: its backward joins the gradients once, where each
    # slice of the whole sequence would allocate a full-size gradient.
    k_chunks, v_chunks, valid_chunks = k.split(group_len, dim=2), v.split(group_len, dim=2), valid.split(group_len, dim=-1)

    def pieces(chunks: tuple[Tensor, ...], start: int, end: int, axis: int) -> list[Tensor]:
        """Positions ``start .. end - 1`` (clipped to the sequence) along ``axis``, out of the chunks that hold them."""
        start, end = max(start, 0), min(end, n)
        found = []
        for i in range(start // group_len, (end - 1) // group_len + 1):  # the chunks that hold start .. end - 1
            lo, hi = max(start - i * group_len, 0), min(end - i * group_len, group_len)
            found.append(chunks[i].narrow(axis, lo, hi - lo))
        return found

    outs = []
    for index, q_g in enumerate(q.split(group_len, dim=2)):
        start = index * group_len - before * size  # the keys this group can see
        end = index * group_len + -(-q_g.shape[2] // size) * size + after * size
        args = (q_g, pieces(k_chunks, start, end, 2), pieces(v_chunks, start, end, 2), pieces(valid_chunks, start, end, 1),
                max(0, -start), max(0, end - n))
        outs.append(attend_blocks(*args) if n_groups == 1 else checkpoint(attend_blocks, *args, use_reentrant=False))
    return (outs[0] if n_groups == 1 else torch.cat(outs, dim=2))[:, :, :n]  # drop the padded queries


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

    def slot_mask(self, key_mask: Tensor | None) -> Tensor | None:
        """Which of the ``window`` slots hold a real key, ``(B|1, window)`` bool; ``None`` when all do.

        ``key_mask``: ``(B|1, length)`` bool over every position so far (``True`` = real key), or ``None``.
        """
        slots = torch.arange(self.window, device=self.k.device if self.k is not None else None)
        last = self.length - 1
        position = last - (last - slots) % self.window  # the newest position written to each slot; < 0: empty
        if key_mask is None:
            return None if self.length >= self.window else (position >= 0)[None]
        return key_mask[:, position.clamp(min=0)] & (position >= 0)

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
