"""Config validation: each bad value raises ValueError naming the field, the value and the rule."""

import json

import pytest

from aiayn.models.config import (
    DecoderOnlyConfig,
    EncoderDecoderConfig,
    EncoderOnlyConfig,
    config_from_dict,
    config_from_json,
)

BAD = [
    ({"d_model": 100, "n_heads": 8}, r"d_model=100 must be divisible by n_heads=8"),
    ({"n_heads": 8, "n_kv_heads": 3}, r"n_kv_heads=3 must divide n_heads=8"),
    ({"d_model": 0}, r"d_model=0 must be a positive integer"),
    ({"d_ff": -5}, r"d_ff=-5 must be a positive integer"),
    ({"n_heads": 2.5}, r"n_heads=2.5 must be a positive integer"),
    ({"dropout": 1.0}, r"dropout=1.0 must be in \[0, 1\)"),
    ({"attention_dropout": -0.1}, r"attention_dropout=-0.1 must be in \[0, 1\)"),
    ({"activation": "tanh"}, r"activation='tanh' must be one of \('relu', 'gelu', 'gelu_tanh', 'silu', 'swiglu', 'relu2'\)"),
    ({"norm": "batchnorm"}, r"norm='batchnorm' must be one of \('layernorm', 'rmsnorm'\)"),
    ({"norm_position": "middle"}, r"norm_position='middle' must be one of \('post', 'pre'\)"),
    ({"positions": "t5"}, r"positions='t5' must be one of \('sinusoidal', 'learned', 'rotary', 'alibi', 'none'\)"),
    ({"attention_backend": "flash"}, r"attention_backend='flash' must be one of \('math', 'sdpa', 'auto'\)"),
    ({"norm_eps": 0.0}, r"norm_eps=0.0 must be > 0"),
    ({"max_len": 0}, r"max_len=0 must be a positive integer"),
    ({"vocab_size": 0}, r"vocab_size=0 must be a positive integer"),
    ({"n_encoder_layers": 0}, r"n_encoder_layers=0 must be a positive integer"),
    ({"pad_id": 10, "vocab_size": 10}, r"pad_id=10 must be < vocab_size=10"),
    ({"tgt_vocab_size": 20}, r"share_embeddings=True needs one shared vocabulary"),
    ({"d_model": 24, "n_heads": 8, "positions": "rotary"}, r"rotary needs an even head size, got 3"),
    ({"init_std": 0.0}, r"init_std=0.0 must be > 0 or None"),
]


@pytest.mark.parametrize("fields, message", BAD, ids=[m.split("=")[0] for _, m in BAD])
def test_bad_values_name_field_value_rule(fields, message):
    kw = {"vocab_size": 100, **fields}
    with pytest.raises(ValueError, match=message):
        EncoderDecoderConfig(**kw)


def test_family_specific_fields():
    with pytest.raises(ValueError, match="n_layers=0 must be a positive integer"):
        DecoderOnlyConfig(vocab_size=10, n_layers=0)
    with pytest.raises(ValueError, match="n_segments=-1 must be >= 0"):
        EncoderOnlyConfig(vocab_size=10, n_segments=-1)


@pytest.mark.parametrize("config", [
    EncoderDecoderConfig(vocab_size=100, tgt_vocab_size=90, share_embeddings=False, positions="rotary"),
    DecoderOnlyConfig(vocab_size=50, n_kv_heads=2, activation="swiglu", norm="rmsnorm", pad_id=None),
    EncoderOnlyConfig(vocab_size=30, n_classes=3, positions="learned", init_std=0.02),
])
def test_json_round_trip(config):
    text = config.to_json()
    assert json.loads(text)["family"] == config.family
    assert config_from_json(text) == config


def test_from_dict_errors():
    with pytest.raises(ValueError, match=r"family must be one of \['decoder-only', 'encoder-decoder', 'encoder-only'\], got 'gpt'"):
        config_from_dict({"family": "gpt"})
    with pytest.raises(ValueError, match=r"unknown key 'nlayers' for DecoderOnlyConfig \(did you mean 'n_layers'\?\)"):
        config_from_dict({"family": "decoder-only", "vocab_size": 5, "nlayers": 2})
