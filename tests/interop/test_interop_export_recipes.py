"""Every model type a recipe trains exports to a transformers class with the same logits and greedy tokens.

* Shakespeare (decoder-only, Pre-LN, learned positions, no biases) -> GPT2LMHeadModel with zero biases;
* SST-2 (encoder-only, Pre-LN) -> RobertaPreLayerNormForMaskedLM / ...ForSequenceClassification;
* Multi30k (encoder-decoder, Pre-LN, sinusoidal, embedding norm) -> MBartForConditionalGeneration.
A model no class can hold is refused, naming the field.
"""

from __future__ import annotations

import pytest
import torch
from interop_helpers import ATOL, assert_close_where, greedy, right_padded, token_ids

from aiayn.interop import ConfigError, load_hf, save_hf
from aiayn.models.config import DecoderOnlyConfig, EncoderDecoderConfig, EncoderOnlyConfig
from aiayn.models.presets import model_class

transformers = pytest.importorskip("transformers")


def _random(config, seed=0):
    torch.manual_seed(seed)
    model = model_class(config)(config).eval()
    with torch.no_grad():  # weights large enough that a wrong mapping shows (norm gains and biases too)
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def assert_imports_back(path, ours, config) -> None:
    """The exported directory imports back as ``config`` with every weight of ``ours`` bit for bit."""
    again = load_hf(path)
    assert again.config == config
    for key, value in ours.state_dict().items():
        assert torch.equal(again.model.state_dict()[key], value), key


def shakespeare_type(**overrides) -> DecoderOnlyConfig:
    """recipes/shakespeare-char.yaml's model, tiny."""
    fields = dict(vocab_size=50, n_layers=2, n_heads=4, d_model=32, d_ff=64, dropout=0.0, bias=False, activation="gelu",
                  norm_position="pre", positions="learned", max_len=32, scale_embeddings=False, init_std=0.02, pad_id=None)
    return DecoderOnlyConfig(**{**fields, **overrides})


def sst2_type(**overrides) -> EncoderOnlyConfig:
    """recipes/sst2-mlm.yaml / sst2.yaml's model, tiny."""
    fields = dict(vocab_size=50, n_layers=2, n_heads=4, d_model=32, d_ff=64, dropout=0.0, attention_dropout=0.0,
                  activation="gelu", norm_position="pre", positions="learned", max_len=32, scale_embeddings=False, init_std=0.02)
    return EncoderOnlyConfig(**{**fields, **overrides})


