"""Sliding-window attention through FlexAttention (``torch.nn.attention.flex_attention``), for CUDA only.

FlexAttention compiles the window rule into a block-sparse kernel that skips the blocks outside the
band. It is optional and off on the CPU (torch compiles it there for inference only, without
backward); the blocked kernel of :mod:`aiayn.nn.local_attention` serves the CPU. Not measured in
this repository yet: no GPU was available when it was written (see docs/lab.md).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import torch
from torch import Tensor

from aiayn.nn.local_attention import window_sides

__all__ = ["flex_available", "flex_local_attention"]


def flex_available(device: torch.device | str) -> bool:
    """Whether FlexAttention can run here: a CUDA device and a torch that has it."""
    if torch.device(device).type != "cuda":
        return False
    return importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


@lru_cache(maxsize=1)
def _compiled() -> Callable[..., Tensor]:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


@lru_cache(maxsize=16)
def _block_mask(window: int, causal: bool, length: int, device: str) -> Any:
    from torch.nn.attention.flex_attention import create_block_mask

    left, right = window_sides(window, causal)

    def in_window(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        diff = kv_idx - q_idx
        return (diff >= -left) & (diff <= right)

    return create_block_mask(in_window, B=None, H=None, Q_LEN=length, KV_LEN=length, device=device)


def flex_local_attention(q: Tensor, k: Tensor, v: Tensor, *, window: int, causal: bool) -> Tensor:
    """``q (B, H, n, D)``, ``k, v (B, Hkv, n, D)`` -> ``(B, H, n, D)``: the band of :func:`window_mask`, block-sparse.

    Raises ``RuntimeError`` off CUDA (use :func:`aiayn.nn.local_attention.local_attention` there).
    """
    if not flex_available(q.device):
        raise RuntimeError(
            f"flex_local_attention runs on CUDA only, got device {q.device}: on the CPU torch compiles "
            "FlexAttention for inference only; use aiayn.nn.local_attention.local_attention"
        )
    mask = _block_mask(window, causal, q.shape[2], str(q.device))
    return _compiled()(q, k, v, block_mask=mask, enable_gqa=q.shape[1] != k.shape[1])
