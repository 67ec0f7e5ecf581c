"""``aiayn convert`` both ways, and what happens to tokenizers."""

from __future__ import annotations

import json

import pytest
import torch
from interop_helpers import EOS, assert_close_where, assert_state_dicts_equal, gpt2, marian, token_ids, transformers
from tokenizers import Tokenizer, models

from aiayn.cli.main import main
from aiayn.interop import load_hf, to_hf
from aiayn.interop.hf_dir import read_hf_tokenizer
from aiayn.models.config import DecoderOnlyConfig
from aiayn.models.decoder_only import DecoderOnly
from aiayn.pretrained import load_pretrained, save_pretrained
from aiayn.tokenization.bpe import BPETokenizer


@torch.no_grad()
def test_convert_from_hf_and_back(tmp_path, capsys):
    hf = marian(seed=0)
    hf.save_pretrained(tmp_path / "hf")
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--to", str(tmp_path / "ours")]) == 0
    out = capsys.readouterr().out
    assert "imported MarianMTModel into the encoder-decoder family" in out and "tokenizer: none" in out
    loaded = load_pretrained(tmp_path / "ours")
    src, tgt = token_ids(2, 7, seed=1), token_ids(2, 5, seed=2)
    assert_close_where(loaded.model(src, tgt), hf(input_ids=src, decoder_input_ids=tgt).logits)
    assert json.loads((tmp_path / "ours" / "hf_source.json").read_text())["architecture"] == "MarianMTModel"

    assert main(["convert", "--to-hf", str(tmp_path / "hf2"), "--from", str(tmp_path / "ours")]) == 0
    assert "exported as MarianMTModel" in capsys.readouterr().out
    again = transformers.MarianMTModel.from_pretrained(tmp_path / "hf2").eval()
    for key in ("decoder_start_token_id", "eos_token_id", "pad_token_id"):  # kept through hf_source.json
        assert getattr(again.config, key) == getattr(hf.config, key)
    assert_close_where(again(input_ids=src, decoder_input_ids=tgt).logits, hf(input_ids=src, decoder_input_ids=tgt).logits)


def test_convert_needs_one_direction(capsys):
    with pytest.raises(SystemExit, match="give either --from-hf DIR --to DIR"):
        main(["convert", "--from-hf", "x"])
    with pytest.raises(SystemExit, match="give either"):
        main(["convert", "--from-hf", "x", "--to", "y", "--to-hf", "z"])


def test_convert_errors_are_reported_not_raised(tmp_path, capsys):
    assert main(["convert", "--from-hf", str(tmp_path / "nothing"), "--to", str(tmp_path / "ours")]) == 2
    assert "huggingface-cli download" in capsys.readouterr().err
    model = DecoderOnly(DecoderOnlyConfig(vocab_size=16, n_layers=1, d_model=8, n_heads=2, d_ff=16, positions="learned", max_len=8, norm_position="pre", scale_embeddings=False))
    save_pretrained(tmp_path / "ours", model)
    assert main(["convert", "--from-hf", str(tmp_path / "ours"), "--to", str(tmp_path / "x")]) == 2
    assert "is an aiayn model directory" in capsys.readouterr().err
    (tmp_path / "hf").mkdir()
    assert main(["convert", "--to-hf", str(tmp_path / "hf"), "--from", str(tmp_path / "ours")]) == 2
    assert "exists; pass overwrite=True (--overwrite)" in capsys.readouterr().err
    assert main(["convert", "--to-hf", str(tmp_path / "hf"), "--from", str(tmp_path / "ours"), "--overwrite"]) == 0


def test_foreign_tokenizer_is_left_out_with_the_reason(tmp_path):
    Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1, "hello": 2}, unk_token="[UNK]")).save(str(tmp_path / "tokenizer.json"))
    tokenizer, note = read_hf_tokenizer(tmp_path)
    assert tokenizer is None
    assert "not in aiayn's special-token layout" in note and "without a tokenizer" in note


@torch.no_grad()
def test_our_tokenizer_travels_both_ways(tmp_path):
    tokenizer = BPETokenizer.train(["the quick brown fox jumps over the lazy dog"] * 4, vocab_size=280, min_frequency=1)
    config = DecoderOnlyConfig(
        vocab_size=tokenizer.vocab_size, n_layers=1, d_model=16, n_heads=2, d_ff=32, dropout=0.0, activation="gelu_tanh",
        norm_position="pre", positions="learned", max_len=16, scale_embeddings=False, init_std=0.3,
    )
    save_pretrained(tmp_path / "ours", DecoderOnly(config).eval(), tokenizer)
    assert main(["convert", "--to-hf", str(tmp_path / "hf"), "--from", str(tmp_path / "ours")]) == 0
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "the lazy fox"
    assert hf_tokenizer(text, add_special_tokens=False)["input_ids"] == tokenizer.encode(text)
    assert (hf_tokenizer.pad_token_id, hf_tokenizer.eos_token_id) == (0, EOS)
    imported = load_hf(tmp_path / "hf")
    assert imported.tokenizer is not None and imported.tokenizer.encode(text) == tokenizer.encode(text)
    original = load_pretrained(tmp_path / "ours").model
    assert_state_dicts_equal(imported.model.state_dict(), original.state_dict())


def test_gpt2_directory_saved_by_transformers(tmp_path):
    """The layout transformers writes (prefixed keys, tied head left out) imports as is."""
    hf = gpt2(seed=0)
    hf.save_pretrained(tmp_path)
    imported = load_hf(tmp_path)
    assert imported.architecture == "GPT2LMHeadModel" and imported.dropped == []
    ids = token_ids(2, 8, seed=3)
    with torch.no_grad():
        assert_close_where(imported.model(ids), hf(ids).logits)


def test_sharded_checkpoint(tmp_path):
    hf = gpt2(seed=0)
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and not (tmp_path / "model.safetensors").exists()
    ids = token_ids(2, 8, seed=4)
    with torch.no_grad():
        assert_close_where(load_hf(tmp_path).model(ids), hf(ids).logits)


def test_half_precision_is_kept_bit_for_bit(tmp_path):
    hf = gpt2(seed=0).half()
    hf.save_pretrained(tmp_path)
    imported = load_hf(tmp_path)
    assert imported.model.embed.weight.dtype == torch.float16
    exported = to_hf(imported.model)
    assert exported.config["dtype"] == "float16"
    assert_state_dicts_equal(exported.tensors, {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"})
