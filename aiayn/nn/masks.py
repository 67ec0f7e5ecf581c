"""Attention masks: the one convention of the whole library.

**Convention: a mask is a boolean tensor and ``True`` means "may attend".** This is the polarity of
``torch.nn.functional.scaled_dot_product_attention``; ``torch.nn.MultiheadAttention`` uses the
opposite (``True`` = blocked), so convert with ``~mask`` when talking to it.

Shapes (legend: B batch, T query length, S key length, H heads):

* padding mask ``(B, S)``: ``True`` at real tokens, ``False`` at padding;
* causal mask ``(T, S)``: ``True`` where key ``j`` is not in the future of query ``i``;
* attention mask ``(B, 1, T, S)`` (or anything broadcastable to ``(B, H, T, S)``): what the
  attention kernel takes.

A query row with no ``True`` at all (a fully masked row, e.g. a padding query under a causal mask)
gives an all-zero attention output and zero gradients, in every backend and dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "padding_mask_from_lengths",
    "causal_mask",
    "attention_mask",
    "check_attention_mask",
]


def padding_mask_from_lengths(lengths: Tensor, max_len: int | None = None) -> Tensor:
    """``(B,)`` lengths -> ``(B, max_len)`` bool mask, ``True`` at the first ``lengths[b]`` positions.

    Raises ``ValueError`` for negative lengths or lengths above ``max_len``.
    """
    if lengths.dim() != 1:
        raise ValueError(f"lengths must have shape (B,), got shape {tuple(lengths.shape)}")
    if lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
        raise TypeError(f"lengths must be an integer tensor, got dtype {lengths.dtype}")
    longest = int(lengths.max()) if lengths.numel() else 0
    if lengths.numel() and int(lengths.min()) < 0:
        raise ValueError(f"lengths must be >= 0, got min {int(lengths.min())}")
    if max_len is None:
        max_len = longest
    elif longest > max_len:
        raise ValueError(f"lengths must be <= max_len={max_len}, got a length of {longest}")
    positions = torch.arange(max_len, device=lengths.device)
    return positions[None, :] < lengths[:, None]  # (B, S)


def causal_mask(q_len: int, k_len: int | None = None, device: torch.device | str | None = None) -> Tensor:
    """``(T, S)`` bool mask: query ``i`` may attend key ``j`` iff ``j <= i + (S - T)``.

    Aligned to the lower right: when the queries are the last ``T`` of ``S`` positions (decoding
    with a KV cache, ``S = cached + T``), each query still sees itself and everything before it.
    With ``S == T`` this is the usual lower-triangular mask.
    """
    k_len = q_len if k_len is None else k_len
    if q_len < 0 or k_len < 0:
        raise ValueError(f"q_len and k_len must be >= 0, got q_len={q_len}, k_len={k_len}")
    if k_len < q_len:
        raise ValueError(f"k_len must be >= q_len for a causal mask, got q_len={q_len}, k_len={k_len}")
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(diagonal=k_len - q_len)


def attention_mask(
    key_padding: Tensor | None = None,
    *,
    causal: bool = False,
    q_len: int | None = None,
    k_len: int | None = None,
) -> Tensor | None:
    """Combine a ``(B, S)`` key padding mask and/or a causal mask into one ``(B|1, 1, T, S)`` mask.

    ``True`` = may attend. Returns ``None`` when there is nothing to mask. ``q_len`` is needed when
    ``causal``; ``k_len`` defaults to the padding mask's length, else to ``q_len``.
    """
    if key_padding is not None:
        check_padding_mask(key_padding, "key_padding")
        if k_len is not None and key_padding.shape[1] != k_len:
            raise ValueError(
                f"key_padding has length {key_padding.shape[1]} but k_len is {k_len}"
            )
        k_len = key_padding.shape[1]
    mask = None
    if causal:
        if q_len is None:
            raise ValueError("q_len is required for a causal mask")
        device = key_padding.device if key_padding is not None else None
        mask = causal_mask(q_len, k_len if k_len is not None else q_len, device=device)[None, None]
    if key_padding is not None:
        pad = key_padding[:, None, None, :]  # (B, 1, 1, S)
        mask = pad if mask is None else mask & pad
    return mask


def check_padding_mask(mask: Tensor, name: str, shape: tuple[int, ...] | None = None) -> None:
    """Raise ``TypeError``/``ValueError`` unless ``mask`` is a ``(B, S)`` bool tensor (of ``shape``)."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"{name} must be a torch.bool tensor (True = real token), got {got}")
    if mask.dim() != 2:
        raise ValueError(f"{name} must have shape (B, S), got shape {tuple(mask.shape)}")
    if shape is not None and tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(mask.shape)}")


def check_attention_mask(mask: Tensor, batch: int, heads: int, q_len: int, k_len: int) -> None:
    """Raise unless ``mask`` is bool and broadcastable to ``(B, H, T, S)``."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"attention mask must be a torch.bool tensor (True = may attend), got {got}")
    target = (batch, heads, q_len, k_len)
    if mask.dim() > 4 or any(
        m not in (1, t) for m, t in zip(mask.shape[::-1], target[::-1])
    ):
        raise ValueError(
            f"attention mask of shape {tuple(mask.shape)} does not broadcast to (B, H, T, S) = {target}"
        )
