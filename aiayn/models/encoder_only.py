"""An encoder-only Transformer (BERT): bidirectional self-attention, masked-LM and classification heads.

Read top to bottom: token + position + segment embeddings (normalised), the encoder stack, then a
head: per-token vocabulary logits (masked LM) or a class from the first ([CLS]) position (or, with
``pooling="mean"``, from the mean of the real tokens).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.models.common import build_positions, init_weights, resolve_padding
from aiayn.models.config import EncoderOnlyConfig
from aiayn.nn.blocks import TransformerStack
from aiayn.nn.dropout import Dropout
from aiayn.nn.embedding import TokenEmbedding
from aiayn.nn.norm import build_norm

__all__ = ["EncoderOnly"]


class EncoderOnly(nn.Module):
    """BERT-style encoder: ``(B, T)`` ids -> ``(B, T, d_model)`` hidden states, plus heads."""

    def __init__(self, config: EncoderOnlyConfig) -> None:
        super().__init__()
        self.config = config
        d_model = config.d_model
        self.embed = TokenEmbedding(config.vocab_size, d_model, scale=config.scale_embeddings)
        self.positions = build_positions(config)
        self.segment_embed = nn.Embedding(config.n_segments, d_model) if config.n_segments else None
        self.embed_norm = build_norm(config.norm, d_model, eps=config.norm_eps, bias=config.bias) if config.embedding_norm else None
        self.dropout = Dropout(config.dropout)
        self.encoder = TransformerStack(
            config.layer_spec(), config.n_layers, causal=False, cross_attention=False,
            final_norm=config.has_final_norm, positions=self.positions,
        )
        if config.mlm_head:  # BERT: dense + GELU + norm, then the (tied) vocabulary projection
            self.mlm_transform = nn.Linear(d_model, d_model)
            self.mlm_norm = build_norm(config.norm, d_model, eps=config.norm_eps)
            self.mlm_output = nn.Linear(d_model, config.vocab_size)
        if config.n_classes or config.pooler:  # BERT: tanh pooler on [CLS] ...
            self.pooler = nn.Linear(d_model, d_model)
        if config.n_classes:  # ... then a linear classifier
            self.classifier = nn.Linear(d_model, config.n_classes)
        init_weights(self, config.init_std)
        if config.mlm_head and config.tie_output:
            self.mlm_output.weight = self.embed.weight

    def forward(self, ids: Tensor, pad_mask: Tensor | None = None, segment_ids: Tensor | None = None) -> Tensor:
        """``ids (B, T)`` -> hidden states ``(B, T, D)``. ``pad_mask`` bool ``(B, T)``, ``True`` = real token."""
        hidden, _ = self._run(ids, pad_mask, segment_ids, return_weights=False)
        return hidden

    def masked_lm_logits(self, hidden: Tensor) -> Tensor:
        """Hidden states ``(B, T, D)`` -> vocabulary logits ``(B, T, V)`` for every position."""
        if not self.config.mlm_head:
            raise ValueError("this model has no masked-LM head (config.mlm_head=False)")
        x = self.mlm_norm(F.gelu(self.mlm_transform(hidden)))
        return self.mlm_output(x)

    def classification_logits(self, hidden: Tensor, pad_mask: Tensor | None = None) -> Tensor:
        """Hidden states ``(B, T, D)`` -> class logits ``(B, n_classes)`` from the pooled output."""
        if not self.config.n_classes:
            raise ValueError("this model has no classification head (config.n_classes=0)")
        return self.classifier(self.dropout(self.pooled(hidden, pad_mask)))

    def pooled(self, hidden: Tensor, pad_mask: Tensor | None = None) -> Tensor:
        """BERT's pooled output ``tanh(W h + b)``, ``(B, D)``: ``h`` is the [CLS] state, or with
        ``pooling="mean"`` the mean over the real tokens (``pad_mask`` ``True``; all if ``None``)."""
        if not hasattr(self, "pooler"):
            raise ValueError("this model has no pooler (config.pooler and config.n_classes are unset)")
        if self.config.pooling == "cls":
            return torch.tanh(self.pooler(hidden[:, 0]))
        if pad_mask is None:
            return torch.tanh(self.pooler(hidden.mean(dim=1)))
        weights = pad_mask.to(hidden.dtype)[..., None]  # (B, T, 1)
        return torch.tanh(self.pooler((hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)))

    def attention_maps(
        self, ids: Tensor, pad_mask: Tensor | None = None, segment_ids: Tensor | None = None
    ) -> dict[str, list[Tensor]]:
        """Self-attention weights of every layer, ``(B, H, T, T)`` each, keyed ``encoder``."""
        _, weights = self._run(ids, pad_mask, segment_ids, return_weights=True)
        return {"encoder": [w["self"] for w in weights]}

    def _run(self, ids: Tensor, pad_mask: Tensor | None, segment_ids: Tensor | None, return_weights: bool) -> tuple[Tensor, list]:
        pad_mask = resolve_padding(ids, pad_mask, vocab_size=self.config.vocab_size, pad_id=self.config.pad_id, name="ids")
        x = self.positions.embed(self.embed(ids))  # (B, T, D)
        if self.segment_embed is not None:
            if segment_ids is None:
                segment_ids = torch.zeros_like(ids)
            elif segment_ids.shape != ids.shape:
                raise ValueError(f"segment_ids must have the shape of ids {tuple(ids.shape)}, got {tuple(segment_ids.shape)}")
            elif segment_ids.numel() and not 0 <= int(segment_ids.min()) <= int(segment_ids.max()) < self.config.n_segments:
                raise ValueError(f"segment_ids must be in [0, n_segments={self.config.n_segments}), got max {int(segment_ids.max())}")
            x = x + self.segment_embed(segment_ids)
        elif segment_ids is not None:
            raise ValueError("segment_ids given, but this model has no segment embeddings (config.n_segments=0)")
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        x = self.dropout(x)
        mask = pad_mask[:, None, None, :] if pad_mask is not None else None  # (B, 1, 1, T)
        return self.encoder(x, mask=mask, return_weights=return_weights)
