"""BERT (four head classes) <-> our encoder-only model: outputs, hidden states, round trips, legacy keys."""

from __future__ import annotations

import pytest
import torch
from interop_helpers import (
    assert_close_where,
    assert_state_dicts_equal,
    bert,
    record_layer_outputs,
    right_padded,
    token_ids,
    transformers,
)

from aiayn.interop import ConfigError, KeyMapError, load_hf, save_hf, to_hf
from aiayn.interop.hf_dir import write_hf_dir
from aiayn.models.config import EncoderOnlyConfig
from aiayn.models.encoder_only import EncoderOnly

CLASSES = ["BertModel", "BertForMaskedLM", "BertForSequenceClassification", "BertForPreTraining"]
HEADS = {  # class -> (mlm_head, n_classes) of the import
    "BertModel": (False, 0),
    "BertForMaskedLM": (True, 0),
    "BertForSequenceClassification": (False, 3),
    "BertForPreTraining": (True, 2),
}


@pytest.fixture(scope="module", params=CLASSES)
def pair(request):
    hf = bert(request.param, seed=1, num_labels=3)
    return hf, load_hf(hf)


def outputs(hf, imported, ids, mask, segments):
    """The outputs of each class, theirs and ours, as ``{name: (theirs, ours)}``."""
    out = hf(ids, attention_mask=None if mask is None else mask.long(), token_type_ids=segments)
    model = imported.model
    hidden = model(ids, mask, segments)
    name = type(hf).__name__
    if name == "BertModel":
        return {"hidden": (out.last_hidden_state, hidden)}
    if name == "BertForMaskedLM":
        return {"mlm": (out.logits, model.masked_lm_logits(hidden))}
    if name == "BertForSequenceClassification":
        return {"classes": (out.logits, model.classification_logits(hidden))}
    return {
        "mlm": (out.prediction_logits, model.masked_lm_logits(hidden)),
        "nsp": (out.seq_relationship_logits, model.classification_logits(hidden)),
    }


def test_heads_and_config(pair):
    hf, imported = pair
    config = imported.config
    assert isinstance(config, EncoderOnlyConfig)
    assert (config.mlm_head, config.n_classes) == HEADS[type(hf).__name__]
    assert (config.positions, config.norm_position, config.has_final_norm, config.embedding_norm) == ("learned", "post", False, True)
    assert (config.activation, config.norm_eps, config.n_segments, config.pad_id) == ("gelu", 1e-12, 2, 0)


@torch.no_grad()
def test_outputs_match_without_padding(pair):
    hf, imported = pair
    ids = token_ids(3, 10, seed=2)
    segments = (torch.arange(10) >= 6).long().expand(3, -1)
    for what, (theirs, ours) in outputs(hf, imported, ids, None, segments).items():
        assert_close_where(ours, theirs, what=what)


@torch.no_grad()
def test_outputs_match_with_padding(pair):
    hf, imported = pair
    ids, mask = right_padded(token_ids(3, 10, seed=3), [10, 7, 4], pad=0)
    segments = (torch.arange(10) >= 3).long().expand(3, -1)
    for what, (theirs, ours) in outputs(hf, imported, ids, mask, segments).items():
        # per-token outputs at real positions; classification reads position 0, always real
        assert_close_where(ours, theirs, mask if theirs.dim() == 3 else None, what=what)


@torch.no_grad()
def test_hidden_states_layer_by_layer():
    hf = bert("BertForMaskedLM", seed=4)
    model = load_hf(hf).model
    ids, mask = right_padded(token_ids(2, 9, seed=5), [9, 5], pad=0)
    store, handles = record_layer_outputs(model.encoder.layers)
    try:
        model(ids, mask)
    finally:
        for h in handles:
            h.remove()
    theirs = hf(ids, attention_mask=mask.long(), output_hidden_states=True).hidden_states
    assert len(theirs) == len(store) + 1
    assert_close_where(model.embed_norm(model.positions.embed(model.embed(ids)) + model.segment_embed(torch.zeros_like(ids))), theirs[0], mask, what="embeddings")
    for i, ours in enumerate(store):
        assert_close_where(ours, theirs[i + 1], mask, what=f"layer {i}")


