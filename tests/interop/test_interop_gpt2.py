"""GPT2LMHeadModel <-> our decoder-only model: logits, hidden states, greedy generation, round trips."""

from __future__ import annotations

import pytest
import torch
from interop_helpers import (
    EOS,
    assert_close_where,
    assert_state_dicts_equal,
    gpt2,
    left_padded,
    record_layer_outputs,
    right_padded,
    token_ids,
    transformers,
)

from aiayn.interop import load_hf, save_hf, to_hf
from aiayn.models.config import DecoderOnlyConfig
from aiayn.models.decoder_only import DecoderOnly


@pytest.fixture(scope="module")
def pair():
    hf = gpt2(seed=0)
    return hf, load_hf(hf)


def test_config_mapping(pair):
    _, imported = pair
    config = imported.config
    assert isinstance(config, DecoderOnlyConfig)
    assert (config.d_model, config.n_layers, config.n_heads, config.d_ff, config.max_len) == (24, 3, 4, 40, 40)
    assert (config.positions, config.norm_position, config.has_final_norm, config.activation) == ("learned", "pre", True, "gelu_tanh")
    assert config.pad_id is None and config.tie_output and not config.scale_embeddings
    assert imported.model.output.weight is imported.model.embed.weight


@torch.no_grad()
def test_logits_match_without_padding(pair):
    hf, imported = pair
    ids = token_ids(3, 11, seed=1)
    assert_close_where(imported.model(ids), hf(ids).logits)


@torch.no_grad()
def test_logits_match_with_right_padding(pair):
    hf, imported = pair
    ids, mask = right_padded(token_ids(3, 11, seed=2), [11, 7, 3], pad=EOS)
    ours = imported.model(ids, mask)
    theirs = hf(ids, attention_mask=mask.long()).logits
    assert_close_where(ours, theirs, mask)


@torch.no_grad()
def test_logits_match_with_left_padding_and_row_offsets(pair):
    hf, imported = pair
    ids, mask = left_padded(token_ids(3, 10, seed=3), [10, 6, 2], pad=EOS)
    n_pad = (~mask).sum(1)
    position_ids = (mask.long().cumsum(1) - 1).clamp_min(0)  # real tokens start at position 0
    ours = imported.model(ids, mask, offset=-n_pad)
    theirs = hf(ids, attention_mask=mask.long(), position_ids=position_ids).logits
    assert_close_where(ours, theirs, mask)


@torch.no_grad()
def test_hidden_states_layer_by_layer(pair):
    hf, imported = pair
    ids = token_ids(2, 9, seed=4)
    model = imported.model
    store, handles = record_layer_outputs(model.decoder.layers)
    try:
        model(ids)
    finally:
        for h in handles:
            h.remove()
    theirs = hf(ids, output_hidden_states=True).hidden_states  # embeddings, then each block (the last after ln_f)
    assert len(theirs) == len(store) + 1
    embedded = model.positions.embed(model.embed(ids))
    assert_close_where(embedded, theirs[0], what="embeddings")
    for i, ours in enumerate(store):
        if i == len(store) - 1:
            ours = model.decoder.norm(ours)
        assert_close_where(ours, theirs[i + 1], what=f"layer {i}")


@torch.no_grad()
def greedy(model: DecoderOnly, ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int, eos: int, pad: int) -> torch.Tensor:
    """Greedy decoding with our KV cache; left-padded prompts start at per-row offsets."""
    n_pad = (~mask).sum(1)  # (B,)
    cache = model.new_cache()
    logits = model(ids, mask, cache=cache, offset=-n_pad)  # (B, T, V)
    finished = torch.zeros(ids.shape[0], dtype=torch.bool)
    steps, scores = [], []
    for _ in range(max_new_tokens):
        scores.append(logits[:, -1])
        token = logits[:, -1].argmax(-1).masked_fill(finished, pad)  # (B,)
        steps.append(token)
        finished |= token == eos
        if bool(finished.all()):
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)  # (B, cache + 1)
        logits = model(token[:, None], mask, cache=cache, offset=cache.length - n_pad)
    return torch.stack(steps, dim=1), torch.stack(scores, dim=1)


def test_greedy_generation_matches_generate(pair):
    hf, imported = pair
    ids, mask = left_padded(token_ids(3, 6, seed=5), [6, 4, 2], pad=EOS)
    theirs = hf.generate(
        ids, attention_mask=mask.long(), max_new_tokens=12, do_sample=False, num_beams=1, pad_token_id=EOS,
        eos_token_id=EOS, output_logits=True, return_dict_in_generate=True,
    )
    tokens, logits = greedy(imported.model, ids, mask, 12, eos=EOS, pad=EOS)
    assert tokens.tolist() == theirs.sequences[:, ids.shape[1]:].tolist()
    assert_close_where(logits, torch.stack(theirs.logits, dim=1), what="step logits")


def test_import_export_round_trip_is_bit_exact(pair, tmp_path):
    hf, imported = pair
    save_hf(tmp_path, imported.model, hf_extras=imported.hf_config)
    again = load_hf(tmp_path)
    assert again.config == imported.config
    assert_state_dicts_equal(again.model.state_dict(), imported.model.state_dict())
    # and the Hugging Face side: every tensor transformers saves comes back unchanged
    exported = to_hf(again.model).tensors
    theirs = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}  # tied: not saved
    assert_state_dicts_equal(exported, theirs)


@torch.no_grad()
def test_our_model_exports_to_transformers(tmp_path):
    config = DecoderOnlyConfig(
        vocab_size=61, n_layers=2, d_model=16, n_heads=2, d_ff=48, dropout=0.0, activation="gelu_tanh",
        norm_position="pre", positions="learned", max_len=32, scale_embeddings=False, init_std=0.3, pad_id=None,
        tie_output=False,
    )
    torch.manual_seed(0)
    ours = DecoderOnly(config).eval()
    save_hf(tmp_path, ours)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    ids = token_ids(2, 12, seed=6)
    assert_close_where(ours(ids), hf(ids).logits)
    back = load_hf(tmp_path)
    assert back.config == config
    assert_state_dicts_equal(back.model.state_dict(), ours.state_dict())
