"""A decoder-only Transformer language model (GPT): the paper's decoder without cross-attention.

Read top to bottom: embed tokens and positions, run the causal stack, project to vocabulary logits.
"""

from __future__ import annotations

from torch import Tensor, nn

from aiayn.models.common import build_positions, check_token_ids, init_weights, resolve_padding
from aiayn.models.config import DecoderOnlyConfig
from aiayn.nn.blocks import TransformerStack
from aiayn.nn.cache import KVCache
from aiayn.nn.dropout import Dropout
from aiayn.nn.embedding import TokenEmbedding

__all__ = ["DecoderOnly"]


class DecoderOnly(nn.Module):
    """Causal language model: ``(B, T)`` ids -> ``(B, T, vocab_size)`` next-token logits."""

    def __init__(self, config: DecoderOnlyConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = TokenEmbedding(config.vocab_size, config.d_model, scale=config.scale_embeddings)
        self.positions = build_positions(config)
        self.dropout = Dropout(config.dropout)
        self.decoder = TransformerStack(
            config.layer_spec(), config.n_layers, causal=True, cross_attention=False,
            final_norm=config.has_final_norm, positions=self.positions,
        )
        self.output = nn.Linear(config.d_model, config.vocab_size, bias=False)
        init_weights(self, config.init_std, n_residual_layers=config.n_layers)
        if config.tie_output:
            self.output.weight = self.embed.weight

    def forward(
        self,
        ids: Tensor,
        pad_mask: Tensor | None = None,
        *,
        cache: KVCache | None = None,
        offset: int | Tensor | None = None,
        logits_to_keep: int = 0,
    ) -> Tensor:
        """``ids (B, T)`` -> logits ``(B, T, V)``, or ``(B, logits_to_keep, V)`` of the last positions only.

        ``pad_mask``: bool, ``True`` = real token; ``(B, T)``, or with a ``cache`` ``(B, S)``: all positions so
        far (a static cache: its first ``S`` columns, see :meth:`KVCache.check_padding_mask`). Without a cache
        it is derived from ``config.pad_id`` when omitted.
        ``offset``: position of the first token, an int or ``(B,)`` per row (default: the cache length).
        ``logits_to_keep``: 0 for every position, else how many of the last ones to project (as Hugging Face's
        argument of that name): a prompt generates from its last position only, and the output projection of the others
        reads the whole vocabulary's weights for nothing (a 512-token GPT-2 prompt: 45% of its forward).
        """
        if isinstance(logits_to_keep, bool) or not isinstance(logits_to_keep, int) or logits_to_keep < 0:
            raise ValueError(f"logits_to_keep must be an int >= 0 (0: every position), got {logits_to_keep!r}")
        logits, _ = self._run(ids, pad_mask, cache, offset, return_weights=False, logits_to_keep=logits_to_keep)
        return logits

    def new_cache(self, max_len: int | None = None) -> KVCache:
        """An empty KV cache for incremental decoding (``max_len``: preallocate a static one)."""
        return KVCache(self.config.n_layers, self_caches=self.decoder.new_caches(max_len))

    def attention_maps(self, ids: Tensor, pad_mask: Tensor | None = None) -> dict[str, list[Tensor]]:
        """Masked self-attention weights of every layer, ``(B, H, T, T)`` each, keyed ``decoder_self``."""
        _, weights = self._run(ids, pad_mask, None, None, return_weights=True)
        return {"decoder_self": [w["self"] for w in weights]}

    def _run(
        self, ids: Tensor, pad_mask: Tensor | None, cache: KVCache | None, offset: int | Tensor | None, return_weights: bool,
        logits_to_keep: int = 0,
    ) -> tuple[Tensor, list]:
        if cache is None:
            pad_mask = resolve_padding(ids, pad_mask, vocab_size=self.config.vocab_size, pad_id=self.config.pad_id, name="ids")
        else:
            check_token_ids(ids, self.config.vocab_size, "ids")
            if pad_mask is not None:
                cache.check_padding_mask(pad_mask, ids.shape[0], ids.shape[1], "pad_mask")
        if offset is None:
            offset = cache.length if cache is not None else 0
        x = self.dropout(self.positions.embed(self.embed(ids), offset))  # (B, T, D)
        mask = pad_mask[:, None, None, :] if pad_mask is not None else None  # (B, 1, 1, S); causal added inside
        x, weights = self.decoder(x, mask=mask, cache=cache, offset=offset, return_weights=return_weights)
        return self.output(x[:, -logits_to_keep:] if logits_to_keep else x), weights
