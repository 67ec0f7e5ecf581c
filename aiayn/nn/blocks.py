"""Transformer layers and stacks (paper section 3.1), shared by all three families.

One layer class covers the paper's two: an encoder layer is self-attention + FFN; a decoder layer
adds causal masking and encoder-decoder attention; a GPT block is a decoder layer without the
encoder-decoder attention. Each sublayer is wrapped in a residual connection with dropout and a
norm, either after the sum (Post-LN, the paper: ``LayerNorm(x + Dropout(Sublayer(x)))``) or before
the sublayer (Pre-LN: ``x + Dropout(Sublayer(LayerNorm(x)))``, stabler for deep stacks).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from aiayn.nn.cache import CacheLayer, KVCache
from aiayn.nn.dropout import Dropout
from aiayn.nn.feedforward import PositionwiseFeedForward
from aiayn.nn.multihead import MultiHeadAttention
from aiayn.nn.norm import build_norm
from aiayn.nn.positional import PositionalEncoding
from aiayn.nn.ssm import SelectiveSSM

__all__ = ["LayerSpec", "TransformerLayer", "TransformerStack"]


@dataclass(frozen=True)
class LayerSpec:
    """The sizes and choices a layer is built from (a family config turns into one of these)."""

    d_model: int
    n_heads: int
    d_ff: int
    n_kv_heads: int | None = None
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation: str = "relu"
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    pre_norm: bool = False
    bias: bool = True
    backend: str = "sdpa"
    attention: str = "softmax"  # the self-attention kernel: softmax | local | linear (aiayn.nn.kernels)
    window: int | None = None  # keys per query for attention="local"
    mixer: str = "attention"  # "ssm": a selective state-space layer replaces self-attention
    ssm_state: int = 16
    ssm_conv: int = 4
    ssm_expand: int = 2
    qk_norm: bool = False


class TransformerLayer(nn.Module):
    """Self-attention (causal if ``causal``), optional cross-attention, FFN; each with residual + norm."""

    def __init__(
        self, spec: LayerSpec, *, causal: bool, cross_attention: bool, positions: PositionalEncoding | None = None
    ) -> None:
        super().__init__()
        self.causal = causal
        self.pre_norm = spec.pre_norm

        def attention(positions: PositionalEncoding | None, cross: bool = False) -> MultiHeadAttention:
            return MultiHeadAttention(
                spec.d_model, spec.n_heads, n_kv_heads=spec.n_kv_heads, bias=spec.bias,
                attention_dropout=spec.attention_dropout, backend=spec.backend, positions=positions, cross=cross,
                attention="softmax" if cross else spec.attention, window=None if cross else spec.window, qk_norm=spec.qk_norm,
            )

        def norm() -> nn.Module:
            return build_norm(spec.norm, spec.d_model, eps=spec.norm_eps, bias=spec.bias)

        if spec.mixer == "ssm":  # the sequence mixer is a state-space layer, not attention
            if not causal or cross_attention:
                raise ValueError("mixer='ssm' is causal and has no cross-attention: a decoder-only stack only")
            self.self_attn = None
            self.ssm = SelectiveSSM(spec.d_model, d_state=spec.ssm_state, d_conv=spec.ssm_conv, expand=spec.ssm_expand, bias=spec.bias)
            self.ssm_norm = norm()
        else:
            self.self_attn = attention(positions)
            self.self_attn_norm = norm()
        self.cross_attn = attention(None, cross=True) if cross_attention else None
        self.cross_attn_norm = norm() if cross_attention else None
        self.ffn = PositionwiseFeedForward(
            spec.d_model, spec.d_ff, activation=spec.activation, bias=spec.bias,
            activation_dropout=spec.activation_dropout,
        )
        self.ffn_norm = norm()
        self.dropout = Dropout(spec.dropout)  # section 5.4: on each sublayer's output

    def forward(
        self,
        x: Tensor,
        *,
        mask: Tensor | None = None,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        cache: KVCache | None = None,
        index: int = 0,
        offset: int | Tensor | None = None,
        return_weights: bool = False,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """``x (B, T, D) -> (B, T, D)``; ``memory (B, S, D)`` is the encoder output for cross-attention.

        Masks are bool, ``True`` = may attend: ``mask`` over this layer's own keys (``(B|1, 1, T|1, S_self)``),
        ``memory_mask`` over the encoder output (``(B|1, 1, 1|T, S)``). ``cache``/``index``: the
        decoder's KV cache and this layer's place in it. Returns the output and, if
        ``return_weights``, a dict of ``(B, H, T, S)`` weights keyed ``self`` and ``cross``.
        """
        weights: dict[str, Tensor] = {}
        layer_cache = cache.self_attn[index] if cache is not None else None
        if self.self_attn is None:
            if return_weights:
                raise ValueError("return_weights=True: mixer='ssm' has no attention weights to return")
            pad = None if mask is None else mask[:, 0, 0, mask.shape[-1] - x.shape[1] :]  # (B, T): this call's positions
            x = self._after(x, self.ssm(self._before(x, self.ssm_norm), pad_mask=pad, cache=layer_cache), self.ssm_norm)
        else:
            attn, w = self.self_attn(
                self._before(x, self.self_attn_norm), mask=mask, causal=self.causal, cache=layer_cache,
                offset=offset, return_weights=return_weights,
            )
            x = self._after(x, attn, self.self_attn_norm)
            if w is not None:
                weights["self"] = w
        if self.cross_attn is not None and self.cross_attn_norm is not None:  # built together
            if memory is None:
                raise ValueError("this layer has cross-attention: memory (the encoder output) is required")
            cross_cache = cache.cross_attn[index] if cache is not None and cache.cross_attn is not None else None
            attn, w = self.cross_attn(
                self._before(x, self.cross_attn_norm), memory, mask=memory_mask, cache=cross_cache,
                return_weights=return_weights,
            )
            x = self._after(x, attn, self.cross_attn_norm)
            if w is not None:
                weights["cross"] = w
        x = self._after(x, self.ffn(self._before(x, self.ffn_norm)), self.ffn_norm)
        return x, weights

    def new_cache(self, max_len: int | None = None) -> CacheLayer:
        """An empty generation cache for this layer's sequence mixer (KV cache, ring buffer or state)."""
        return self.ssm.new_cache() if self.self_attn is None else self.self_attn.new_cache(max_len)

    def _before(self, x: Tensor, norm: nn.Module) -> Tensor:
        return norm(x) if self.pre_norm else x

    def _after(self, x: Tensor, sublayer_out: Tensor, norm: nn.Module) -> Tensor:
        # Residual connection (section 3.1); dropout acts only in training (the module is the identity otherwise,
        # and not calling it saves a module call per sublayer at every decoding step).
        x = x + (self.dropout(sublayer_out) if self.training else sublayer_out)
        return x if self.pre_norm else norm(x)


