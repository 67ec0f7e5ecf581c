"""The encoder-decoder Transformer of the paper (section 3, Figure 1), for translation.

Read top to bottom: embed the source, encode it; embed the shifted target, decode it with causal
self-attention and attention over the encoder output; project to target-vocabulary logits.
"""

from __future__ import annotations

from torch import Tensor, nn

from aiayn.models.common import build_positions, check_token_ids, init_weights, resolve_padding
from aiayn.models.config import EncoderDecoderConfig
from aiayn.nn.blocks import TransformerStack
from aiayn.nn.cache import KVCache
from aiayn.nn.dropout import Dropout
from aiayn.nn.embedding import TokenEmbedding
from aiayn.nn.masks import check_padding_mask
from aiayn.nn.norm import build_norm

__all__ = ["EncoderDecoder"]


class EncoderDecoder(nn.Module):
    """Encoder-decoder Transformer. Token ids are ``(B, S)`` source and ``(B, T)`` target (shifted right).

    Padding masks are bool ``(B, S)`` / ``(B, T)``, ``True`` = real token; when omitted they are
    derived from ``config.pad_id`` (no mask at all if the batch has no padding).
    """

    def __init__(self, config: EncoderDecoderConfig) -> None:
        super().__init__()
        self.config = config
        d_model, spec = config.d_model, config.layer_spec()
        self.src_embed = TokenEmbedding(config.vocab_size, d_model, scale=config.scale_embeddings)
        self.tgt_embed = (
            self.src_embed if config.share_embeddings
            else TokenEmbedding(config.target_vocab_size, d_model, scale=config.scale_embeddings)
        )
        self.src_positions = build_positions(config)
        self.tgt_positions = build_positions(config)
        if config.embedding_norm:  # BART's layernorm_embedding (not in the paper)
            self.src_embed_norm = build_norm(config.norm, d_model, eps=config.norm_eps, bias=config.bias)
            self.tgt_embed_norm = build_norm(config.norm, d_model, eps=config.norm_eps, bias=config.bias)
        self.dropout = Dropout(config.dropout)  # section 5.4: on the sums of embeddings and positions
        self.encoder = TransformerStack(
            spec, config.n_encoder_layers, causal=False, cross_attention=False,
            final_norm=config.has_final_norm, positions=self.src_positions,
        )
        self.decoder = TransformerStack(
            spec, config.n_decoder_layers, causal=True, cross_attention=True,
            final_norm=config.has_final_norm, positions=self.tgt_positions,
        )
        self.output = nn.Linear(d_model, config.target_vocab_size, bias=config.output_bias)  # pre-softmax projection
        init_weights(self, config.init_std)
        if config.tie_output:
            self.output.weight = self.tgt_embed.weight  # section 3.4: shared with the target embedding

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None, tgt_mask: Tensor | None = None) -> Tensor:
        """``src (B, S)``, ``tgt (B, T)`` ids -> logits ``(B, T, target_vocab_size)``."""
        src_mask = self._padding(src, src_mask, self.config.vocab_size, "src")
        memory, _ = self._encode(src, src_mask)
        logits, _ = self._decode(tgt, memory, src_mask, tgt_mask, None, return_weights=False)
        return logits

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """``src (B, S)`` ids -> encoder output ``(B, S, d_model)``."""
        memory, _ = self._encode(src, self._padding(src, src_mask, self.config.vocab_size, "src"))
        return memory

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        *,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """``tgt (B, T)`` ids over ``memory (B, S, D)`` -> logits ``(B, T, V)``.

        With a ``cache`` (see :meth:`new_cache`), ``tgt`` holds only the new positions and
        ``tgt_mask``, if given, covers all target positions so far ``(B, S)`` (see :meth:`KVCache.check_padding_mask`).
        """
        logits, _ = self._decode(tgt, memory, src_mask, tgt_mask, cache, return_weights=False)
        return logits

    def new_cache(self, max_len: int | None = None) -> KVCache:
        """An empty KV cache for incremental decoding (``max_len``: preallocate a static one)."""
        return KVCache(self.config.n_decoder_layers, cross_attention=True, self_caches=self.decoder.new_caches(max_len))

    def attention_maps(
        self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None, tgt_mask: Tensor | None = None
    ) -> dict[str, list[Tensor]]:
        """Attention weights of every layer, ``(B, H, T, S)`` each, keyed ``encoder``, ``decoder_self``, ``decoder_cross``."""
        src_mask = self._padding(src, src_mask, self.config.vocab_size, "src")
        memory, enc_weights = self._encode(src, src_mask, return_weights=True)
        _, dec_weights = self._decode(tgt, memory, src_mask, tgt_mask, None, return_weights=True)
        return {
            "encoder": [w["self"] for w in enc_weights],
            "decoder_self": [w["self"] for w in dec_weights],
            "decoder_cross": [w["cross"] for w in dec_weights],
        }

    def _encode(self, src: Tensor, src_mask: Tensor | None, return_weights: bool = False) -> tuple[Tensor, list]:
        x = self.src_positions.embed(self.src_embed(src))  # (B, S, D)
        if self.config.embedding_norm:
            x = self.src_embed_norm(x)
        x = self.dropout(x)
        mask = src_mask[:, None, None, :] if src_mask is not None else None  # (B, 1, 1, S)
        return self.encoder(x, mask=mask, return_weights=return_weights)

    def _decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
        cache: KVCache | None,
        return_weights: bool,
    ) -> tuple[Tensor, list]:
        offset = cache.length if cache is not None else 0
        if cache is None:
            tgt_mask = self._padding(tgt, tgt_mask, self.config.target_vocab_size, "tgt")
        else:
            check_token_ids(tgt, self.config.target_vocab_size, "tgt")
            if tgt_mask is not None:
                cache.check_padding_mask(tgt_mask, tgt.shape[0], tgt.shape[1], "tgt_mask")
        if src_mask is not None:
            check_padding_mask(src_mask, "src_mask", shape=tuple(memory.shape[:2]))
        x = self.tgt_positions.embed(self.tgt_embed(tgt), offset)  # (B, T, D)
        if self.config.embedding_norm:
            x = self.tgt_embed_norm(x)
        x = self.dropout(x)
        self_mask = tgt_mask[:, None, None, :] if tgt_mask is not None else None  # (B, 1, 1, offset+T); causal added inside
        memory_mask = src_mask[:, None, None, :] if src_mask is not None else None  # (B, 1, 1, S)
        x, weights = self.decoder(
            x, mask=self_mask, memory=memory, memory_mask=memory_mask, cache=cache, offset=offset,
            return_weights=return_weights,
        )
        return self.output(x), weights

    def _padding(self, ids: Tensor, mask: Tensor | None, vocab_size: int, name: str) -> Tensor | None:
        return resolve_padding(ids, mask, vocab_size=vocab_size, pad_id=self.config.pad_id, name=name)
