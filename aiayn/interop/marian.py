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

from aiayn.interop.common import (
    Architecture,
    ConfigError,
    hf_activation,
    our_activation,
    require_ours,
    warn_training_only,
)
from aiayn.interop.keymap import COPY, Rule, Transform, derived, permute_axis
from aiayn.models.config import EncoderDecoderConfig, TransformerConfig
from aiayn.nn.positional import sinusoid_table
from aiayn.tokenization.special import BOS_ID, EOS_ID

__all__ = ["MARIAN_MT", "marian_permutation", "marian_layer_table", "bart_layer_table", "output_bias_rule"]

NAME = "MarianMTModel"
MARIAN_NORM_EPS = 1e-5  # Marian's LayerNorms use torch's default eps


def marian_permutation(d_model: int) -> Tensor:
    """``perm`` with ``ours[..., j] = marian[..., perm[j]]``: Marian's [sin | cos] halves -> our interleaving."""
    n_sin = (d_model + 1) // 2  # Marian's "sentinel": sines fill columns 0..n_sin-1
    perm = torch.empty(d_model, dtype=torch.long)
    perm[0::2] = torch.arange(n_sin)
    perm[1::2] = n_sin + torch.arange(d_model - n_sin)
    return perm


def marian_layer_table(perm: Tensor, *, cross: bool) -> tuple[tuple[str, str, Transform], ...]:
    """One layer, with Marian's residual basis reordered by ``perm`` (see the module docstring)."""
    return bart_layer_table(cross=cross, reads=permute_axis(1, perm), writes=permute_axis(0, perm))


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
        for i in range(n_layers):
            for theirs, ours, transform in marian_layer_table(perm, cross=stack == "decoder"):
                rules.append(Rule(f"model.{stack}.layers.{i}.{theirs}", (f"{stack}.layers.{i}.{ours}",), transform))
        # transformers does not save these (they are a function of the shape); old checkpoints hold them.
        rules.append(Rule(f"model.{stack}.embed_positions.weight", (), _sinusoids(perm), optional=True, export=False))
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
    for ours, (enc, dec) in {"n_heads": ("encoder_attention_heads", "decoder_attention_heads"),
                             "d_ff": ("encoder_ffn_dim", "decoder_ffn_dim")}.items():
        if _need(hf, enc) != _need(hf, dec):
            raise ConfigError(
                f"{NAME}: {enc}={hf[enc]} differs from {dec}={hf[dec]}; aiayn's encoder-decoder has one {ours}"
            )
    for key in ("encoder_layerdrop", "decoder_layerdrop"):
        if hf.get(key):
            warn_training_only(NAME, f"{key}={hf[key]} (LayerDrop) has no aiayn field; dropped")
    share = hf.get("share_encoder_decoder_embeddings", True)
    vocab = _need(hf, "vocab_size")
    tgt_vocab = hf.get("decoder_vocab_size") or vocab
    return EncoderDecoderConfig(
        vocab_size=vocab, tgt_vocab_size=None if share or tgt_vocab == vocab else tgt_vocab,
        n_encoder_layers=_need(hf, "encoder_layers"), n_decoder_layers=_need(hf, "decoder_layers"),
        d_model=_need(hf, "d_model"), n_heads=hf["encoder_attention_heads"], d_ff=hf["encoder_ffn_dim"],
        activation=our_activation(hf.get("activation_function", "gelu"), "activation_function", NAME),
        dropout=hf.get("dropout", 0.1), attention_dropout=hf.get("attention_dropout", 0.0),
        activation_dropout=hf.get("activation_dropout", 0.0), norm_eps=MARIAN_NORM_EPS, norm_position="post",
        positions="sinusoidal", max_len=_need(hf, "max_position_embeddings"),
        scale_embeddings=hf.get("scale_embedding", False), init_std=hf.get("init_std", 0.02),
        pad_id=hf.get("pad_token_id"), share_embeddings=share, tie_output=hf.get("tie_word_embeddings", True),
        output_bias=has_output_bias(weights),
    )


def marian_fits(config: TransformerConfig) -> str | None:
    if not isinstance(config, EncoderDecoderConfig):
        return f"{NAME} holds an encoder-decoder model, got {type(config).__name__}"
    if config.rope_base != 10000.0:
        return f"rope_base={config.rope_base!r}, but {NAME}'s sinusoids use base 10000"
    return require_ours(
        config, NAME, positions="sinusoidal", norm_position="post", has_final_norm=False, norm="layernorm",
        bias=True, norm_eps=MARIAN_NORM_EPS, n_kv_heads=(None, config.n_heads), embedding_norm=False,
    )


def marian_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    assert isinstance(config, EncoderDecoderConfig)
    return {
        "architectures": [NAME], "model_type": "marian", "vocab_size": config.vocab_size,
        "decoder_vocab_size": config.target_vocab_size, "share_encoder_decoder_embeddings": config.share_embeddings,
        "tie_word_embeddings": config.tie_output, "d_model": config.d_model,
        "encoder_layers": config.n_encoder_layers, "decoder_layers": config.n_decoder_layers,
        "encoder_attention_heads": config.n_heads, "decoder_attention_heads": config.n_heads,
        "encoder_ffn_dim": config.d_ff, "decoder_ffn_dim": config.d_ff,
        "activation_function": hf_activation(config.activation, NAME), "max_position_embeddings": config.max_len,
        "dropout": config.dropout, "attention_dropout": config.attention_dropout,
        "activation_dropout": config.activation_dropout, "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0,
        "scale_embedding": config.scale_embeddings, "init_std": config.init_std or 0.02,
        "pad_token_id": config.pad_id, "bos_token_id": BOS_ID, "eos_token_id": EOS_ID,
        "decoder_start_token_id": BOS_ID, "forced_eos_token_id": None, "is_encoder_decoder": True, "use_cache": True,
    }


def _need(hf: dict[str, Any], key: str) -> Any:
    if key not in hf:
        raise ConfigError(f"{NAME}: config.json lacks {key!r}")
    return hf[key]


MARIAN_MT = Architecture(
    name=NAME, model_type="marian", prefix="", config_from_hf=marian_config_from_hf,
    config_to_hf=marian_config_to_hf, rules=marian_rules, ignores=(), fits=marian_fits,
)