def test_bias_free_decoder_exports_as_gpt2_with_zero_biases(tmp_path):
    ours = _random(shakespeare_type())
    exported = save_hf(tmp_path, ours)
    assert exported.architecture == "GPT2LMHeadModel"
    biases = [k for k in exported.tensors if k.endswith(".bias")]
    assert biases and all(not exported.tensors[k].any() for k in biases)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    x = torch.randint(0, 50, (3, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert_close_where(ours(x), hf(x).logits, what="logits")
        theirs = hf.generate(x[:, :4], max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=0)
    from aiayn.decoding import CausalLMDecoder, greedy

    mine = greedy(CausalLMDecoder(ours), x[:, :4], max_new_tokens=10, eos_id=None).tokens
    assert mine.tolist() == theirs[:, 4:].tolist()


def test_a_zero_bias_gpt2_imports_back_as_the_same_function(tmp_path):
    save_hf(tmp_path, _random(shakespeare_type()))
    again = load_hf(tmp_path)  # imported as bias=True (GPT-2 always has biases), zero
    assert again.config.bias is True
    with torch.no_grad():
        torch.testing.assert_close(again.model(torch.tensor([[1, 2, 3]])), _random(shakespeare_type())(torch.tensor([[1, 2, 3]])))


@pytest.mark.parametrize("heads", ["mlm", "classifier"])
def test_pre_ln_encoder_exports_as_roberta_prelayernorm(heads, tmp_path):
    mlm = heads == "mlm"
    config = sst2_type(mlm_head=mlm, n_classes=0 if mlm else 2)
    ours = _random(config)
    exported = save_hf(tmp_path, ours)
    name = "RobertaPreLayerNormForMaskedLM" if mlm else "RobertaPreLayerNormForSequenceClassification"
    assert exported.architecture == name
    hf = getattr(transformers, name).from_pretrained(tmp_path).eval()
    x = torch.randint(7, 50, (3, 10), generator=torch.Generator().manual_seed(2))
    x[1, 6:] = 0  # right padding (pad id 0): RoBERTa's positions count real tokens only
    mask = x != 0
    with torch.no_grad():
        hidden = ours(x, mask)
        theirs = hf(x, attention_mask=mask.long()).logits
        if mlm:
            assert_close_where(ours.masked_lm_logits(hidden), theirs, mask, what="masked-LM logits")
            assert ours.masked_lm_logits(hidden)[mask].argmax(-1).tolist() == theirs[mask].argmax(-1).tolist()
        else:
            assert (ours.classification_logits(hidden, mask) - theirs).abs().max() <= ATOL
    assert_imports_back(tmp_path, ours, config)


def test_a_model_no_class_holds_is_refused_naming_the_field(tmp_path):
    with pytest.raises(ConfigError, match="positions='alibi'"):
        save_hf(tmp_path / "a", _random(shakespeare_type(positions="alibi")))
    with pytest.raises(ConfigError, match="mlm_head=True"):  # both heads: no single transformers class has them
        save_hf(tmp_path / "b", _random(sst2_type(n_classes=2)))


@pytest.mark.parametrize("bias", [False, True])
def test_rotary_decoder_exports_as_gpt_neox(bias, tmp_path):
    """The Shakespeare recipe with positions: rotary (its best model), and the same with biases."""
    config = shakespeare_type(positions="rotary", bias=bias, max_len=64)
    ours = _random(config)
    exported = save_hf(tmp_path, ours)
    assert exported.architecture == "GPTNeoXForCausalLM"
    hf = transformers.GPTNeoXForCausalLM.from_pretrained(tmp_path).eval()
    assert hf.config.use_parallel_residual is False
    x = torch.randint(0, 50, (3, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert_close_where(ours(x), hf(x).logits, what="logits")
        theirs = hf.generate(x[:, :4], max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=0)
    from aiayn.decoding import CausalLMDecoder, greedy

    assert greedy(CausalLMDecoder(ours), x[:, :4], max_new_tokens=10, eos_id=None).tokens.tolist() == theirs[:, 4:].tolist()
    assert_imports_back(tmp_path, ours, config.replace(max_len=64))


def multi30k_type(**overrides) -> EncoderDecoderConfig:
    """recipes/multi30k-de-en.yaml's model, tiny: Pre-LN, sinusoidal, shared tied vocabulary, embedding norm."""
    fields = dict(vocab_size=61, n_encoder_layers=2, n_decoder_layers=3, d_model=24, n_heads=4, d_ff=40, dropout=0.0,
                  attention_dropout=0.0, max_len=64, norm_position="pre", embedding_norm=True, share_embeddings=True,
                  init_std=0.02)
    return EncoderDecoderConfig(**{**fields, **overrides})


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_pre_ln_encoder_decoder_exports_as_mbart(positions, tmp_path):
    config = multi30k_type(positions=positions)
    ours = _random(config)
    exported = save_hf(tmp_path, ours)
    assert exported.architecture == "MBartForConditionalGeneration"
    hf = transformers.MBartForConditionalGeneration.from_pretrained(tmp_path).eval()
    src, src_mask = right_padded(token_ids(3, 9, seed=3), [9, 5, 2], pad=0)
    tgt, tgt_mask = right_padded(token_ids(3, 7, seed=4), [7, 4, 6], pad=0)
    tgt[:, 0] = 1  # BOS: the exported decoder_start_token_id
    with torch.no_grad():
        theirs = hf(input_ids=src, attention_mask=src_mask.long(), decoder_input_ids=tgt,
                    decoder_attention_mask=tgt_mask.long()).logits
        assert_close_where(ours(src, tgt), theirs, tgt_mask, what="logits")
        generated = hf.generate(input_ids=src, attention_mask=src_mask.long(), max_new_tokens=12, do_sample=False,
                                num_beams=1, eos_token_id=None, pad_token_id=0)
    assert hf.config.decoder_start_token_id == 1 and generated[:, 0].tolist() == [1] * 3
    tokens, _ = greedy(ours, src, src_mask, start=1, eos=-1, pad=0, max_new_tokens=12)
    assert tokens.tolist() == generated[:, 1:].tolist()
    assert_imports_back(tmp_path, ours, config)


def test_an_encoder_decoder_without_embedding_norm_is_refused_naming_the_field(tmp_path):
    with pytest.raises(ConfigError, match="embedding_norm=False"):
        save_hf(tmp_path, _random(multi30k_type(embedding_norm=False)))


def test_the_sst2_minilm_model_is_refused_naming_its_mean_pooling(tmp_path):
    """recipes/sst2-minilm.yaml's model (an imported BertModel, a new classifier on the mean-pooled output):
    BertForSequenceClassification classifies the pooled [CLS], so no transformers class holds it."""
    from interop_helpers import bert

    imported = load_hf(bert("BertModel"))
    config = imported.config.replace(pooling="mean", n_classes=2)
    with pytest.raises(ConfigError, match="pooling='mean'"):
        save_hf(tmp_path, _random(config))
    exported = save_hf(tmp_path / "cls", _random(config.replace(pooling="cls")))  # [CLS] pooling exports
    assert exported.architecture == "BertForSequenceClassification"
