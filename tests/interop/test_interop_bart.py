"""BART <-> our encoder-decoder (learned positions, embedding norms, output bias): logits, layers, decoding, round trips."""

from __future__ import annotations

import pytest
import torch
from interop_helpers import (
    EOS,
    PAD,
    assert_close_where,
    assert_state_dicts_equal,
    assert_translations_equal_generate,
    bart,
    greedy,
    record_layer_outputs,
    right_padded,
    token_ids,
    transformers,
)
from pretrained_dirs import SENTENCES, bart_dir

from aiayn.interop import ConfigError, load_hf, save_hf, to_hf
from aiayn.models.config import EncoderDecoderConfig
from aiayn.models.encoder_decoder import EncoderDecoder
from aiayn.tokenization.special import BOS_ID, EOS_ID


@pytest.fixture(scope="module")
def pair():
    hf = bart(seed=0)
    return hf, load_hf(hf)


def test_config_mapping(pair):
    _, imported = pair
    config = imported.config
    assert isinstance(config, EncoderDecoderConfig) and imported.architecture == "BartForConditionalGeneration"
    assert (config.n_encoder_layers, config.n_decoder_layers, config.d_model, config.n_heads, config.d_ff) == (2, 3, 24, 4, 40)
    assert (config.positions, config.max_len, config.norm_position, config.has_final_norm) == ("learned", 64, "post", False)
    assert config.embedding_norm and not config.scale_embeddings and config.pad_id == PAD
    assert not config.output_bias  # transformers initialises final_logits_bias to zeros
    model = imported.model
    assert model.src_embed is model.tgt_embed and model.output.weight is model.tgt_embed.weight


@torch.no_grad()
def test_logits_match_with_padding(pair):
    hf, imported = pair
    src, src_mask = right_padded(token_ids(3, 9, seed=3), [9, 5, 2], pad=PAD)
    tgt, tgt_mask = right_padded(token_ids(3, 7, seed=4), [7, 4, 6], pad=PAD)
    tgt[:, 0] = EOS  # BART's decoder starts from its EOS
    ours = imported.model(src, tgt)  # both masks derived from pad_id
    theirs = hf(
        input_ids=src, attention_mask=src_mask.long(), decoder_input_ids=tgt, decoder_attention_mask=tgt_mask.long()
    ).logits
    assert_close_where(ours, theirs, tgt_mask)


@torch.no_grad()
def test_hidden_states_layer_by_layer(pair):
    hf, imported = pair
    model = imported.model
    src, src_mask = right_padded(token_ids(2, 8, seed=5), [8, 5], pad=PAD)
    tgt = token_ids(2, 6, seed=6)
    enc_store, enc_handles = record_layer_outputs(model.encoder.layers)
    dec_store, dec_handles = record_layer_outputs(model.decoder.layers)
    try:
        model(src, tgt)
    finally:
        for h in enc_handles + dec_handles:
            h.remove()
    out = hf(input_ids=src, attention_mask=src_mask.long(), decoder_input_ids=tgt, output_hidden_states=True)
    for name, ours, theirs, mask in (
        ("encoder", enc_store, out.encoder_hidden_states, src_mask),
        ("decoder", dec_store, out.decoder_hidden_states, None),
    ):
        assert len(theirs) == len(ours) + 1
        for i, hidden in enumerate(ours):
            assert_close_where(hidden, theirs[i + 1], mask, what=f"{name} layer {i}")


def test_greedy_decoding_matches_generate(pair):
    hf, imported = pair
    src, src_mask = right_padded(token_ids(3, 8, seed=7), [8, 6, 3], pad=PAD)
    theirs = hf.generate(
        input_ids=src, attention_mask=src_mask.long(), max_new_tokens=12, do_sample=False, num_beams=1,
        output_logits=True, return_dict_in_generate=True,
    )
    tokens, logits = greedy(imported.model, src, src_mask, start=EOS, eos=EOS, pad=PAD, max_new_tokens=12)
    assert theirs.sequences[:, 0].tolist() == [EOS] * 3
    assert tokens.tolist() == theirs.sequences[:, 1:].tolist()
    assert_close_where(logits, torch.stack(theirs.logits, dim=1), what="step logits")