class TransformerStack(nn.Module):
    """``N`` identical layers, then an optional final norm (needed with Pre-LN, whose output is unnormalised)."""

    def __init__(
        self,
        spec: LayerSpec,
        n_layers: int,
        *,
        causal: bool,
        cross_attention: bool,
        final_norm: bool,
        positions: PositionalEncoding | None = None,
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            TransformerLayer(spec, causal=causal, cross_attention=cross_attention, positions=positions)
            for _ in range(n_layers)
        )
        self.norm = build_norm(spec.norm, spec.d_model, eps=spec.norm_eps, bias=spec.bias) if final_norm else None

    def new_caches(self, max_len: int | None = None) -> list[CacheLayer]:
        """One empty self-attention (or mixer) cache per layer, of the kind each layer keeps."""
        return [layer.new_cache(max_len) for layer in self.layers]  # type: ignore[operator]  # ModuleList items are TransformerLayers

    def forward(
        self,
        x: Tensor,
        *,
        mask: Tensor | None = None,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        cache: KVCache | None = None,
        offset: int | Tensor | None = None,
        return_weights: bool = False,
    ) -> tuple[Tensor, list[dict[str, Tensor]]]:
        """Run all layers; see :meth:`TransformerLayer.forward`. Returns the output and per-layer weights."""
        all_weights = []
        if offset is None and cache is not None:
            offset = cache.length  # read once: layer 0's cache grows during the pass
        for index, layer in enumerate(self.layers):
            x, weights = layer(
                x, mask=mask, memory=memory, memory_mask=memory_mask, cache=cache, index=index,
                offset=offset, return_weights=return_weights,
            )
            all_weights.append(weights)
        if self.norm is not None:
            x = self.norm(x)
        return x, all_weights
