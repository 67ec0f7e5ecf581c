"""GPT-2 (``GPT2LMHeadModel``) <-> our decoder-only family.

GPT-2 is our decoder-only model with learned positions, Pre-LN and a final norm, tanh-GELU, biases
everywhere, unscaled embeddings and a tied output. Its linears are transformers' ``Conv1D``, which
store ``(in, out)`` (ours: ``(out, in)``), and its query/key/value projections are one fused
``c_attn`` of width ``3 * d_model``.

A model of ours without biases (``bias=False``, the Shakespeare recipe's) exports as GPT-2 with every
bias zero (the same function); importing that back gives ``bias=True`` with zero biases.

Exact except for: GPT-2 has no padding token and never derives a mask from ``pad_token_id``, so
imports get ``pad_id=None`` (pass ``pad_mask`` explicitly, as one passes ``attention_mask``);
``embd_pdrop`` (when it differs from ``resid_pdrop``) has no field of ours: training only.
"""

from __future__ import annotations

from typing import Any

import torch

from aiayn.interop.common import (
    Architecture,
    ConfigError,
    hf_activation,
    layer_rules,
    our_activation,
    require,
    require_ours,
    warn_training_only,
)
from aiayn.interop.keymap import COPY, FUSED_QKV_BIAS, FUSED_QKV_CONV1D_WEIGHT, TRANSPOSE, Ignore, Rule, Transform, derived
from aiayn.models.config import DecoderOnlyConfig, TransformerConfig
from aiayn.tokenization.special import BOS_ID, EOS_ID

__all__ = ["GPT2_LM_HEAD", "GPT2_LAYER"]

NAME = "GPT2LMHeadModel"
QKV = ("self_attn.w_q", "self_attn.w_k", "self_attn.w_v")

# theirs (under h.{i}.) -> ours (under decoder.layers.{i}.)
GPT2_LAYER = (
    ("ln_1.weight", "self_attn_norm.weight", COPY),
    ("ln_1.bias", "self_attn_norm.bias", COPY),
    ("attn.c_attn.weight", tuple(f"{p}.weight" for p in QKV), FUSED_QKV_CONV1D_WEIGHT),
    ("attn.c_attn.bias", tuple(f"{p}.bias" for p in QKV), FUSED_QKV_BIAS),
    ("attn.c_proj.weight", "self_attn.w_o.weight", TRANSPOSE),
    ("attn.c_proj.bias", "self_attn.w_o.bias", COPY),
    ("ln_2.weight", "ffn_norm.weight", COPY),
    ("ln_2.bias", "ffn_norm.bias", COPY),
    ("mlp.c_fc.weight", "ffn.w_1.weight", TRANSPOSE),
    ("mlp.c_fc.bias", "ffn.w_1.bias", COPY),
    ("mlp.c_proj.weight", "ffn.w_2.weight", TRANSPOSE),
    ("mlp.c_proj.bias", "ffn.w_2.bias", COPY),
)

# Old checkpoints (the hub's gpt2) store the causal-mask buffers; transformers drops them too.
GPT2_IGNORES = (
    Ignore(r"h\.\d+\.attn\.(bias|masked_bias)", "causal-mask buffer of old transformers versions (not a weight)"),
)


def gpt2_rules(config: TransformerConfig) -> list[Rule]:
    assert isinstance(config, DecoderOnlyConfig)
    tied = config.tie_output
    rules = [
        Rule("wte.weight", ("embed.weight",), aliases=("lm_head.weight",) if tied else ()),
        Rule("wpe.weight", ("positions.weight",)),
        *layer_rules(GPT2_LAYER, config.n_layers, "h.{i}.", "decoder.layers.{i}."),
        Rule("ln_f.weight", ("decoder.norm.weight",)),
        Rule("ln_f.bias", ("decoder.norm.bias",)),
    ]
    if not config.bias:  # ours has no biases (nanoGPT's bias=False): GPT-2 holds it with every bias zero
        widths = {"attn.c_attn.bias": 3 * config.d_model, "mlp.c_fc.bias": config.d_ff}
        rules = [
            Rule(r.theirs, (), _zero_bias(r.theirs, widths.get(r.theirs.split(".", 2)[-1], config.d_model)))
            if r.theirs.endswith(".bias") else r
            for r in rules
        ]
    if not tied:
        rules.append(Rule("lm_head.weight", ("output.weight",)))
    return rules