def test_translations_of_a_bart_directory_equal_generate(tmp_path):
    """Decoding starts from decoder_start_token_id (</s>, not <s>) and a source is <s> x </s>, as in transformers."""
    directory = bart_dir(tmp_path)
    hf = transformers.BartForConditionalGeneration.from_pretrained(directory).eval()
    assert_translations_equal_generate(directory, hf, SENTENCES[:4])


@torch.no_grad()
def test_a_nonzero_final_logits_bias_is_our_output_bias():
    hf = bart(seed=1)
    hf.final_logits_bias.copy_(torch.randn(hf.final_logits_bias.shape))
    ours = load_hf(hf).model
    assert ours.config.output_bias
    src, tgt = token_ids(2, 7, seed=3), token_ids(2, 5, seed=4)
    assert_close_where(ours(src, tgt), hf(input_ids=src, decoder_input_ids=tgt).logits)


def test_round_trip_is_bit_exact_but_for_the_two_unread_position_rows(pair, tmp_path):
    hf, imported = pair
    save_hf(tmp_path, imported.model, hf_extras=imported.hf_config)
    again = load_hf(tmp_path)
    assert again.config == imported.config
    assert_state_dicts_equal(again.model.state_dict(), imported.model.state_dict())
    exported = to_hf(again.model).tensors
    theirs = {k: v for k, v in hf.state_dict().items()
              if k not in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight")}
    for key in ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"):
        assert (exported[key][:2] == 0).all()  # BART never reads rows 0 and 1 (its positions start at 2)
        exported[key], theirs[key] = exported[key][2:], theirs[key][2:]
    assert_state_dicts_equal(exported, theirs)
    assert again.hf_config["decoder_start_token_id"] == EOS


@pytest.mark.parametrize("output_bias", [False, True])
@torch.no_grad()
def test_our_model_exports_to_transformers(tmp_path, output_bias):
    config = EncoderDecoderConfig(
        vocab_size=61, n_encoder_layers=2, n_decoder_layers=1, d_model=16, n_heads=2, d_ff=30, dropout=0.0,
        activation="gelu", positions="learned", max_len=32, scale_embeddings=False, init_std=0.3, norm_eps=1e-5,
        embedding_norm=True, output_bias=output_bias, pad_id=0,
    )
    torch.manual_seed(3)
    ours = EncoderDecoder(config).eval()
    if output_bias:
        ours.output.bias.normal_()
    assert save_hf(tmp_path, ours).architecture == "BartForConditionalGeneration"
    hf = transformers.BartForConditionalGeneration.from_pretrained(tmp_path).eval()
    # generate() starts from our BOS, as ours decodes, and forces no EOS ours would not emit
    assert (hf.config.decoder_start_token_id, hf.config.eos_token_id, hf.config.forced_eos_token_id) == (BOS_ID, EOS_ID, None)
    src, src_mask = right_padded(token_ids(2, 9, seed=10, high=60), [9, 4], pad=0)
    tgt = token_ids(2, 6, seed=11)
    assert_close_where(ours(src, tgt), hf(input_ids=src, attention_mask=src_mask.long(), decoder_input_ids=tgt).logits)
    back = load_hf(tmp_path)
    assert back.config == config
    assert_state_dicts_equal(back.model.state_dict(), ours.state_dict())


def test_the_paper_model_does_not_fit_bart(tmp_path):
    config = EncoderDecoderConfig(vocab_size=61, n_encoder_layers=1, n_decoder_layers=1, d_model=16, n_heads=2,
                                  d_ff=30, positions="learned", max_len=32, norm_eps=1e-5)
    with pytest.raises(ConfigError, match="embedding_norm=False, but BartForConditionalGeneration needs True"):
        save_hf(tmp_path, EncoderDecoder(config), architecture="BartForConditionalGeneration")
