"""What transformers' BART family (``BartForConditionalGeneration``, ``MarianMTModel``) shares: one
layer layout, the output bias, and most config fields. Used by :mod:`aiayn.interop.bart` and
:mod:`aiayn.interop.marian`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from aiayn.interop.common import ConfigError, hf_activation, layer_rules, our_activation, warn_training_only
from aiayn.interop.keymap import COPY, Rule, Transform, derived
from aiayn.models.config import EncoderDecoderConfig

__all__ = [
    "bart_layer_table", "stack_rules", "output_bias_rule", "has_output_bias", "config_fields_from_hf", "config_fields_to_hf", "need",
    "POSITION_OFFSET", "learned_position_rule", "bart_model_rules",
]

NORM_EPS = 1e-5  # their LayerNorms use torch's default eps
POSITION_OFFSET = 2  # BART's and mBART's learned positions start at row 2; rows 0 and 1 are never read


OFFSET_POSITIONS = Transform(
    "drop-2-rows",
    lambda t: (t[POSITION_OFFSET:].contiguous(),),
    lambda t: torch.cat([t.new_zeros(POSITION_OFFSET, t.shape[1]), t]),
)


def learned_position_rule(theirs: str, side: str) -> Rule:
    """A BART-style ``(max_len + 2, D)`` position table <-> our ``{side}_positions`` ``(max_len, D)``: rows 0
    and 1 are dropped on import and written as zeros on export."""
    return Rule(theirs, (f"{side}_positions.weight",), OFFSET_POSITIONS)


def bart_layer_table(
    *, cross: bool, reads: Transform = COPY, writes: Transform = COPY
) -> tuple[tuple[str, str, Transform], ...]:
    """One layer of transformers' BART family (BART, Marian): theirs (under
    ``model.{encoder,decoder}.layers.{i}.``) -> ours (under ``{encoder,decoder}.layers.{i}.``).

    ``reads`` transforms the matrices whose input is the residual stream, ``writes`` those whose
    output is (and their biases, and the norms, which act on the stream).
    """
    attention = [("self_attn", "self_attn", "self_attn_layer_norm", "self_attn_norm")]
    if cross:
        attention.append(("encoder_attn", "cross_attn", "encoder_attn_layer_norm", "cross_attn_norm"))
    table: list[tuple[str, str, Transform]] = []
    for theirs, ours, theirs_norm, ours_norm in attention:
        for proj, w in (("q_proj", "w_q"), ("k_proj", "w_k"), ("v_proj", "w_v")):
            table += [(f"{theirs}.{proj}.weight", f"{ours}.{w}.weight", reads), (f"{theirs}.{proj}.bias", f"{ours}.{w}.bias", COPY)]
        table += [
            (f"{theirs}.out_proj.weight", f"{ours}.w_o.weight", writes),
            (f"{theirs}.out_proj.bias", f"{ours}.w_o.bias", writes),
            (f"{theirs_norm}.weight", f"{ours_norm}.weight", writes),
            (f"{theirs_norm}.bias", f"{ours_norm}.bias", writes),
        ]
    table += [
        ("fc1.weight", "ffn.w_1.weight", reads),
        ("fc1.bias", "ffn.w_1.bias", COPY),
        ("fc2.weight", "ffn.w_2.weight", writes),
        ("fc2.bias", "ffn.w_2.bias", writes),
        ("final_layer_norm.weight", "ffn_norm.weight", writes),
        ("final_layer_norm.bias", "ffn_norm.bias", writes),
    ]
    return tuple(table)


def stack_rules(stack: str, n_layers: int, *, reads: Transform = COPY, writes: Transform = COPY) -> list[Rule]:
    """The layer rules of ``stack`` (``"encoder"`` or ``"decoder"``, which adds cross-attention)."""
    table = bart_layer_table(cross=stack == "decoder", reads=reads, writes=writes)
    return layer_rules(table, n_layers, f"model.{stack}.layers.{{i}}.", f"{stack}.layers.{{i}}.")


def bart_model_rules(config: EncoderDecoderConfig, *, positions: Callable[[str, str], Rule], final_norm: bool) -> list[Rule]:
    """BART and mBART: one shared embedding (tied with the head unless ``tie_output`` is off), then per stack
    its positions (``positions(their_key, side)`` with side ``"src"``/``"tgt"``), its embedding norm, mBART's
    final ``layer_norm`` when ``final_norm``, its layers; and the output bias."""
    tied = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight")
    lm_head = ("lm_head.weight",) if config.tie_output else ()
    rules = [Rule("model.shared.weight", ("src_embed.weight",), aliases=tied + lm_head)]
    if not config.tie_output:
        rules.append(Rule("lm_head.weight", ("output.weight",)))
    for stack, side, n_layers in (("encoder", "src", config.n_encoder_layers), ("decoder", "tgt", config.n_decoder_layers)):
        rules.append(positions(f"model.{stack}.embed_positions.weight", side))
        for part in ("weight", "bias"):
            rules.append(Rule(f"model.{stack}.layernorm_embedding.{part}", (f"{side}_embed_norm.{part}",)))
            if final_norm:
                rules.append(Rule(f"model.{stack}.layer_norm.{part}", (f"{stack}.norm.{part}",)))
        rules += stack_rules(stack, n_layers)
    rules.append(output_bias_rule(config))
    return rules


def has_output_bias(weights: Mapping[str, Tensor]) -> bool:
    """A non-zero ``final_logits_bias`` needs ``output_bias=True``; a zero one (opus-mt, BART) does not."""
    bias = weights.get("final_logits_bias")
    return bias is not None and bool(bias.any())


LOGITS_BIAS = Transform("row-to-vector", lambda t: (t.reshape(-1),), lambda t: t.reshape(1, -1))


def output_bias_rule(config: EncoderDecoderConfig) -> Rule:
    """BART-family ``final_logits_bias (1, V)`` <-> our ``output.bias (V,)``; all zeros without one."""
    if config.output_bias:
        return Rule("final_logits_bias", ("output.bias",), LOGITS_BIAS)
    vocab = config.target_vocab_size
    zero_bias = derived(
        "zero-logits-bias",
        lambda t: None if not t.any() else "final_logits_bias is non-zero: import with output_bias=True",
        lambda: torch.zeros(1, vocab),
    )
    return Rule("final_logits_bias", (), zero_bias, optional=True)


def config_fields_from_hf(hf: dict[str, Any], weights: Mapping[str, Tensor], name: str) -> dict[str, Any]:
    """The ``EncoderDecoderConfig`` fields both read alike (not: vocabularies, positions, sharing)."""
    for ours, (enc, dec) in {"n_heads": ("encoder_attention_heads", "decoder_attention_heads"),
                             "d_ff": ("encoder_ffn_dim", "decoder_ffn_dim")}.items():
        if need(hf, enc, name) != need(hf, dec, name):
            raise ConfigError(f"{name}: {enc}={hf[enc]} differs from {dec}={hf[dec]}; aiayn's encoder-decoder has one {ours}")
    for key in ("encoder_layerdrop", "decoder_layerdrop"):
        if hf.get(key):
            warn_training_only(name, f"{key}={hf[key]} (LayerDrop) has no aiayn field; dropped")
    return dict(
        n_encoder_layers=need(hf, "encoder_layers", name), n_decoder_layers=need(hf, "decoder_layers", name),
        d_model=need(hf, "d_model", name), n_heads=hf["encoder_attention_heads"], d_ff=hf["encoder_ffn_dim"],
        activation=our_activation(hf.get("activation_function", "gelu"), "activation_function", name),
        dropout=hf.get("dropout", 0.1), attention_dropout=hf.get("attention_dropout", 0.0),
        activation_dropout=hf.get("activation_dropout", 0.0), norm_eps=NORM_EPS, norm_position="post",
        max_len=need(hf, "max_position_embeddings", name), scale_embeddings=hf.get("scale_embedding", False),
        init_std=hf.get("init_std", 0.02), pad_id=hf.get("pad_token_id"),
        tie_output=hf.get("tie_word_embeddings", True), output_bias=has_output_bias(weights),
    )


def config_fields_to_hf(config: EncoderDecoderConfig, name: str) -> dict[str, Any]:
    """The ``config.json`` fields both write alike."""
    return {
        "vocab_size": config.vocab_size, "tie_word_embeddings": config.tie_output, "d_model": config.d_model,
        "encoder_layers": config.n_encoder_layers, "decoder_layers": config.n_decoder_layers,
        "encoder_attention_heads": config.n_heads, "decoder_attention_heads": config.n_heads,
        "encoder_ffn_dim": config.d_ff, "decoder_ffn_dim": config.d_ff,
        "activation_function": hf_activation(config.activation, name), "max_position_embeddings": config.max_len,
        "dropout": config.dropout, "attention_dropout": config.attention_dropout,
        "activation_dropout": config.activation_dropout, "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0,
        "scale_embedding": config.scale_embeddings, "init_std": config.init_std or 0.02,
        "pad_token_id": config.pad_id, "is_encoder_decoder": True, "use_cache": True,
    }


def need(hf: dict[str, Any], key: str, name: str) -> Any:
    if key not in hf:
        raise ConfigError(f"{name}: config.json lacks {key!r}")
    return hf[key]
