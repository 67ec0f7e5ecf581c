"""BERT (``BertModel``, ``BertForMaskedLM``, ``BertForSequenceClassification``, ``BertForPreTraining``) <-> our encoder-only family.

BERT is our encoder-only model with learned positions and segments, normalised embeddings,
Post-LN, GELU and unscaled embeddings. The four classes differ in their heads only:

==============================  ==========  ==============================================
class                           mlm_head    n_classes
==============================  ==========  ==============================================
BertModel                       False       0 (pooler=True: the pooler without a classifier)
BertForMaskedLM                 True        0
BertForSequenceClassification   False       num_labels (pooler + classifier)
BertForPreTraining              True        2 (pooler + next-sentence head as classifier)
==============================  ==========  ==============================================

A ``BertModel`` keeps its pooler (``pooler=True``) when its weights hold one. Not exact, and why: one
of ours without a pooler exports as a ``BertModel`` whose pooler transformers initialises; our
masked-LM transform always uses exact GELU, so a BERT with an MLM head must have
``hidden_act="gelu"``. ``pad_id`` is BERT's ``pad_token_id``: with no ``pad_mask`` ours masks those
tokens, while BERT attends to everything unless given an ``attention_mask`` (with the tokenizer's
mask, the two agree).
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
    warn_training_only,
)
from aiayn.interop.keymap import COPY, Ignore, Rule, derived
from aiayn.models.config import EncoderOnlyConfig, TransformerConfig

__all__ = ["BERT_ARCHITECTURES", "BERT_LAYER"]

# theirs (under encoder.layer.{i}.) -> ours (under encoder.layers.{i}.)
BERT_LAYER = (
    ("attention.self.query.weight", "self_attn.w_q.weight", COPY),
    ("attention.self.query.bias", "self_attn.w_q.bias", COPY),
    ("attention.self.key.weight", "self_attn.w_k.weight", COPY),
    ("attention.self.key.bias", "self_attn.w_k.bias", COPY),
    ("attention.self.value.weight", "self_attn.w_v.weight", COPY),
    ("attention.self.value.bias", "self_attn.w_v.bias", COPY),
    ("attention.output.dense.weight", "self_attn.w_o.weight", COPY),
    ("attention.output.dense.bias", "self_attn.w_o.bias", COPY),
    ("attention.output.LayerNorm.weight", "self_attn_norm.weight", COPY),
    ("attention.output.LayerNorm.bias", "self_attn_norm.bias", COPY),
    ("intermediate.dense.weight", "ffn.w_1.weight", COPY),
    ("intermediate.dense.bias", "ffn.w_1.bias", COPY),
    ("output.dense.weight", "ffn.w_2.weight", COPY),
    ("output.dense.bias", "ffn.w_2.bias", COPY),
    ("output.LayerNorm.weight", "ffn_norm.weight", COPY),
    ("output.LayerNorm.bias", "ffn_norm.bias", COPY),
)

# class name -> (masked-LM head, classification head: "labels" = classifier, "nsp" = cls.seq_relationship)
_HEADS: dict[str, tuple[bool, str | None]] = {
    "BertModel": (False, None),
    "BertForMaskedLM": (True, None),
    "BertForSequenceClassification": (False, "labels"),
    "BertForPreTraining": (True, "nsp"),
}


def _check_position_ids(key: str, tensor: torch.Tensor) -> str | None:
    expected = torch.arange(tensor.shape[-1]).expand_as(tensor)
    return None if torch.equal(tensor.long(), expected) else "position_ids buffer is not 0..n-1"


_IGNORE_POSITION_IDS = Ignore(
    r"embeddings\.position_ids", "position-id buffer of old transformers versions (0..n-1)", _check_position_ids
)
def _rules(name: str, config: TransformerConfig) -> list[Rule]:
    assert isinstance(config, EncoderOnlyConfig)
    mlm, classes = _HEADS[name]
    tied = mlm and config.tie_output
    rules = [
        Rule("embeddings.word_embeddings.weight", ("embed.weight",), aliases=("cls.predictions.decoder.weight",) if tied else ()),
        Rule("embeddings.position_embeddings.weight", ("positions.weight",)),
    ]
    if config.n_segments:
        rules.append(Rule("embeddings.token_type_embeddings.weight", ("segment_embed.weight",)))
    else:  # BERT always adds a segment embedding: one all-zero row adds nothing
        d_model = config.d_model
        zero = derived(
            "zero-segment",
            lambda t: None if not t.any() else "n_segments=0 needs an all-zero token_type_embeddings",
            lambda: torch.zeros(1, d_model),
        )
        rules.append(Rule("embeddings.token_type_embeddings.weight", (), zero))
    rules += [
        *_norm("embeddings.LayerNorm", "embed_norm"),
        *layer_rules(BERT_LAYER, config.n_layers, "encoder.layer.{i}.", "encoder.layers.{i}."),
    ]
    rules = [_with_legacy_norm_names(r) for r in rules]
    if classes is not None or (name == "BertModel" and config.pooler):
        rules += [Rule("pooler.dense.weight", ("pooler.weight",)), Rule("pooler.dense.bias", ("pooler.bias",))]
    if classes is not None:
        head = "classifier" if classes == "labels" else "cls.seq_relationship"
        rules += [Rule(f"{head}.weight", ("classifier.weight",)), Rule(f"{head}.bias", ("classifier.bias",))]
    if mlm:
        rules += [
            Rule("cls.predictions.transform.dense.weight", ("mlm_transform.weight",)),
            Rule("cls.predictions.transform.dense.bias", ("mlm_transform.bias",)),
            *(_with_legacy_norm_names(r) for r in _norm("cls.predictions.transform.LayerNorm", "mlm_norm")),
            # The decoder's bias is the same parameter as cls.predictions.bias; transformers saves the latter.
            Rule("cls.predictions.bias", ("mlm_output.bias",), aliases=("cls.predictions.decoder.bias",)),
        ]
        if not tied:
            rules.append(Rule("cls.predictions.decoder.weight", ("mlm_output.weight",)))
    return rules


def _norm(theirs: str, ours: str) -> list[Rule]:
    return [Rule(f"{theirs}.weight", (f"{ours}.weight",)), Rule(f"{theirs}.bias", (f"{ours}.bias",))]


def _with_legacy_norm_names(rule: Rule) -> Rule:
    """Old BERT checkpoints name LayerNorm parameters gamma/beta; transformers renames them on load too."""
    if ".LayerNorm." not in rule.theirs:
        return rule
    legacy = rule.theirs.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
    return Rule(rule.theirs, rule.ours, rule.transform, aliases=(*rule.aliases, legacy))


def _config_from_hf(name: str, hf: dict[str, Any], weights: Mapping[str, Tensor]) -> EncoderOnlyConfig:
    """``weights`` say whether a ``BertModel`` was saved with its pooler."""
    mlm, classes = _HEADS[name]
    require(hf, "is_decoder", (False,), name, "aiayn's encoder-only model is bidirectional")
    require(hf, "add_cross_attention", (False,), name)
    require(hf, "position_embedding_type", ("absolute",), name)
    activation = our_activation(hf.get("hidden_act", "gelu"), "hidden_act", name)
    if mlm and activation != "gelu":
        raise ConfigError(
            f"{name}: hidden_act={hf['hidden_act']!r} also drives BERT's masked-LM transform, which is exact GELU in aiayn"
        )
    if classes == "labels":
        n_classes = len(hf["id2label"]) if "id2label" in hf else hf.get("num_labels", 2)
        dropout = hf.get("hidden_dropout_prob", 0.1)
        if hf.get("classifier_dropout") not in (None, dropout):
            warn_training_only(name, f"classifier_dropout={hf['classifier_dropout']} becomes dropout={dropout}")
    else:
        n_classes = 2 if classes == "nsp" else 0
    return EncoderOnlyConfig(
        vocab_size=_need(hf, "vocab_size", name), n_layers=_need(hf, "num_hidden_layers", name),
        d_model=_need(hf, "hidden_size", name), n_heads=_need(hf, "num_attention_heads", name),
        d_ff=_need(hf, "intermediate_size", name), activation=activation, dropout=hf.get("hidden_dropout_prob", 0.1),
        attention_dropout=hf.get("attention_probs_dropout_prob", 0.1), norm_eps=hf.get("layer_norm_eps", 1e-12),
        norm_position="post", positions="learned", max_len=_need(hf, "max_position_embeddings", name),
        scale_embeddings=False, init_std=hf.get("initializer_range", 0.02), pad_id=hf.get("pad_token_id"),
        n_segments=_need(hf, "type_vocab_size", name), n_classes=n_classes, embedding_norm=True, mlm_head=mlm,
        tie_output=hf.get("tie_word_embeddings", True), pooler=name == "BertModel" and "pooler.dense.weight" in weights or None,
    )


def _fits(name: str, config: TransformerConfig) -> str | None:
    if not isinstance(config, EncoderOnlyConfig):
        return f"{name} holds an encoder-only model, got {type(config).__name__}"
    mlm, classes = _HEADS[name]
    if classes == "labels" and config.n_classes < 1:
        return f"n_classes=0, but {name} needs a classifier (n_classes >= 1)"
    n_classes = {None: 0, "nsp": 2, "labels": config.n_classes}[classes]
    if mlm and classes is None and config.pooler:
        return f"pooler=True, but {name} has no pooler"
    activations = ("gelu",) if mlm else ("gelu", "gelu_tanh", "relu")
    return require_ours(
        config, name, mlm_head=mlm, n_classes=n_classes, positions="learned", norm_position="post",
        has_final_norm=False, norm="layernorm", bias=True, scale_embeddings=False, embedding_norm=True,
        n_kv_heads=(None, config.n_heads), activation=activations, pooling="cls",
    )


def _config_to_hf(name: str, config: TransformerConfig) -> dict[str, Any]:
    assert isinstance(config, EncoderOnlyConfig)
    if config.activation_dropout:
        warn_training_only(name, f"activation_dropout={config.activation_dropout} has no BERT field; dropped")
    hf: dict[str, Any] = {
        "architectures": [name], "model_type": "bert", "vocab_size": config.vocab_size, "hidden_size": config.d_model,
        "num_hidden_layers": config.n_layers, "num_attention_heads": config.n_heads,
        "intermediate_size": config.d_ff, "hidden_act": hf_activation(config.activation, name),
        "hidden_dropout_prob": config.dropout, "attention_probs_dropout_prob": config.attention_dropout,
        "max_position_embeddings": config.max_len, "type_vocab_size": config.n_segments or 1,
        "initializer_range": config.init_std or 0.02, "layer_norm_eps": config.norm_eps, "pad_token_id": config.pad_id,
        "is_decoder": False, "add_cross_attention": False, "tie_word_embeddings": config.tie_output,
        "classifier_dropout": None,
    }
    if _HEADS[name][1] == "labels":
        hf["id2label"] = {str(i): f"LABEL_{i}" for i in range(config.n_classes)}
        hf["label2id"] = {f"LABEL_{i}": i for i in range(config.n_classes)}
    return hf


def _need(hf: dict[str, Any], key: str, name: str) -> Any:
    if key not in hf:
        raise ConfigError(f"{name}: config.json lacks {key!r}")
    return hf[key]


def _architecture(name: str) -> Architecture:
    return Architecture(
        name=name, model_type="bert", prefix="bert",
        config_from_hf=lambda hf, weights: _config_from_hf(name, hf, weights),
        config_to_hf=lambda config: _config_to_hf(name, config),
        rules=lambda config: _rules(name, config),
        ignores=(_IGNORE_POSITION_IDS,),
        fits=lambda config: _fits(name, config),
        heads=("cls.", "classifier."),
        base_model=name == "BertModel",
    )


BERT_ARCHITECTURES: dict[str, Architecture] = {name: _architecture(name) for name in _HEADS}
