"""mBART (``MBartForConditionalGeneration``) <-> our Pre-LN encoder-decoder (the Multi30k recipes' model).

mBART is BART made Pre-LN: the same layer table (transformers builds both from the same code), a
LayerNorm on embeddings + positions on each side (``embedding_norm``), a final LayerNorm after each
stack (``layer_norm``: our ``has_final_norm``), embeddings scaled by sqrt(d_model) when
``scale_embedding``, and an output bias (``final_logits_bias``: ``output_bias``).

Positions: mBART's table is learned, with two extra first rows (its positions start at 2) that are
never read. A learned table of ours maps onto rows 2.. directly; a sinusoidal model of ours (the
recipes') is written as its sinusoid table, which mBART then holds as learned weights. On import, a
table equal to the sinusoids (within 1e-6) comes back as ``positions: sinusoidal``, so a round trip
gives back the same config. Decoding starts from ``decoder_start_token_id``: ours writes the model's
BOS there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from aiayn.interop.bart_family import (
    NORM_EPS,
    POSITION_OFFSET,
    bart_model_rules,
    config_fields_from_hf,
    config_fields_to_hf,
    learned_position_rule,
    need,
)
from aiayn.interop.common import Architecture, require_ours
from aiayn.interop.keymap import Rule, Transform, derived
from aiayn.models.config import EncoderDecoderConfig, TransformerConfig
from aiayn.nn.positional import sinusoid_table
from aiayn.tokenization.special import BOS_ID, EOS_ID

__all__ = ["MBART"]

NAME = "MBartForConditionalGeneration"
SINUSOID_ATOL = 1e-6


def _sinusoid_positions(config: EncoderDecoderConfig) -> Transform:
    """Our sinusoids (no weights of ours) written as mBART's learned table; on import, checked equal."""

    def check(t: Tensor) -> str | None:
        return None if _holds_sinusoids(t, config.rope_base) else "embed_positions is not the sinusoid table"

    def make() -> Tensor:
        table = sinusoid_table(config.max_len, config.d_model, base=config.rope_base)
        return torch.cat([table.new_zeros(POSITION_OFFSET, config.d_model), table])

    return derived("sinusoids", check, make)


def _holds_sinusoids(table: Tensor, base: float = 10000.0) -> bool:
    rows = table[POSITION_OFFSET:].float()
    expected = sinusoid_table(rows.shape[0], rows.shape[1], base=base)
    return bool((rows - expected).abs().max() <= SINUSOID_ATOL)


def mbart_rules(config: TransformerConfig) -> list[Rule]:
    assert isinstance(config, EncoderDecoderConfig)
    if config.positions != "sinusoidal":
        return bart_model_rules(config, positions=learned_position_rule, final_norm=True)
    sinusoids = _sinusoid_positions(config)  # no weights of ours: derived on export, checked on import
    return bart_model_rules(config, positions=lambda theirs, side: Rule(theirs, (), sinusoids), final_norm=True)


def mbart_config_from_hf(hf: dict[str, Any], weights: Mapping[str, Tensor]) -> EncoderDecoderConfig:
    table = weights.get("model.encoder.embed_positions.weight")
    decoder_table = weights.get("model.decoder.embed_positions.weight")
    sinusoidal = all(t is not None and _holds_sinusoids(t) for t in (table, decoder_table))
    fields = {**config_fields_from_hf(hf, weights, NAME), "norm_position": "pre"}
    return EncoderDecoderConfig(
        **fields, vocab_size=need(hf, "vocab_size", NAME), positions="sinusoidal" if sinusoidal else "learned",
        share_embeddings=True, embedding_norm=True,
    )


def mbart_fits(config: TransformerConfig) -> str | None:
    if not isinstance(config, EncoderDecoderConfig):
        return f"{NAME} holds an encoder-decoder model, got {type(config).__name__}"
    return require_ours(
        config, NAME, positions=("sinusoidal", "learned"), norm_position="pre", has_final_norm=True, norm="layernorm",
        bias=True, norm_eps=NORM_EPS, n_kv_heads=(None, config.n_heads), embedding_norm=True, share_embeddings=True,
    )


def mbart_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    assert isinstance(config, EncoderDecoderConfig)
    return {
        "architectures": [NAME], "model_type": "mbart", **config_fields_to_hf(config, NAME),
        "bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "decoder_start_token_id": BOS_ID, "forced_eos_token_id": None,
    }


MBART = Architecture(
    name=NAME, model_type="mbart", prefix="", config_from_hf=mbart_config_from_hf,
    config_to_hf=mbart_config_to_hf, rules=mbart_rules, ignores=(), fits=mbart_fits,
)
