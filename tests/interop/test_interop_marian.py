"""MarianMTModel <-> our encoder-decoder model: the residual-basis permutation, logits, greedy decoding, round trips."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from interop_helpers import (
    EOS,
    PAD,
    assert_close_where,
    assert_state_dicts_equal,
    assert_translations_equal_generate,
    greedy,
    marian,
    record_layer_outputs,
    right_padded,
    token_ids,
    transformers,
)
from pretrained_dirs import GERMAN, marian_dir

from aiayn.interop import ConfigError, KeyMapError, load_hf, save_hf, to_hf
from aiayn.interop.bart_family import output_bias_rule
from aiayn.interop.marian import marian_permutation
from aiayn.models.config import EncoderDecoderConfig
from aiayn.models.encoder_decoder import EncoderDecoder
from aiayn.nn.positional import sinusoid_table


@pytest.fixture(scope="module")
def pair():
    hf = marian(seed=0)
    return hf, load_hf(hf)


def test_config_mapping(pair):
    _, imported = pair
    config = imported.config
    assert isinstance(config, EncoderDecoderConfig)
    assert (config.n_encoder_layers, config.n_decoder_layers, config.d_model, config.n_heads, config.d_ff) == (2, 3, 24, 4, 40)
    assert (config.positions, config.norm_position, config.has_final_norm, config.scale_embeddings) == ("sinusoidal", "post", False, True)
    assert config.share_embeddings and config.tie_output and config.pad_id == PAD
    model = imported.model
    assert model.src_embed is model.tgt_embed and model.output.weight is model.tgt_embed.weight


@pytest.mark.parametrize("d_model", [24, 21])
def test_permutation_turns_marian_sinusoids_into_ours(d_model):
    hf = transformers.MarianMTModel(transformers.MarianConfig(
        vocab_size=10, d_model=d_model, encoder_layers=1, decoder_layers=1, encoder_attention_heads=3,
        decoder_attention_heads=3, encoder_ffn_dim=8, decoder_ffn_dim=8, max_position_embeddings=50, pad_token_id=9,
    ))
    theirs = hf.model.encoder.embed_positions.weight.detach()  # (50, D): [sin | cos]
    ours = theirs.index_select(1, marian_permutation(d_model))
    assert torch.allclose(ours, sinusoid_table(50, d_model), atol=1e-6)


@torch.no_grad()
def test_logits_match_without_padding(pair):
    hf, imported = pair
    src, tgt = token_ids(2, 9, seed=1), token_ids(2, 7, seed=2)
    assert_close_where(imported.model(src, tgt), hf(input_ids=src, decoder_input_ids=tgt).logits)


@torch.no_grad()
def test_logits_match_with_padding(pair):
    hf, imported = pair
    src, src_mask = right_padded(token_ids(3, 9, seed=3), [9, 5, 2], pad=PAD)
    tgt, tgt_mask = right_padded(token_ids(3, 7, seed=4), [7, 4, 6], pad=PAD)
    tgt[:, 0] = PAD  # Marian's decoder start token is its pad token: pass tgt_mask explicitly
    ours = imported.model(src, tgt, tgt_mask=tgt_mask)  # src_mask derived from pad_id
    theirs = hf(
        input_ids=src, attention_mask=src_mask.long(), decoder_input_ids=tgt, decoder_attention_mask=tgt_mask.long()
    ).logits
    assert_close_where(ours, theirs, tgt_mask)


@torch.no_grad()
def test_hidden_states_layer_by_layer_up_to_the_permutation(pair):
    hf, imported = pair
    model, perm = imported.model, marian_permutation(24)
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
            assert_close_where(hidden, theirs[i + 1].index_select(-1, perm), mask, what=f"{name} layer {i}")


def test_greedy_decoding_matches_generate(pair):
    hf, imported = pair
    src, src_mask = right_padded(token_ids(3, 8, seed=7), [8, 6, 3], pad=PAD)
    theirs = hf.generate(
        input_ids=src, attention_mask=src_mask.long(), max_new_tokens=12, do_sample=False, num_beams=1,
        output_logits=True, return_dict_in_generate=True,
    )
    tokens, logits = greedy(imported.model, src, src_mask, start=PAD, eos=EOS, pad=PAD, max_new_tokens=12)
    assert theirs.sequences[:, 0].tolist() == [PAD] * 3  # generate() starts from decoder_start_token_id
    assert tokens.tolist() == theirs.sequences[:, 1:].tolist()
    # random tiny models repeat tokens quickly, so also compare every step's logits (the cached decoder path)
    assert_close_where(logits, torch.stack(theirs.logits, dim=1), what="step logits")


def test_translations_of_a_marian_directory_equal_generate(tmp_path):
    """Decoding starts from decoder_start_token_id (the pad) and a source is x </s>, as in transformers."""
    directory = marian_dir(tmp_path)
    hf = transformers.MarianMTModel.from_pretrained(directory).eval()
    assert_translations_equal_generate(directory, hf, GERMAN[:4])


def test_round_trip_is_bit_exact(pair, tmp_path):
    hf, imported = pair
    save_hf(tmp_path, imported.model, hf_extras=imported.hf_config)
    again = load_hf(tmp_path)
    assert again.config == imported.config
    assert_state_dicts_equal(again.model.state_dict(), imported.model.state_dict())
    saved_by_transformers = {
        k: v for k, v in hf.state_dict().items()
        if "embed_positions" not in k and k not in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight")
    }
    assert_state_dicts_equal(to_hf(again.model).tensors, saved_by_transformers)
    assert again.hf_config["decoder_start_token_id"] == PAD  # token ids carried through hf_extras


@torch.no_grad()
def test_separate_vocabularies_and_untied_output():
    hf = marian(seed=1, share_encoder_decoder_embeddings=False, decoder_vocab_size=37, tie_word_embeddings=False,
                pad_token_id=30, decoder_start_token_id=30)
    imported = load_hf(hf)
    config = imported.config
    assert (config.share_embeddings, config.tgt_vocab_size, config.tie_output) == (False, 37, False)
    src, tgt = token_ids(2, 6, seed=8), token_ids(2, 5, seed=9, high=30)
    assert_close_where(imported.model(src, tgt), hf(input_ids=src, decoder_input_ids=tgt).logits)


@torch.no_grad()
def test_our_model_exports_to_transformers(tmp_path):
    """Odd d_model too: Marian puts the extra sine at the end of its first half."""
    config = EncoderDecoderConfig(
        vocab_size=61, n_encoder_layers=2, n_decoder_layers=1, d_model=21, n_heads=3, d_ff=30, dropout=0.0,
        activation="relu", init_std=0.3,
    )
    torch.manual_seed(3)
    ours = EncoderDecoder(config).eval()
    save_hf(tmp_path, ours)
    hf = transformers.MarianMTModel.from_pretrained(tmp_path).eval()
    src, src_mask = right_padded(token_ids(2, 9, seed=10, high=60), [9, 4], pad=0)
    tgt = token_ids(2, 6, seed=11)
    assert_close_where(ours(src, tgt), hf(input_ids=src, attention_mask=src_mask.long(), decoder_input_ids=tgt).logits)
    back = load_hf(tmp_path)
    assert back.config == config
    assert_state_dicts_equal(back.model.state_dict(), ours.state_dict())


@torch.no_grad()
def test_a_nonzero_final_logits_bias_is_our_output_bias():
    hf = marian(seed=2).eval()
    hf.final_logits_bias.copy_(torch.randn(hf.final_logits_bias.shape))
    ours = load_hf(hf).model
    assert ours.config.output_bias
    src, tgt = token_ids(2, 7, seed=3, high=60), token_ids(2, 5, seed=4)
    assert_close_where(ours(src, tgt), hf(input_ids=src, decoder_input_ids=tgt).logits)


def test_without_an_output_bias_a_nonzero_one_is_refused(tmp_path):
    hf = marian(seed=2)
    hf.final_logits_bias.fill_(0.5)
    config = dataclasses.replace(load_hf(hf).config, output_bias=False)
    rule = output_bias_rule(config)
    with pytest.raises(KeyMapError, match="final_logits_bias is non-zero: import with output_bias=True"):
        rule.transform.to_ours(hf.final_logits_bias)


def test_trained_positions_are_refused():
    hf = marian(seed=2)
    with torch.no_grad():
        hf.model.encoder.embed_positions.weight.add_(0.1)
    with pytest.raises(KeyMapError, match=r"model\.encoder\.embed_positions\.weight: .*not Marian's sinusoid table"):
        load_hf(hf)


def test_different_encoder_and_decoder_sizes_are_refused():
    with pytest.raises(ConfigError, match=r"encoder_ffn_dim=40 differs from decoder_ffn_dim=48; aiayn's encoder-decoder has one d_ff"):
        load_hf(marian(seed=0, decoder_ffn_dim=48))



@torch.no_grad()
def test_swish_marian():
    hf = marian(seed=3, activation_function="swish")
    imported = load_hf(hf)
    src, tgt = token_ids(2, 6, seed=12), token_ids(2, 5, seed=13)
    assert_close_where(imported.model(src, tgt), hf(input_ids=src, decoder_input_ids=tgt).logits)
