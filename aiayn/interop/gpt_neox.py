"""GPT-NeoX (``GPTNeoXForCausalLM``) <-> our rotary decoder-only model (the Shakespeare recipe with
``positions: rotary``).

GPT-NeoX with ``use_parallel_residual=False`` and ``partial_rotary_factor=1`` is our decoder-only
model with rotary positions (the same half-split layout), Pre-LN, a final norm and unscaled
embeddings. Its query/key/value are one fused linear whose rows are grouped *per head*
(``[q_h | k_h | v_h]`` for each head ``h``), unlike GPT-2's ``[q | k | v]``.

A model of ours without biases (``bias=False``) exports with every bias zero (NeoX's MLP and
LayerNorms always have them; ``attention_bias=False`` drops the attention ones); importing that
back gives ``bias=False`` again (every bias zero and ``attention_bias=False``).
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
    layer_rules,
    our_activation,
    require,
    require_ours,
)
from aiayn.interop.keymap import COPY, Ignore, Rule, Transform, derived
from aiayn.models.config import DecoderOnlyConfig, TransformerConfig

__all__ = ["GPT_NEOX_CAUSAL_LM"]

NAME = "GPTNeoXForCausalLM"
QKV = ("self_attn.w_q", "self_attn.w_k", "self_attn.w_v")


def _per_head_qkv(n_heads: int) -> Transform:
    """NeoX's fused ``(3D, ...)`` = per head ``[q_h | k_h | v_h]`` <-> our three ``(D, ...)`` tensors."""

    def to_ours(t: Tensor) -> tuple[Tensor, ...]:
        grouped = t.reshape(n_heads, 3, t.shape[0] // (3 * n_heads), *t.shape[1:])  # (H, 3, Dh, ...)
        return tuple(grouped[:, j].reshape(-1, *t.shape[1:]).contiguous() for j in range(3))

    def to_theirs(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        parts = [x.reshape(n_heads, x.shape[0] // n_heads, *x.shape[1:]) for x in (q, k, v)]  # 3 x (H, Dh, ...)
        return torch.stack(parts, dim=1).reshape(-1, *q.shape[1:]).contiguous()

    return Transform("per-head-qkv", to_ours, to_theirs)


def _rules(config: TransformerConfig) -> list[Rule]:
    assert isinstance(config, DecoderOnlyConfig)
    qkv = _per_head_qkv(config.n_heads)
    table: tuple[tuple[str, Any, Transform], ...] = (
        ("input_layernorm.weight", "self_attn_norm.weight", COPY),
        ("input_layernorm.bias", "self_attn_norm.bias", COPY),
        ("attention.query_key_value.weight", tuple(f"{p}.weight" for p in QKV), qkv),
        ("attention.query_key_value.bias", tuple(f"{p}.bias" for p in QKV), qkv),
        ("attention.dense.weight", "self_attn.w_o.weight", COPY),
        ("attention.dense.bias", "self_attn.w_o.bias", COPY),
        ("post_attention_layernorm.weight", "ffn_norm.weight", COPY),
        ("post_attention_layernorm.bias", "ffn_norm.bias", COPY),
        ("mlp.dense_h_to_4h.weight", "ffn.w_1.weight", COPY),
        ("mlp.dense_h_to_4h.bias", "ffn.w_1.bias", COPY),
        ("mlp.dense_4h_to_h.weight", "ffn.w_2.weight", COPY),
        ("mlp.dense_4h_to_h.bias", "ffn.w_2.bias", COPY),
    )
    if not config.bias:  # attention biases absent (attention_bias=False); the others zero
        table = tuple(row for row in table if not (row[0].startswith("attention.") and row[0].endswith(".bias")))
    tied = config.tie_output
    rules = [
        Rule("embed_in.weight", ("embed.weight",), aliases=("lm_head.weight",) if tied else ()),
        *layer_rules(table, config.n_layers, "layers.{i}.", "decoder.layers.{i}."),
        Rule("final_layer_norm.weight", ("decoder.norm.weight",)),
        Rule("final_layer_norm.bias", ("decoder.norm.bias",)),
    ]
    if not tied:
        rules.append(Rule("lm_head.weight", ("output.weight",), aliases=("embed_out.weight",)))
    if not config.bias:
        width = {"mlp.dense_h_to_4h.bias": config.d_ff}
        rules = [
            Rule(r.theirs, (), _zero(r.theirs, width.get(r.theirs.split(".", 2)[-1], config.d_model)))
            if r.theirs.endswith(".bias") else r
            for r in rules
        ]
    return rules


def _zero(key: str, width: int) -> Transform:
    return derived("zero-bias", lambda t: None if not t.any() else f"{key} is not zero, but the model has bias=False",
                   lambda: torch.zeros(width))


def _config_from_hf(hf: dict[str, Any], weights: Mapping[str, Tensor]) -> DecoderOnlyConfig:
    """``weights``: with ``attention_bias=False``, the other biases must be zero (our ``bias=False``)."""
    require(hf, "use_parallel_residual", (False,), NAME, "aiayn's layers add attention, then the MLP (sequential residuals)")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    fraction = rope.get("partial_rotary_factor", hf.get("rotary_pct", 0.25))
    if fraction != 1.0:
        raise ConfigError(f"{NAME}: partial_rotary_factor={fraction} is not supported; aiayn rotates the whole head (1.0)")
    if rope.get("rope_type", "default") != "default":
        raise ConfigError(f"{NAME}: rope_type={rope['rope_type']!r} is not supported; aiayn has plain rotary ('default')")
    bias = hf.get("attention_bias", True)
    if not bias and any(k.endswith(".bias") and v.any() for k, v in weights.items()):
        raise ConfigError(f"{NAME}: attention_bias=False with nonzero MLP or LayerNorm biases has no exact equivalent "
                          "in aiayn (bias is one field: all biases, or none)")
    return DecoderOnlyConfig(
        vocab_size=hf["vocab_size"], n_layers=hf["num_hidden_layers"], d_model=hf["hidden_size"],
        n_heads=hf["num_attention_heads"], d_ff=hf["intermediate_size"],
        activation=our_activation(hf.get("hidden_act", "gelu"), "hidden_act", NAME),
        dropout=hf.get("hidden_dropout", 0.0), attention_dropout=hf.get("attention_dropout", 0.0),
        norm_eps=hf.get("layer_norm_eps", 1e-5), norm_position="pre", positions="rotary",
        rope_base=float(rope.get("rope_theta", hf.get("rotary_emb_base", 10000.0))), max_len=hf.get("max_position_embeddings", 2048),
        scale_embeddings=False, init_std=hf.get("initializer_range", 0.02), pad_id=None, bias=bool(bias),
        tie_output=hf.get("tie_word_embeddings", False),
    )


def _fits(config: TransformerConfig) -> str | None:
    if not isinstance(config, DecoderOnlyConfig):
        return f"{NAME} holds a decoder-only model, got {type(config).__name__}"
    return require_ours(
        config, NAME, positions="rotary", norm_position="pre", has_final_norm=True, norm="layernorm",
        scale_embeddings=False, n_kv_heads=(None, config.n_heads), activation=("gelu", "gelu_tanh", "relu"),
    )


def _config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    assert isinstance(config, DecoderOnlyConfig)
    return {
        "architectures": [NAME], "model_type": "gpt_neox", "vocab_size": config.vocab_size, "hidden_size": config.d_model,
        "num_hidden_layers": config.n_layers, "num_attention_heads": config.n_heads, "intermediate_size": config.d_ff,
        "hidden_act": hf_activation(config.activation, NAME), "hidden_dropout": config.dropout,
        "attention_dropout": config.attention_dropout, "layer_norm_eps": config.norm_eps,
        "max_position_embeddings": config.max_len, "initializer_range": config.init_std or 0.02,
        "use_parallel_residual": False, "attention_bias": config.bias, "tie_word_embeddings": config.tie_output,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_base, "partial_rotary_factor": 1.0},
        "rotary_pct": 1.0, "rotary_emb_base": config.rope_base, "use_cache": True,
    }


GPT_NEOX_CAUSAL_LM = Architecture(
    name=NAME, model_type="gpt_neox", prefix="gpt_neox", config_from_hf=_config_from_hf,
    config_to_hf=_config_to_hf, rules=_rules,
    ignores=(Ignore(r"layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)", "buffers of old transformers versions"),),
    fits=_fits, heads=("lm_head.", "embed_out."),
)
