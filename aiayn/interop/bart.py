"""BART (``BartForConditionalGeneration``) <-> our encoder-decoder family.

BART is the paper's encoder-decoder with learned positions, GELU, unscaled embeddings and two
additions our config names: a LayerNorm on embeddings + positions on each side
(``embedding_norm``) and an output bias (``final_logits_bias``: ``output_bias``). Its layers use
Marian's table (transformers builds both from the same code) without Marian's reordering.

Not exact, and why: BART's position tables have two extra first rows (its positions start at 2);
they are never read, so they are dropped on import and written as zeros on export. Encoder and
decoder must share head count and FFN size (one ``n_heads``/``d_ff`` here). BART decodes from
``decoder_start_token_id`` (its EOS, 2): pass ``tgt`` starting with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from aiayn.interop.common import (
    Architecture,
    ConfigError,
    hf_activation,
    our_activation,
    require_ours,
    warn_training_only,
)
from aiayn.interop.keymap import Rule, Transform
from aiayn.interop.marian import bart_layer_table, has_output_bias, output_bias_rule
from aiayn.models.config import EncoderDecoderConfig, TransformerConfig

__all__ = ["BART"]

NAME = "BartForConditionalGeneration"
BART_NORM_EPS = 1e-5  # torch's default LayerNorm eps
POSITION_OFFSET = 2  # BART's learned positions start at row 2


def _positions() -> Transform:
    """BART's ``(max_len + 2, D)`` table <-> our ``(max_len, D)``: rows 0 and 1 are never read."""
    return Transform(
        "drop-2-rows",
        lambda t: (t[POSITION_OFFSET:].contiguous(),),
        lambda t: torch.cat([t.new_zeros(POSITION_OFFSET, t.shape[1]), t]),
    )


def bart_rules(config: TransformerConfig) -> list[Rule]:
    assert isinstance(config, EncoderDecoderConfig)
    tied = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight")
    lm_head = ("lm_head.weight",) if config.tie_output else ()
    rules = [Rule("model.shared.weight", ("src_embed.weight",), aliases=tied + lm_head)]
    if not config.tie_output:
        rules.append(Rule("lm_head.weight", ("output.weight",)))
    for stack, side, n_layers in (("encoder", "src", config.n_encoder_layers), ("decoder", "tgt", config.n_decoder_layers)):
        rules.append(Rule(f"model.{stack}.embed_positions.weight", (f"{side}_positions.weight",), _positions()))
        for part in ("weight", "bias"):
            rules.append(Rule(f"model.{stack}.layernorm_embedding.{part}", (f"{side}_embed_norm.{part}",)))
        for i in range(n_layers):
            for theirs, ours, transform in bart_layer_table(cross=stack == "decoder"):
                rules.append(Rule(f"model.{stack}.layers.{i}.{theirs}", (f"{stack}.layers.{i}.{ours}",), transform))
    rules.append(output_bias_rule(config))
    return rules


def bart_config_from_hf(hf: dict[str, Any], weights: Mapping[str, Tensor]) -> EncoderDecoderConfig:
    for ours, (enc, dec) in {"n_heads": ("encoder_attention_heads", "decoder_attention_heads"),
                             "d_ff": ("encoder_ffn_dim", "decoder_ffn_dim")}.items():
        if _need(hf, enc) != _need(hf, dec):
            raise ConfigError(f"{NAME}: {enc}={hf[enc]} differs from {dec}={hf[dec]}; aiayn's encoder-decoder has one {ours}")
    for key in ("encoder_layerdrop", "decoder_layerdrop"):
        if hf.get(key):
            warn_training_only(NAME, f"{key}={hf[key]} (LayerDrop) has no aiayn field; dropped")
    if hf.get("classifier_dropout"):
        warn_training_only(NAME, f"classifier_dropout={hf['classifier_dropout']} has no use here; dropped")
    return EncoderDecoderConfig(
        vocab_size=_need(hf, "vocab_size"), n_encoder_layers=_need(hf, "encoder_layers"),
        n_decoder_layers=_need(hf, "decoder_layers"), d_model=_need(hf, "d_model"),
        n_heads=hf["encoder_attention_heads"], d_ff=hf["encoder_ffn_dim"],
        activation=our_activation(hf.get("activation_function", "gelu"), "activation_function", NAME),
        dropout=hf.get("dropout", 0.1), attention_dropout=hf.get("attention_dropout", 0.0),
        activation_dropout=hf.get("activation_dropout", 0.0), norm_eps=BART_NORM_EPS, norm_position="post",
        positions="learned", max_len=_need(hf, "max_position_embeddings"),
        scale_embeddings=hf.get("scale_embedding", False), init_std=hf.get("init_std", 0.02),
        pad_id=hf.get("pad_token_id"), share_embeddings=True, tie_output=hf.get("tie_word_embeddings", True),
        embedding_norm=True, output_bias=has_output_bias(weights),
    )


def bart_fits(config: TransformerConfig) -> str | None:
    if not isinstance(config, EncoderDecoderConfig):
        return f"{NAME} holds an encoder-decoder model, got {type(config).__name__}"
    return require_ours(
        config, NAME, positions="learned", norm_position="post", has_final_norm=False, norm="layernorm",
        bias=True, norm_eps=BART_NORM_EPS, n_kv_heads=(None, config.n_heads), embedding_norm=True,
        share_embeddings=True,
    )


def bart_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    assert isinstance(config, EncoderDecoderConfig)
    return {
        "architectures": [NAME], "model_type": "bart", "vocab_size": config.vocab_size,
        "tie_word_embeddings": config.tie_output, "d_model": config.d_model,
        "encoder_layers": config.n_encoder_layers, "decoder_layers": config.n_decoder_layers,
        "encoder_attention_heads": config.n_heads, "decoder_attention_heads": config.n_heads,
        "encoder_ffn_dim": config.d_ff, "decoder_ffn_dim": config.d_ff,
        "activation_function": hf_activation(config.activation, NAME), "max_position_embeddings": config.max_len,
        "dropout": config.dropout, "attention_dropout": config.attention_dropout,
        "activation_dropout": config.activation_dropout, "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0,
        "scale_embedding": config.scale_embeddings, "init_std": config.init_std or 0.02,
        "pad_token_id": config.pad_id, "is_encoder_decoder": True, "use_cache": True,
    }


def _need(hf: dict[str, Any], key: str) -> Any:
    if key not in hf:
        raise ConfigError(f"{NAME}: config.json lacks {key!r}")
    return hf[key]


BART = Architecture(
    name=NAME, model_type="bart", prefix="", config_from_hf=bart_config_from_hf,
    config_to_hf=bart_config_to_hf, rules=bart_rules, ignores=(), fits=bart_fits,
)
