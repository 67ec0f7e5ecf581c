"""RoBERTa-PreLayerNorm (``RobertaPreLayerNormModel``, ``...ForMaskedLM``, ``...ForSequenceClassification``)
<-> our Pre-LN encoder-only family (the SST-2 recipes' model).

It is BERT with Pre-LN layers and one final LayerNorm, which is our encoder-only model with
``norm_position="pre"``: normalised embeddings, learned positions and segments, unscaled embeddings.
Two differences of layout, not arithmetic:

* RoBERTa numbers positions from ``pad_token_id + 1`` (``create_position_ids_from_input_ids``):
  our position ``i`` is their row ``pad_id + 1 + i``, so the table gets ``pad_id + 1`` leading rows
  (zero on export; only padding tokens, which nothing attends to, read them).
* The classification head is ``classifier.dense`` + tanh + ``classifier.out_proj`` on ``<s>``, which
  is our pooler + classifier on [CLS].

Not exact, and why: a model with both a masked-LM head and a classifier has no single class (export
one head); importing drops the leading position rows (so a round trip from transformers zeroes them).
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
from aiayn.interop.keymap import COPY, Ignore, Rule, Transform
from aiayn.models.config import EncoderOnlyConfig, TransformerConfig

__all__ = ["ROBERTA_PRELN_ARCHITECTURES"]

MODEL_TYPE = "roberta-prelayernorm"
PREFIX = "roberta_prelayernorm"

# theirs (under encoder.layer.{i}.) -> ours (under encoder.layers.{i}.): the norms sit before each sublayer.
LAYER = (
    ("attention.LayerNorm.weight", "self_attn_norm.weight", COPY),
    ("attention.LayerNorm.bias", "self_attn_norm.bias", COPY),
    ("attention.self.query.weight", "self_attn.w_q.weight", COPY),
    ("attention.self.query.bias", "self_attn.w_q.bias", COPY),
    ("attention.self.key.weight", "self_attn.w_k.weight", COPY),
    ("attention.self.key.bias", "self_attn.w_k.bias", COPY),
    ("attention.self.value.weight", "self_attn.w_v.weight", COPY),
    ("attention.self.value.bias", "self_attn.w_v.bias", COPY),
    ("attention.output.dense.weight", "self_attn.w_o.weight", COPY),
    ("attention.output.dense.bias", "self_attn.w_o.bias", COPY),
    ("intermediate.LayerNorm.weight", "ffn_norm.weight", COPY),
    ("intermediate.LayerNorm.bias", "ffn_norm.bias", COPY),
    ("intermediate.dense.weight", "ffn.w_1.weight", COPY),
    ("intermediate.dense.bias", "ffn.w_1.bias", COPY),
    ("output.dense.weight", "ffn.w_2.weight", COPY),
    ("output.dense.bias", "ffn.w_2.bias", COPY),
)

# class name -> (masked-LM head, classifier)
_HEADS: dict[str, tuple[bool, bool]] = {
    "RobertaPreLayerNormModel": (False, False),
    "RobertaPreLayerNormForMaskedLM": (True, False),
    "RobertaPreLayerNormForSequenceClassification": (False, True),
}


def _offset_positions(offset: int) -> Transform:
    """Their position table = ``offset`` leading rows (zero on export) + ours."""
    return Transform(
        f"position-offset-{offset}",
        lambda t: (t[offset:].contiguous(),),
        lambda t: torch.cat([t.new_zeros(offset, t.shape[1]), t], dim=0),
    )


def _rules(name: str, config: TransformerConfig) -> list[Rule]:
    assert isinstance(config, EncoderOnlyConfig)
    mlm, classifier = _HEADS[name]
    tied = mlm and config.tie_output
    rules = [
        Rule("embeddings.word_embeddings.weight", ("embed.weight",), aliases=("lm_head.decoder.weight",) if tied else ()),
        Rule("embeddings.position_embeddings.weight", ("positions.weight",), _offset_positions(_pad(config, name) + 1)),
        Rule("embeddings.token_type_embeddings.weight", ("segment_embed.weight",)),
        Rule("embeddings.LayerNorm.weight", ("embed_norm.weight",)),
        Rule("embeddings.LayerNorm.bias", ("embed_norm.bias",)),
        *layer_rules(LAYER, config.n_layers, "encoder.layer.{i}.", "encoder.layers.{i}."),
        Rule("LayerNorm.weight", ("encoder.norm.weight",)),
        Rule("LayerNorm.bias", ("encoder.norm.bias",)),
    ]
    if name == "RobertaPreLayerNormModel" and config.pooler:
        rules += [Rule("pooler.dense.weight", ("pooler.weight",)), Rule("pooler.dense.bias", ("pooler.bias",))]
    if classifier:
        rules += [
            Rule("classifier.dense.weight", ("pooler.weight",)), Rule("classifier.dense.bias", ("pooler.bias",)),
            Rule("classifier.out_proj.weight", ("classifier.weight",)), Rule("classifier.out_proj.bias", ("classifier.bias",)),
        ]
    if mlm:
        rules += [
            Rule("lm_head.dense.weight", ("mlm_transform.weight",)), Rule("lm_head.dense.bias", ("mlm_transform.bias",)),
            Rule("lm_head.layer_norm.weight", ("mlm_norm.weight",)), Rule("lm_head.layer_norm.bias", ("mlm_norm.bias",)),
            Rule("lm_head.bias", ("mlm_output.bias",), aliases=("lm_head.decoder.bias",)),
        ]
        if not tied:
            rules.append(Rule("lm_head.decoder.weight", ("mlm_output.weight",)))
    return rules


def _pad(config: EncoderOnlyConfig, name: str) -> int:
    if config.pad_id is None:
        raise ConfigError(f"{name}: pad_id=None, but RoBERTa numbers positions from pad_token_id + 1 (needs a pad id)")
    return config.pad_id


def _config_from_hf(name: str, hf: dict[str, Any], weights: Mapping[str, Tensor]) -> EncoderOnlyConfig:
    mlm, classifier = _HEADS[name]
    require(hf, "is_decoder", (False,), name)
    require(hf, "position_embedding_type", ("absolute",), name)
    pad = hf.get("pad_token_id", 1)
    if not isinstance(pad, int):
        raise ConfigError(f"{name}: pad_token_id={pad!r}: RoBERTa numbers positions from it, an int is needed")
    activation = our_activation(hf.get("hidden_act", "gelu"), "hidden_act", name)
    if mlm and activation != "gelu":
        raise ConfigError(f"{name}: hidden_act={hf['hidden_act']!r} also drives the masked-LM head, which is exact GELU")
    n_classes = (len(hf["id2label"]) if "id2label" in hf else hf.get("num_labels", 2)) if classifier else 0
    return EncoderOnlyConfig(
        vocab_size=hf["vocab_size"], n_layers=hf["num_hidden_layers"], d_model=hf["hidden_size"],
        n_heads=hf["num_attention_heads"], d_ff=hf["intermediate_size"], activation=activation,
        dropout=hf.get("hidden_dropout_prob", 0.1), attention_dropout=hf.get("attention_probs_dropout_prob", 0.1),
        norm_eps=hf.get("layer_norm_eps", 1e-12), norm_position="pre", positions="learned",
        max_len=hf["max_position_embeddings"] - pad - 1, scale_embeddings=False, init_std=hf.get("initializer_range", 0.02),
        pad_id=pad, n_segments=hf.get("type_vocab_size", 1), n_classes=n_classes, embedding_norm=True, mlm_head=mlm,
        tie_output=hf.get("tie_word_embeddings", True),
        pooler=(name == "RobertaPreLayerNormModel" and "pooler.dense.weight" in weights) or None,
    )


def _fits(name: str, config: TransformerConfig) -> str | None:
    if not isinstance(config, EncoderOnlyConfig):
        return f"{name} holds an encoder-only model, got {type(config).__name__}"
    mlm, classifier = _HEADS[name]
    if classifier and config.n_classes < 1:
        return f"n_classes=0, but {name} needs a classifier (n_classes >= 1)"
    if config.pad_id is None:
        return f"pad_id=None, but {name} numbers positions from pad_token_id + 1"
    if config.n_segments < 1:
        return f"n_segments=0, but {name} always adds a token-type embedding"
    activations = ("gelu",) if mlm else ("gelu", "gelu_tanh", "relu")
    return require_ours(
        config, name, mlm_head=mlm, n_classes=config.n_classes if classifier else 0, positions="learned",
        norm_position="pre", has_final_norm=True, norm="layernorm", bias=True, scale_embeddings=False,
        embedding_norm=True, n_kv_heads=(None, config.n_heads), activation=activations, pooling="cls",
        pooler=(None, True) if classifier or name == "RobertaPreLayerNormModel" else (None, False),
    )


def _config_to_hf(name: str, config: TransformerConfig) -> dict[str, Any]:
    assert isinstance(config, EncoderOnlyConfig)
    pad = _pad(config, name)
    hf: dict[str, Any] = {
        "architectures": [name], "model_type": MODEL_TYPE, "vocab_size": config.vocab_size,
        "hidden_size": config.d_model, "num_hidden_layers": config.n_layers, "num_attention_heads": config.n_heads,
        "intermediate_size": config.d_ff, "hidden_act": hf_activation(config.activation, name),
        "hidden_dropout_prob": config.dropout, "attention_probs_dropout_prob": config.attention_dropout,
        "max_position_embeddings": config.max_len + pad + 1, "type_vocab_size": config.n_segments,
        "initializer_range": config.init_std or 0.02, "layer_norm_eps": config.norm_eps, "pad_token_id": pad,
        "position_embedding_type": "absolute", "is_decoder": False, "tie_word_embeddings": config.tie_output,
        "classifier_dropout": None,
    }
    if _HEADS[name][1]:
        hf["id2label"] = {str(i): f"LABEL_{i}" for i in range(config.n_classes)}
        hf["label2id"] = {f"LABEL_{i}": i for i in range(config.n_classes)}
    return hf


def _architecture(name: str) -> Architecture:
    return Architecture(
        name=name, model_type=MODEL_TYPE, prefix=PREFIX,
        config_from_hf=lambda hf, weights: _config_from_hf(name, hf, weights),
        config_to_hf=lambda config: _config_to_hf(name, config),
        rules=lambda config: _rules(name, config),
        ignores=(Ignore(r"embeddings\.(position_ids|token_type_ids)", "index buffers (0..n-1 and zeros)"),),
        fits=lambda config: _fits(name, config),
        heads=("lm_head.", "classifier."),
        base_model=name == "RobertaPreLayerNormModel",
    )


ROBERTA_PRELN_ARCHITECTURES: dict[str, Architecture] = {name: _architecture(name) for name in _HEADS}