def _zero_bias(key: str, width: int) -> Transform:
    """A GPT-2 bias that our bias-free model holds as zero: written as zeros, refused on import unless zero."""
    return derived(
        "zero-bias",
        lambda t: None if not t.any() else f"{key} is not zero, but the model has bias=False",
        lambda: torch.zeros(width),
    )


def gpt2_config_from_hf(hf: dict[str, Any]) -> DecoderOnlyConfig:
    require(hf, "scale_attn_weights", (True,), NAME, "attention scores are always scaled by 1/sqrt(head size)")
    require(hf, "scale_attn_by_inverse_layer_idx", (False,), NAME)
    require(hf, "add_cross_attention", (False,), NAME)
    resid, embd = hf.get("resid_pdrop", 0.1), hf.get("embd_pdrop", 0.1)
    if embd != resid:
        warn_training_only(NAME, f"embd_pdrop={embd} differs from resid_pdrop={resid}; both become dropout={resid}")
    d_model = _need(hf, "n_embd")
    return DecoderOnlyConfig(
        vocab_size=_need(hf, "vocab_size"), n_layers=_need(hf, "n_layer"), d_model=d_model, n_heads=_need(hf, "n_head"),
        d_ff=hf.get("n_inner") or 4 * d_model, dropout=resid, attention_dropout=hf.get("attn_pdrop", 0.1),
        activation=our_activation(hf.get("activation_function", "gelu_new"), "activation_function", NAME),
        norm_eps=hf.get("layer_norm_epsilon", 1e-5), norm_position="pre", positions="learned",
        max_len=_need(hf, "n_positions"), scale_embeddings=False, init_std=hf.get("initializer_range", 0.02),
        pad_id=None, tie_output=hf.get("tie_word_embeddings", True),
    )


def gpt2_fits(config: TransformerConfig) -> str | None:
    if not isinstance(config, DecoderOnlyConfig):
        return f"{NAME} holds a decoder-only model, got {type(config).__name__}"
    return require_ours(
        config, NAME, positions="learned", norm_position="pre", has_final_norm=True, norm="layernorm", bias=(True, False),
        scale_embeddings=False, n_kv_heads=(None, config.n_heads), activation=("gelu_tanh", "gelu", "relu"),
    )


def gpt2_config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    assert isinstance(config, DecoderOnlyConfig)
    if config.activation_dropout:
        warn_training_only(NAME, f"activation_dropout={config.activation_dropout} has no GPT-2 field; dropped")
    return {
        "architectures": [NAME], "model_type": "gpt2", "vocab_size": config.vocab_size, "n_positions": config.max_len,
        "n_embd": config.d_model, "n_layer": config.n_layers, "n_head": config.n_heads, "n_inner": config.d_ff,
        "activation_function": hf_activation(config.activation, NAME), "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout, "attn_pdrop": config.attention_dropout, "layer_norm_epsilon": config.norm_eps,
        "initializer_range": config.init_std or 0.02, "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False, "add_cross_attention": False,
        "tie_word_embeddings": config.tie_output, "bos_token_id": BOS_ID, "eos_token_id": EOS_ID,
        "pad_token_id": config.pad_id, "use_cache": True,
    }


def _need(hf: dict[str, Any], key: str) -> Any:
    if key not in hf:
        raise ConfigError(f"{NAME}: config.json lacks {key!r}")
    return hf[key]


GPT2_LM_HEAD = Architecture(
    name=NAME, model_type="gpt2", prefix="transformer", config_from_hf=lambda hf, weights: gpt2_config_from_hf(hf),
    config_to_hf=gpt2_config_to_hf, rules=gpt2_rules, ignores=GPT2_IGNORES, fits=gpt2_fits, heads=("lm_head.",),
)