@torch.no_grad()
def test_pad_id_derives_the_mask_that_bert_needs_given():
    """Ours masks ``pad_id`` tokens when no mask is given; BERT needs the attention_mask for that."""
    hf = bert("BertModel", seed=6)
    model = load_hf(hf).model
    ids, mask = right_padded(token_ids(2, 8, seed=7), [8, 5], pad=0)
    assert_close_where(model(ids), hf(ids, attention_mask=mask.long()).last_hidden_state, mask)


def test_round_trip_is_bit_exact(pair, tmp_path):
    hf, imported = pair
    save_hf(tmp_path, imported.model, hf_extras=imported.hf_config)
    again = load_hf(tmp_path)
    assert again.architecture == type(hf).__name__
    assert again.config == imported.config
    assert_state_dicts_equal(again.model.state_dict(), imported.model.state_dict())
    exported = to_hf(again.model, hf_extras=imported.hf_config).tensors
    theirs = {
        k: v for k, v in hf.state_dict().items()
        if k not in ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")  # tied: not saved
    }
    assert_state_dicts_equal(exported, theirs)


@pytest.mark.parametrize("mlm_head, n_classes", [(True, 0), (False, 4), (True, 2), (False, 0)])
@torch.no_grad()
def test_our_models_export_to_transformers(tmp_path, mlm_head, n_classes):
    config = EncoderOnlyConfig(
        vocab_size=61, n_layers=2, d_model=16, n_heads=2, d_ff=32, dropout=0.0, activation="gelu",
        positions="learned", max_len=32, scale_embeddings=False, init_std=0.3, norm_eps=1e-12,
        mlm_head=mlm_head, n_classes=n_classes, tie_output=False, n_segments=3,
    )
    torch.manual_seed(1)
    ours = EncoderOnly(config).eval()
    exported = save_hf(tmp_path, ours)
    hf = getattr(transformers, exported.architecture).from_pretrained(tmp_path).eval()
    ids, mask = right_padded(token_ids(2, 12, seed=8), [12, 6], pad=0)
    segments = (torch.arange(12) % 3).expand(2, -1)
    hidden = ours(ids, mask, segments)
    out = hf(ids, attention_mask=mask.long(), token_type_ids=segments)
    if mlm_head:
        assert_close_where(ours.masked_lm_logits(hidden), out.logits if not n_classes else out.prediction_logits, mask)
    if n_classes:
        assert_close_where(ours.classification_logits(hidden), out.logits if not mlm_head else out.seq_relationship_logits)
    if not (mlm_head or n_classes):
        assert_close_where(hidden, out.last_hidden_state, mask)
    back = load_hf(tmp_path)
    assert back.config == config
    assert_state_dicts_equal(back.model.state_dict(), ours.state_dict())


@torch.no_grad()
def test_no_segments_export_as_one_zero_row(tmp_path):
    config = EncoderOnlyConfig(
        vocab_size=61, n_layers=1, d_model=16, n_heads=2, d_ff=32, dropout=0.0, activation="gelu",
        positions="learned", max_len=32, scale_embeddings=False, init_std=0.3, n_segments=0, n_classes=0,
    )
    ours = EncoderOnly(config).eval()
    save_hf(tmp_path, ours)
    hf = transformers.BertForMaskedLM.from_pretrained(tmp_path).eval()
    assert hf.config.type_vocab_size == 1
    ids = token_ids(2, 7, seed=9)
    assert_close_where(ours.masked_lm_logits(ours(ids)), hf(ids).logits)


def test_bert_model_keeps_its_pooler():
    imported = load_hf(bert("BertModel", seed=2))
    assert imported.config.pooler is True and imported.config.n_classes == 0
    assert imported.dropped == []
    without = transformers.BertModel(bert("BertModel", seed=2).config, add_pooling_layer=False)
    assert load_hf(without).config.pooler is None


