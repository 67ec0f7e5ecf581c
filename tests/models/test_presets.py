"""Presets by exact name, and the paper's parameter counts (Table 3)."""

import pytest

import aiayn
from aiayn import build_model, preset


def n_params(model):
    return sum(p.numel() for p in model.parameters())  # tied tables counted once


@pytest.mark.parametrize("name, paper_count", [("paper-base", 65e6), ("paper-big", 213e6)])
def test_table3_parameter_counts(name, paper_count):
    """Table 3: base 65M, big 213M, with a shared 37,000-token vocabulary and three-way tying."""
    model = build_model(name, vocab_size=37000)
    assert abs(n_params(model) - paper_count) / paper_count < 0.03


def test_known_sizes_of_other_presets():
    assert n_params(build_model("gpt2-small")) == 124_439_808  # GPT-2 small as released
    bert = build_model("bert-base")
    body = n_params(bert) - sum(p.numel() for n, p in bert.named_parameters() if n.startswith(("mlm_", "classifier")))
    assert body == 109_482_240  # BertModel (with pooler) as released


def test_three_way_tying():
    model = build_model("paper-base", vocab_size=1000)
    assert model.src_embed.weight is model.tgt_embed.weight is model.output.weight
    untied = build_model("paper-base", vocab_size=1000, share_embeddings=False, tie_output=False)
    assert untied.src_embed.weight is not untied.tgt_embed.weight
    assert untied.output.weight is not untied.tgt_embed.weight


def test_separate_vocabularies():
    model = build_model("tiny-encoder-decoder", vocab_size=40, tgt_vocab_size=30, share_embeddings=False)
    assert model.output.out_features == 30 and model.src_embed.weight.shape[0] == 40


def test_unknown_preset_lists_valid_ones():
    with pytest.raises(ValueError, match=r"unknown preset 'paper-bse'; valid presets: paper-base, paper-big, gpt2-small, bert-base"):
        build_model("paper-bse")


def test_unknown_override_suggests_closest():
    with pytest.raises(ValueError, match=r"unknown key 'd_modle' for EncoderDecoderConfig \(did you mean 'd_model'\?\)"):
        preset("paper-base", d_modle=256)


def test_build_from_config_and_dict():
    config = preset("tiny-decoder-only")
    assert type(build_model(config)).__name__ == "DecoderOnly"
    assert build_model(config.to_dict()).config == config
    assert build_model(config, n_layers=3).config.n_layers == 3
    assert aiayn.__version__
