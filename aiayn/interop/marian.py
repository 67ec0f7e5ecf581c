"""Marian (``MarianMTModel``, the opus-mt translation models) <-> our encoder-decoder family.

Marian is the paper's model: sinusoidal positions, Post-LN, no final norms, embeddings scaled by
sqrt(d_model) (``scale_embedding``), tied output. One difference is layout, not arithmetic: Marian's
sinusoid table puts all sines in the first half of the features and all cosines in the second,
while ours interleaves them (section 3.5: sin at even, cos at odd indices). Positions are *added*
to the residual stream, so instead of a core option we reorder the residual basis of the whole
model by one permutation ``perm`` (ours[j] = theirs[perm[j]]): the columns of every matrix that
reads the stream (embeddings, q/k/v, fc1, the output projection) and the rows of every one that
writes it (out_proj, fc2, their biases), and the LayerNorm gains and biases (LayerNorm commutes with
a permutation). The models then compute the same function; hidden states differ by ``perm``.

``final_logits_bias`` is our ``output.bias`` (``output_bias=True``; zero in every opus-mt model).
Exact except for: encoder and decoder must share head count
and FFN size; Marian decodes from ``decoder_start_token_id = pad_token_id``, so when ``tgt`` starts
with that token pass ``tgt_mask`` explicitly (ours would otherwise mask it as padding).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from aiayn.interop.bart_family import (
    NORM_EPS,
    config_fields_from_hf,
    config_fields_to_hf,
    need,
    output_bias_rule,
    stack_rules,
)
from aiayn.interop.common import Architecture, require_ours
from aiayn.interop.keymap import Rule, Transform, derived, permute_axis
from aiayn.models.config import EncoderDecoderConfig, TransformerConfig
from aiayn.nn.positional import sinusoid_table
from aiayn.tokenization.special import BOS_ID, EOS_ID

__all__ = ["MARIAN_MT", "marian_permutation"]

NAME = "MarianMTModel"


def marian_permutation(d_model: int) -> Tensor:
    """``perm`` with ``ours[..., j] = marian[..., perm[j]]``: Marian's [sin | cos] halves -> our interleaving."""
    n_sin = (d_model + 1) // 2  # Marian's "sentinel": sines fill columns 0..n_sin-1
    perm = torch.empty(d_model, dtype=torch.long)
    perm[0::2] = torch.arange(n_sin)
    perm[1::2] = n_sin + torch.arange(d_model - n_sin)
    return perm


def marian_rules(config: TransformerConfig) -> list[Rule]:
    assert isinstance(config, EncoderDecoderConfig)
    perm = marian_permutation(config.d_model)
    reads = permute_axis(1, perm)
    rules: list[Rule] = []
    if config.share_embeddings:
        tied = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight")
        rules.append(Rule("model.shared.weight", ("src_embed.weight",), reads, aliases=tied + _lm_head(config)))
    else:
        rules.append(Rule("model.encoder.embed_tokens.weight", ("src_embed.weight",), reads))
        rules.append(Rule("model.decoder.embed_tokens.weight", ("tgt_embed.weight",), reads, aliases=_lm_head(config)))
    if not config.tie_output:
        rules.append(Rule("lm_head.weight", ("output.weight",), reads))
    for stack, n_layers in (("encoder", config.n_encoder_layers), ("decoder", config.n_decoder_layers)):
        rules += stack_rules(stack, n_layers, reads=reads, writes=permute_axis(0, perm))
        # transformers does not save these (they are a function of the shape); old checkpoints hold them.
        rules.append(Rule(f"model.{stack}.embed_positions.weight", (), _sinusoids(perm), optional=True, export=False))
    rules.append(output_bias_rule(config))
    return rules


def _lm_head(config: EncoderDecoderConfig) -> tuple[str, ...]:
    return ("lm_head.weight",) if config.tie_output else ()


def _sinusoids(perm: Tensor) -> Transform:
    inverse = torch.argsort(perm)

    def check(t: Tensor) -> str | None:
        expected = sinusoid_table(t.shape[0], t.shape[1]).index_select(1, inverse)  # ours -> Marian's layout
        if t.shape[1] != perm.numel() or not torch.allclose(t.float(), expected, atol=1e-5):
            return "embed_positions is not Marian's sinusoid table (trained positions have no equivalent here)"
        return None

    return derived("sinusoids", check, None)


def marian_config_from_hf(hf: dict[str, Any], weights: Mapping[str, Tensor]) -> EncoderDecoderConfig:
    share = hf.get("share_encoder_decoder_embeddings", True)
    vocab = need(hf, "vocab_size", NAME)
    tgt_vocab = hf.get("decoder_vocab_size") or vocab
    return EncoderDecoderConfig(
        **config_fields_from_hf(hf, weights, NAME), vocab_size=vocab, positions="sinusoidal",
        tgt_vocab_size=None if share or tgt_vocab == vocab else tgt_vocab, share_embeddings=share,
    )


def marian_fits(config: TransformerConfig) -> str | None:
    if not isinstance(config, EncoderDecoderConfig):
        return f"{NAME} holds an encoder-decoder model, got {type(config).__name__}"
    if config.rope_base != 10000.0:
        return f"rope_base={config.rope_base!r}, but {NAME}'s sinusoids use base 10000"
    return require_ours(
        config, NAME, positions="sinusoidal", norm_position="post", has_final_norm=False, norm="layernorm",
        bias=True, norm_eps=NORM_EPS, n_kv_heads=(None, config.n_heads), embedding_norm=False,
    )


def marian_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    assert isinstance(config, EncoderDecoderConfig)
    return {
        "architectures": [NAME], "model_type": "marian", **config_fields_to_hf(config, NAME),
        "decoder_vocab_size": config.target_vocab_size, "share_encoder_decoder_embeddings": config.share_embeddings,
        "bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "decoder_start_token_id": BOS_ID, "forced_eos_token_id": None,
    }


MARIAN_MT = Architecture(
    name=NAME, model_type="marian", prefix="", config_from_hf=marian_config_from_hf,
    config_to_hf=marian_config_to_hf, rules=marian_rules, ignores=(), fits=marian_fits,
)