@torch.no_grad()
def test_bert_model_pooler_output():
    hf = bert("BertModel", seed=2)
    model = load_hf(hf).model
    ids = token_ids(2, 6, seed=3)
    assert_close_where(model.pooled(model(ids)), hf(ids).pooler_output)


@torch.no_grad()
def test_a_pooler_without_classifier_exports_as_bert_model(tmp_path):
    config = EncoderOnlyConfig(
        vocab_size=61, n_layers=1, d_model=16, n_heads=2, d_ff=32, dropout=0.0, activation="gelu",
        positions="learned", max_len=32, scale_embeddings=False, init_std=0.3, n_segments=2, pooler=True,
        mlm_head=False, n_classes=0,
    )
    ours = EncoderOnly(config).eval()
    assert save_hf(tmp_path, ours).architecture == "BertModel"
    hf = transformers.BertModel.from_pretrained(tmp_path).eval()
    ids = token_ids(2, 7, seed=4)
    assert_close_where(ours.pooled(ours(ids)), hf(ids).pooler_output)


def test_a_pooler_does_not_fit_a_masked_lm_export(tmp_path):
    config = EncoderOnlyConfig(
        vocab_size=61, n_layers=1, d_model=16, n_heads=2, d_ff=32, activation="gelu", positions="learned",
        max_len=32, scale_embeddings=False, mlm_head=True, n_classes=0, pooler=True,
    )
    with pytest.raises(ConfigError, match="pooler=True, but BertForMaskedLM has no pooler"):
        save_hf(tmp_path, EncoderOnly(config), architecture="BertForMaskedLM")


def test_legacy_key_names_load(tmp_path):
    """Old checkpoints: LayerNorm.gamma/beta, the position_ids buffer, and the tied decoder weight and bias saved."""
    hf = bert("BertForMaskedLM", seed=3)
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    state = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v for k, v in state.items()}
    state["bert.embeddings.position_ids"] = torch.arange(40)[None]
    assert "cls.predictions.decoder.weight" in state and "cls.predictions.decoder.bias" in state
    write_hf_dir(tmp_path, {**hf.config.to_dict(), "architectures": ["BertForMaskedLM"]}, state)
    imported = load_hf(tmp_path)
    assert imported.dropped == ["bert.embeddings.position_ids"]
    assert_state_dicts_equal(to_hf(imported.model).tensors, {k: v for k, v in hf.state_dict().items() if ".decoder." not in k})


def test_pretraining_weights_under_a_masked_lm_name(tmp_path):
    """bert-base-uncased's layout: config says BertForMaskedLM, weights also hold the pooler and NSP head."""
    hf = bert("BertForPreTraining", seed=5)
    config = {**hf.config.to_dict(), "architectures": ["BertForMaskedLM"]}
    write_hf_dir(tmp_path, config, {k: v for k, v in hf.state_dict().items() if ".decoder." not in k})
    with pytest.raises(KeyMapError, match=r"unmatched keys.*bert\.pooler\.dense\.weight.*architecture='BertForPreTraining'"):
        load_hf(tmp_path)
    imported = load_hf(tmp_path, architecture="BertForPreTraining")
    assert (imported.config.mlm_head, imported.config.n_classes) == (True, 2)


def test_mlm_head_needs_exact_gelu():
    with pytest.raises(ConfigError, match=r"hidden_act='relu'.*exact GELU"):
        load_hf(bert("BertForMaskedLM", seed=0, hidden_act="relu"))
    # without the MLM head, any supported activation maps
    assert load_hf(bert("BertForSequenceClassification", seed=0, hidden_act="relu")).config.activation == "relu"


def test_mean_pooling_does_not_export_as_bert(tmp_path):
    config = EncoderOnlyConfig(
        vocab_size=61, n_layers=1, d_model=16, n_heads=2, d_ff=32, activation="gelu", positions="learned",
        max_len=32, scale_embeddings=False, mlm_head=False, n_classes=2, pooling="mean",
    )
    with pytest.raises(ConfigError, match="pooling='mean', but BertForSequenceClassification needs 'cls'"):
        save_hf(tmp_path, EncoderOnly(config), architecture="BertForSequenceClassification")
