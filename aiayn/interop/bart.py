"""BART (``BartForConditionalGeneration``) <-> our encoder-decoder family.

BART is the paper's encoder-decoder with learned positions, GELU, unscaled embeddings and two
additions our config names: a LayerNorm on embeddings + positions on each side
(``embedding_norm``) and an output bias (``final_logits_bias``: ``output_bias``). Its layers use
Marian's table (transformers builds both from the same code) without Marian's reordering.

Not exact, and why: BART's position tables have two extra first rows (its positions start at 2);
they are never read, so they are dropped on import and written as zeros on export. Encoder and
decoder must share head count and FFN size (one ``n_heads``/``d_ff`` here). BART decodes from
``decoder_start_token_id`` (its EOS, 2): pass ``tgt`` starting with it. The tokenizer of a BART
directory carries it as its BOS, so every decoding path starts there, and encodes a source as
transformers does (``<s> x </s>``; :mod:`aiayn.tokenization.pretrained`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from aiayn.interop.bart_family import (
    NORM_EPS,
    bart_model_rules,
    config_fields_from_hf,
    config_fields_to_hf,
    learned_position_rule,
    need,
)
from aiayn.interop.common import Architecture, require_ours, warn_training_only
from aiayn.interop.keymap import Rule
from aiayn.models.config import EncoderDecoderConfig, TransformerConfig
from aiayn.tokenization.special import BOS_ID, EOS_ID

__all__ = ["BART"]

NAME = "BartForConditionalGeneration"


def bart_rules(config: TransformerConfig) -> list[Rule]:
    assert isinstance(config, EncoderDecoderConfig)
    return bart_model_rules(config, positions=learned_position_rule, final_norm=False)


def bart_config_from_hf(hf: dict[str, Any], weights: Mapping[str, Tensor]) -> EncoderDecoderConfig:
    if hf.get("classifier_dropout"):
        warn_training_only(NAME, f"classifier_dropout={hf['classifier_dropout']} has no use here; dropped")
    return EncoderDecoderConfig(
        **config_fields_from_hf(hf, weights, NAME), vocab_size=need(hf, "vocab_size", NAME), positions="learned",
        share_embeddings=True, embedding_norm=True,
    )


def bart_fits(config: TransformerConfig) -> str | None:
    if not isinstance(config, EncoderDecoderConfig):
        return f"{NAME} holds an encoder-decoder model, got {type(config).__name__}"
    return require_ours(
        config, NAME, positions="learned", norm_position="post", has_final_norm=False, norm="layernorm",
        bias=True, norm_eps=NORM_EPS, n_kv_heads=(None, config.n_heads), embedding_norm=True,
        share_embeddings=True,
    )


def bart_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    assert isinstance(config, EncoderDecoderConfig)
    # ours decode from our BOS (BartConfig's defaults, decoder start 2 and a forced EOS, are BART's own ids)
    return {
        "architectures": [NAME], "model_type": "bart", **config_fields_to_hf(config, NAME),
        "bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "decoder_start_token_id": BOS_ID, "forced_eos_token_id": None,
    }


BART = Architecture(
    name=NAME, model_type="bart", prefix="", config_from_hf=bart_config_from_hf,
    config_to_hf=bart_config_to_hf, rules=bart_rules, ignores=(), fits=bart_fits,
)
