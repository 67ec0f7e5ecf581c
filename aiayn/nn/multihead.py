"""Multi-head attention (paper section 3.2.2), the one attention module of all three families.

``MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O`` with ``head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)``.
The same module serves encoder self-attention, causal decoder self-attention and encoder-decoder
(cross) attention; with ``n_kv_heads < n_heads`` it is grouped-query attention (``n_kv_heads=1``:
multi-query).
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.nn.attention import BACKENDS, scaled_dot_product_attention
from aiayn.nn.cache import CacheLayer, LayerCache
from aiayn.nn.kernels import build_kernel
from aiayn.nn.onednn_linear import OneDNNLinear, RowSplitLinear
from aiayn.nn.positional import PositionalEncoding

__all__ = ["MultiHeadAttention"]


class MultiHeadAttention(nn.Module):
    """Project, split into heads, attend, merge, project back.

    ``cross``: encoder-decoder attention (queries from ``x``, keys and values from ``memory``); it is
    decided here, once, and ``forward`` takes one of two short paths.
    ``positions``: a module whose ``rotate``/``bias`` hooks apply to self-attention (rotary, ALiBi);
    it must be ``None`` for cross-attention, where query and key positions are unrelated.
    ``attention_dropout``: dropout on the attention weights (an option; the paper drops sublayer outputs).
    ``attention``/``window``: the self-attention kernel, ``softmax`` (the paper), ``local`` (the
    ``window`` nearest keys) or ``linear`` (see :mod:`aiayn.nn.kernels`); cross-attention is always softmax.
    ``qk_norm``: RMS-normalise each head's queries and keys before positions and scores (Dehghani et
    al., 2023; OLMo 2, the modded-nanogpt speedruns), which bounds the logits and allows larger rates.
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
        cross: bool = False,
        attention: str = "softmax",
        window: int | None = None,
        qk_norm: bool = False,
    ) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if d_model % n_heads:
            raise ValueError(f"d_model must be divisible by n_heads, got d_model={d_model}, n_heads={n_heads}")
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads must be divisible by n_kv_heads, got n_heads={n_heads}, n_kv_heads={n_kv_heads}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if cross and positions is not None:
            raise ValueError("positions must be None for cross-attention (query and key positions are unrelated)")
        if cross and attention != "softmax":
            raise ValueError(f"cross-attention is always softmax, got attention={attention!r}")
        self.kernel = build_kernel(attention, window=window)
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = d_model // n_heads  # d_k = d_v = d_model / h
        self.backend = backend
        self.attention_dropout = attention_dropout
        self.cross = cross
        self.w_q = nn.Linear(d_model, n_heads * self.head_dim, bias=bias)
        self.w_k = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.w_v = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.w_o = nn.Linear(n_heads * self.head_dim, d_model, bias=bias)
        self.w_qkv: nn.Module | None = None  # the three as one layer, fused at load for inference (aiayn.inference.fusion)
        self.positions = positions
        if qk_norm:  # only then: the checkpoint keys of a model without it do not change
            self.q_norm, self.k_norm = nn.RMSNorm(self.head_dim), nn.RMSNorm(self.head_dim)
        self.qk_norm = qk_norm

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        causal: bool = False,
        cache: CacheLayer | None = None,
        offset: int | Tensor | None = None,
        return_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``x (B, T, D)`` to itself, or (``cross``) to ``memory (B, S, D)``.

        ``mask``: bool, ``True`` = may attend, broadcastable to ``(B, H, T, S)`` where ``S`` counts
        cached keys too. ``causal``: forbid the future (lower-right aligned). ``cache``: keys/values
        of earlier steps (self) or of the encoder output (cross, computed on first use).
        ``offset``: position of ``x``'s first token (default: the cache length, else 0; self only).
        ``return_weights``: also return ``(B, H, T, S)`` weights; uses the ``math`` backend.
        Returns ``(output (B, T, D), weights or None)``.
        """
        dropout_p = self.attention_dropout if self.training else 0.0
        backend = "math" if return_weights else self.backend
        if self.cross:
            if memory is None:
                raise ValueError("cross-attention needs memory (the encoder output), got None")
            if cache is not None and not isinstance(cache, LayerCache):
                raise TypeError(f"cross-attention caches its keys in a LayerCache, got a {type(cache).__name__}")
            q, k, v = self._cross_inputs(x, memory, cache)
            out, weights = scaled_dot_product_attention(
                q, k, v, mask=mask, causal=causal, dropout_p=dropout_p, backend=backend, return_weights=return_weights
            )
            return self._merge(out), weights
        if memory is not None:
            raise ValueError("this is a self-attention module: memory must be None (build it with cross=True)")
        if offset is None:
            offset = cache.length if cache is not None else 0
        q, k, v = self._project_self(x)  # (B, H, T, Dh), (B, Hkv, T, Dh), (B, Hkv, T, Dh)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        bias = None
        if self.positions is not None:
            q, k = self.positions.rotate(q, k, offset)
            bias = partial(self.positions.bias, offset=offset, device=x.device)  # (T, S) -> bias; S known after caching
        out, weights = self.kernel(
            q, k, v, mask=mask, causal=causal, cache=cache, bias=bias, dropout_p=dropout_p, backend=backend,
            return_weights=return_weights,
        )
        return self._merge(out), weights

    def new_cache(self, max_len: int | None = None) -> CacheLayer:
        """An empty generation cache of the kind this module's kernel keeps (KV, ring buffer or state)."""
        return self.kernel.new_cache(max_len)

    def _cross_inputs(self, x: Tensor, memory: Tensor, cache: LayerCache | None) -> tuple[Tensor, Tensor, Tensor]:
        """Queries of ``x``; keys and values of ``memory``, projected once per source when cached."""
        q = self._split(self.w_q(x), self.n_heads)  # (B, H, T, Dh)
        if self.qk_norm:
            q = self.q_norm(q)
        if cache is not None and cache.filled:
            return q, cache.k, cache.v  # type: ignore[return-value]  # filled: the encoder output was projected before
        k = self._split(self.w_k(memory), self.n_kv_heads)  # (B, Hkv, S, Dh)
        v = self._split(self.w_v(memory), self.n_kv_heads)
        if self.qk_norm:
            k = self.k_norm(k)
        if cache is not None:
            cache.set(k, v)
        return q, k, v

    def _merge(self, out: Tensor) -> Tensor:
        """``(B, H, T, Dh) -> (B, T, D)``, then the output projection ``W^O``."""
        batch, _, q_len, _ = out.shape
        out = out.transpose(1, 2).reshape(batch, q_len, self.n_heads * self.head_dim)  # (B, T, H*Dh)
        return self.w_o(out)

    def _project_self(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention's three projections as one matmul (one larger GEMM, one weight cast under
        autocast); the weights stay three modules, so checkpoint keys do not change.

        Without gradients (inference) the three modules run as they are: concatenating the weights
        would copy every one of them at every decoding step, and int8 layers have no float weight;
        a model loaded for inference holds them concatenated once instead, in ``w_qkv``."""
        if self.w_qkv is not None:
            # split_with_sizes: the tensor method itself (Tensor.split is a Python wrapper around it)
            q, k, v = self.w_qkv(x).split_with_sizes([self.n_heads * self.head_dim, *(2 * [self.n_kv_heads * self.head_dim])], dim=-1)
            return self._split(q, self.n_heads), self._split(k, self.n_kv_heads), self._split(v, self.n_kv_heads)
        if not torch.is_grad_enabled() or not isinstance(self.w_q, nn.Linear):
            q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
            return self._split(q, self.n_heads), self._split(k, self.n_kv_heads), self._split(v, self.n_kv_heads)
        weight = torch.cat([self.w_q.weight, self.w_k.weight, self.w_v.weight])  # (H*Dh + 2*Hkv*Dh, D)
        bias = None if self.w_q.bias is None else torch.cat([self.w_q.bias, self.w_k.bias, self.w_v.bias])
        # the kernel training chose for w_q, timed on the three's shape (aiayn.nn.onednn_linear), else F.linear
        kernel = self.w_q.product if isinstance(self.w_q, (OneDNNLinear, RowSplitLinear)) else F.linear
        q, k, v = kernel(x, weight, bias).split([self.w_q.out_features, self.w_k.out_features, self.w_v.out_features], dim=-1)
        return self._split(q, self.n_heads), self._split(k, self.n_kv_heads), self._split(v, self.n_kv_heads)

    def _split(self, x: Tensor, heads: int) -> Tensor:
        """``(B, T, heads*Dh) -> (B, heads, T, Dh)``."""
        batch, length, _ = x.shape
        return x.view(batch, length, heads, self.head_dim).transpose(1, 2)
