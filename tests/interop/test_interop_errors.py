"""Strictness: unsupported classes, missing and unmatched keys, missing directories, configs with no equivalent."""

from __future__ import annotations

import json

import pytest
import torch
from interop_helpers import gpt2, marian, transformers

from aiayn.interop import ConfigError, KeyMapError, UnsupportedArchitecture, load_hf, save_hf, to_hf
from aiayn.interop.hf_dir import write_hf_dir
from aiayn.interop.keymap import Rule, export_tensors, load_into
from aiayn.models.config import DecoderOnlyConfig, EncoderDecoderConfig
from aiayn.models.decoder_only import DecoderOnly
from aiayn.models.encoder_decoder import EncoderDecoder


def write_gpt2_dir(path, state=None, **config_changes):
    hf = gpt2(seed=0)
    config = {**hf.config.to_dict(), "architectures": ["GPT2LMHeadModel"], **config_changes}
    state = state if state is not None else {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    write_hf_dir(path, config, state)
    return hf


def test_unsupported_architecture_is_named_and_supported_ones_listed(tmp_path):
    write_gpt2_dir(tmp_path, architectures=["LlamaForCausalLM"], model_type="llama")
    with pytest.raises(UnsupportedArchitecture) as info:
        load_hf(tmp_path)
    message = str(info.value)
    assert "'LlamaForCausalLM'" in message
    for name in ("GPT2LMHeadModel", "BertModel", "BertForMaskedLM", "BertForSequenceClassification", "MarianMTModel",
                 "BartForConditionalGeneration"):
        assert name in message


def test_known_unsupported_architecture_says_what_to_do(tmp_path):
    write_gpt2_dir(tmp_path, architectures=["GPT2Model"])
    with pytest.raises(UnsupportedArchitecture, match=r"'GPT2Model'.*load the GPT2LMHeadModel.*supported: GPT2LMHeadModel"):
        load_hf(tmp_path)


def test_unsupported_in_memory_class():
    hf = transformers.GPT2Model(transformers.GPT2Config(vocab_size=10, n_positions=8, n_embd=8, n_layer=1, n_head=2))
    with pytest.raises(UnsupportedArchitecture, match=r"'GPT2Model'.*GPT2LMHeadModel"):
        load_hf(hf)


@pytest.mark.reliability
def test_missing_and_unmatched_keys_are_all_listed(tmp_path):
    hf = gpt2(seed=0)
    state = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    del state["transformer.h.1.mlp.c_fc.bias"], state["transformer.ln_f.weight"]
    state["transformer.h.0.attn.q_norm.weight"] = torch.ones(24)
    state["score.weight"] = torch.ones(2, 24)
    write_gpt2_dir(tmp_path, state)
    with pytest.raises(KeyMapError) as info:
        load_hf(tmp_path)
    message = str(info.value)
    assert "2 missing keys (expected, not found): transformer.h.1.mlp.c_fc.bias, transformer.ln_f.weight" in message
    assert "2 unmatched keys (found, no rule maps them): score.weight, transformer.h.0.attn.q_norm.weight" in message


def test_old_causal_mask_buffers_are_dropped_by_name(tmp_path):
    hf = gpt2(seed=0)
    state = {k.removeprefix("transformer."): v for k, v in hf.state_dict().items() if k != "lm_head.weight"}  # GPT2Model layout
    state["h.0.attn.bias"] = torch.tril(torch.ones(1, 1, 40, 40))
    state["h.0.attn.masked_bias"] = torch.tensor(-1e4)
    write_gpt2_dir(tmp_path, state)
    assert load_hf(tmp_path).dropped == ["h.0.attn.bias", "h.0.attn.masked_bias"]


def test_wrong_shapes_and_untied_values_are_reported():
    hf = gpt2(seed=0)
    hf.transformer.h[0].attn.c_attn.weight = torch.nn.Parameter(torch.zeros(24, 71))
    with pytest.raises(KeyMapError, match=r"transformer\.h\.0\.attn\.c_attn\.weight: shape \(24, 71\) does not fit decoder\.layers\.0\.self_attn\.w_v\.weight \(24, 24\)"):
        load_hf(hf)
    hf = gpt2(seed=0)
    hf.lm_head.weight = torch.nn.Parameter(hf.lm_head.weight.detach() + 1)  # untied, config still says tied
    with pytest.raises(KeyMapError, match=r"lm_head\.weight should be tied to transformer\.wte\.weight"):
        load_hf(hf)


def test_missing_directory_says_how_to_get_one(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no Hugging Face model directory at .*never downloads.*huggingface-cli download.*save_pretrained"):
        load_hf(tmp_path / "gpt2")


def test_directory_without_safetensors(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"no model\.safetensors.*reads safetensors only.*found: config\.json, pytorch_model\.bin"):
        load_hf(tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"has no config\.json"):
        load_hf(tmp_path)


def test_config_without_equivalent(tmp_path):
    write_gpt2_dir(tmp_path, scale_attn_by_inverse_layer_idx=True)
    with pytest.raises(ConfigError, match=r"GPT2LMHeadModel: scale_attn_by_inverse_layer_idx=True is not supported"):
        load_hf(tmp_path)
    write_gpt2_dir(tmp_path, activation_function="quick_gelu")
    with pytest.raises(ConfigError, match=r"activation_function='quick_gelu' has no exact equivalent"):
        load_hf(tmp_path)


def test_model_type_must_match(tmp_path):
    write_gpt2_dir(tmp_path, model_type="bert")
    with pytest.raises(ConfigError, match=r"GPT2LMHeadModel needs model_type='gpt2', config says 'bert'"):
        load_hf(tmp_path)


def test_export_refuses_what_no_class_holds():
    rotary = DecoderOnly(DecoderOnlyConfig(vocab_size=16, n_layers=1, d_model=8, n_heads=2, d_ff=16, positions="rotary", norm_position="pre"))
    with pytest.raises(ConfigError, match=r"GPT2LMHeadModel: positions='rotary', but GPT2LMHeadModel needs 'learned'"):
        to_hf(rotary)
    pre_ln = EncoderDecoder(EncoderDecoderConfig(vocab_size=16, n_encoder_layers=1, n_decoder_layers=1, d_model=8, n_heads=2, d_ff=16, norm_position="pre"))
    with pytest.raises(ConfigError, match=r"MarianMTModel: norm_position='pre', but MarianMTModel needs 'post'"):
        to_hf(pre_ln)
    with pytest.raises(ConfigError, match=r"cannot export as BertForMaskedLM: BertForMaskedLM holds an encoder-only model"):
        to_hf(pre_ln, architecture="BertForMaskedLM")
    with pytest.raises(UnsupportedArchitecture, match=r"'T5ForConditionalGeneration'"):
        to_hf(pre_ln, architecture="T5ForConditionalGeneration")


def test_export_lists_tensors_no_rule_covers():
    ours = {"a.weight": torch.zeros(2), "b.weight": torch.zeros(2)}
    with pytest.raises(KeyMapError, match=r"1 tensors of this model that no rule exports: b\.weight"):
        export_tensors(ours, [Rule("x", ("a.weight",))], tied={})


def test_load_into_lists_unfilled_parameters():
    model = DecoderOnly(DecoderOnlyConfig(vocab_size=16, n_layers=1, d_model=8, n_heads=2, d_ff=16, positions="learned", max_len=8))
    state = dict(model.state_dict())
    del state["decoder.layers.0.ffn.w_1.bias"]
    state["decoder.layers.0.extra"] = torch.zeros(1)
    with pytest.raises(KeyMapError, match=r"parameters of the model left unfilled: decoder\.layers\.0\.ffn\.w_1\.bias.*keys the model does not have: decoder\.layers\.0\.extra"):
        load_into(model, state)


def test_export_writes_safetensors_transformers_reads(tmp_path):
    """The metadata transformers insists on, and no stray files."""
    from safetensors import safe_open

    imported = load_hf(marian(seed=0))
    save_hf(tmp_path, imported.model)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
