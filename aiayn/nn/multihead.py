"""Multi-head attention (paper section 3.2.2), the one attention module of all three families.

``MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O`` with ``head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)``.
The same module serves encoder self-attention, causal decoder self-attention and encoder-decoder
(cross) attention; with ``n_kv_heads < n_heads`` it is grouped-query attention (``n_kv_heads=1``:
multi-query).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.nn.attention import BACKENDS, scaled_dot_product_attention
from aiayn.nn.cache import LayerCache
from aiayn.nn.positional import PositionalEncoding

__all__ = ["MultiHeadAttention"]


class MultiHeadAttention(nn.Module):
    """Project, split into heads, attend, merge, project back.

    ``positions``: a module whose ``rotate``/``bias`` hooks apply to self-attention (rotary, ALiBi);
    leave it ``None`` for cross-attention, where query and key positions are unrelated.
    ``attention_dropout``: dropout on the attention weights (an option; the paper drops sublayer outputs).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        n_kv_heads: int | None = None,
        bias: bool = True,
        attention_dropout: float = 0.0,
        backend: str = "sdpa",
        positions: PositionalEncoding | None = None,
    ) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if d_model % n_heads:
            raise ValueError(f"d_model must be divisible by n_heads, got d_model={d_model}, n_heads={n_heads}")
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads must be divisible by n_kv_heads, got n_heads={n_heads}, n_kv_heads={n_kv_heads}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = d_model // n_heads  # d_k = d_v = d_model / h
        self.backend = backend
        self.attention_dropout = attention_dropout
        self.w_q = nn.Linear(d_model, n_heads * self.head_dim, bias=bias)
        self.w_k = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.w_v = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.w_o = nn.Linear(n_heads * self.head_dim, d_model, bias=bias)
        self.positions = positions

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        causal: bool = False,
        cache: LayerCache | None = None,
        offset: int | Tensor | None = None,
        return_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``x (B, T, D)`` to itself, or to ``memory (B, S, D)`` (cross-attention).

        ``mask``: bool, ``True`` = may attend, broadcastable to ``(B, H, T, S)`` where ``S`` counts
        cached keys too. ``causal``: forbid the future (lower-right aligned). ``cache``: keys/values
        of earlier steps (self) or of the encoder output (cross, computed on first use).
        ``offset``: position of ``x``'s first token (default: the cache length, else 0).
        ``return_weights``: also return ``(B, H, T, S)`` weights; uses the ``math`` backend.
        Returns ``(output (B, T, D), weights or None)``.
        """
        batch, q_len, _ = x.shape
        if offset is None:
            offset = cache.length if cache is not None and memory is None else 0
        if memory is None:
            q, k, v = self._project_self(x)  # (B, H, T, Dh), (B, Hkv, T, Dh), (B, Hkv, T, Dh)
        else:
            q = self._split(self.w_q(x), self.n_heads)  # (B, H, T, Dh)
        if memory is not None and cache is not None and cache.filled:
            k, v = cache.k, cache.v  # type: ignore[assignment]  # cross-attention: the encoder output was projected before (filled)
        else:
            if memory is not None:
                k = self._split(self.w_k(memory), self.n_kv_heads)  # (B, Hkv, S, Dh)
                v = self._split(self.w_v(memory), self.n_kv_heads)
            if memory is None and self.positions is not None:
                q, k = self.positions.rotate(q, k, offset)
            if cache is not None:
                if memory is None:
                    k, v = cache.append(k, v)
                else:
                    cache.set(k, v)

        bias = None
        if memory is None and self.positions is not None:
            bias = self.positions.bias(q_len, k.shape[2], offset, device=x.device)
        out, weights = scaled_dot_product_attention(
            q,
            k,
            v,
            mask=mask,
            bias=bias,
            causal=causal,
            dropout_p=self.attention_dropout if self.training else 0.0,
            backend="math" if return_weights else self.backend,
            return_weights=return_weights,
        )
        out = out.transpose(1, 2).reshape(batch, q_len, self.n_heads * self.head_dim)  # (B, T, H*Dh)
        return self.w_o(out), weights

    def _project_self(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention's three projections as one matmul (one larger GEMM, one weight cast under
        autocast); the weights stay three modules, so checkpoint keys do not change."""
        weight = torch.cat([self.w_q.weight, self.w_k.weight, self.w_v.weight])  # (H*Dh + 2*Hkv*Dh, D)
        bias = None if self.w_q.bias is None else torch.cat([self.w_q.bias, self.w_k.bias, self.w_v.bias])
        q, k, v = F.linear(x, weight, bias).split([self.w_q.out_features, self.w_k.out_features, self.w_v.out_features], dim=-1)
        return self._split(q, self.n_heads), self._split(k, self.n_kv_heads), self._split(v, self.n_kv_heads)

    def _split(self, x: Tensor, heads: int) -> Tensor:
        """``(B, T, heads*Dh) -> (B, heads, T, Dh)``."""
        batch, length, _ = x.shape
        return x.view(batch, length, heads, self.head_dim).transpose(1, 2)
