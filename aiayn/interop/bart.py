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

from aiayn.interop.bart_family import NORM_EPS, config_fields_from_hf, config_fields_to_hf, need, output_bias_rule, stack_rules
from aiayn.interop.common import Architecture, require_ours, warn_training_only
from aiayn.interop.keymap import Rule, Transform
from aiayn.models.config import EncoderDecoderConfig, TransformerConfig

__all__ = ["BART"]

NAME = "BartForConditionalGeneration"
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
        rules += stack_rules(stack, n_layers)
    rules.append(output_bias_rule(config))
    return rules


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
    return {"architectures": [NAME], "model_type": "bart", **config_fields_to_hf(config, NAME)}


BART = Architecture(
    name=NAME, model_type="bart", prefix="", config_from_hf=bart_config_from_hf,
    config_to_hf=bart_config_to_hf, rules=bart_rules, ignores=(), fits=bart_fits,
)
