"""save_pretrained / load_pretrained: a model directory round-trips exactly, atomically, with tokenizers."""

import json

import pytest
import torch

from aiayn import build_model
from aiayn.pretrained import load_pretrained, save_pretrained
from aiayn.tokenization import CharTokenizer


def test_round_trip_with_shared_tokenizer(tmp_path):
    tok = CharTokenizer.train(["hallo welt", "hello world"])
    model = build_model("tiny-encoder-decoder", vocab_size=tok.vocab_size)
    out = save_pretrained(tmp_path / "m", model, tok)
    loaded = load_pretrained(out)
    assert loaded.config == model.config
    assert loaded.src_tokenizer is loaded.tgt_tokenizer
    assert loaded.src_tokenizer.encode("hello") == tok.encode("hello")
    for (name, a), b in zip(model.state_dict().items(), loaded.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert loaded.model.output.weight is loaded.model.src_embed.weight  # ties survive
    assert not loaded.model.training


def test_refuses_to_overwrite_and_names_path(tmp_path):
    model = build_model("tiny-decoder-only")
    save_pretrained(tmp_path / "m", model)
    with pytest.raises(FileExistsError, match=f"{tmp_path / 'm'} exists; pass overwrite=True"):
        save_pretrained(tmp_path / "m", model)
    save_pretrained(tmp_path / "m", model, overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no temporary leftovers


@pytest.mark.reliability
def test_tokenizer_larger_than_vocabulary_fails_before_writing(tmp_path):
    tok = CharTokenizer.train(["abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ!?"])
    model = build_model("tiny-decoder-only", vocab_size=20)
    with pytest.raises(ValueError, match="vocab_size"):
        save_pretrained(tmp_path / "m", model, tok)
    assert not (tmp_path / "m").exists()


def test_missing_and_mismatched(tmp_path):
    with pytest.raises(FileNotFoundError, match="no model at .*nowhere"):
        load_pretrained(tmp_path / "nowhere")
    out = save_pretrained(tmp_path / "m", build_model("tiny-decoder-only"))
    config = json.loads((out / "config.json").read_text())
    config["d_ff"] = 128
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="shape mismatches"):
        load_pretrained(out)
