"""A recipe's ``decode`` section (beam size, length penalty chosen on ``val``) travels with its model: ``aiayn.load``,
``aiayn translate``, ``aiayn evaluate`` (tests/test_own_data.py) and the server translate with it unless told otherwise;
a model without one translates as the paper did (beam 4, alpha 0.6)."""

from __future__ import annotations

import pytest
import torch

import aiayn
import aiayn.api
from aiayn import build_model
from aiayn.cli.main import main
from aiayn.pretrained import save_pretrained
from aiayn.serve.loading import ServedModel
from aiayn.serve.requests import translation
from aiayn.serve.schemas import TranslationRequest
from aiayn.tokenization import CharTokenizer
from aiayn.training.config import DecodeSection, TrainConfig

pytestmark = pytest.mark.reliability  # docs/reliability.md cites the bad-input test
TEXTS = ["hallo welt", "ein hund"]
RECIPE = "model: {preset: tiny-encoder-decoder}\ndata: {task: translation, dataset: files, tokenizer: char}\n"


@pytest.fixture(scope="module")
def tok():
    return CharTokenizer.train(["hallo welt hello world ein hund a dog"])


def _model_dir(root, tok, decode: str | None):
    torch.manual_seed(0)
    directory = save_pretrained(root, build_model("tiny-encoder-decoder", vocab_size=tok.vocab_size, dropout=0.0), tok)
    if decode is not None:
        (directory / "train_config.yaml").write_bytes((RECIPE + decode).encode("utf-8", "surrogateescape"))  # \udcff: byte 0xff
    return directory


def test_the_model_translates_with_its_recipe_settings_unless_told_otherwise(tmp_path, tok, monkeypatch, capsys):
    tuned = _model_dir(tmp_path / "tuned", tok, "decode: {beam_size: 2, length_penalty: 1.5}\n")
    plain = _model_dir(tmp_path / "plain", tok, None)
    assert aiayn.load(plain).decode == DecodeSection() == DecodeSection(beam_size=4, length_penalty=0.6)
    m = aiayn.load(tuned)
    assert m.decode == DecodeSection(beam_size=2, length_penalty=1.5)

    seen = []
    real = aiayn.api.translate_sentences
    monkeypatch.setattr(aiayn.api, "translate_sentences", lambda *a, **k: seen.append(a[3]) or real(*a, **k))
    default = m.translate(TEXTS, max_new_tokens=8)
    assert (seen[-1].beam_size, seen[-1].length_penalty) == (2, 1.5)
    m.translate(TEXTS, beam_size=3, length_penalty=0.0, max_new_tokens=8)  # a setting given is obeyed
    assert (seen[-1].beam_size, seen[-1].length_penalty) == (3, 0.0)

    assert main(["translate", "--checkpoint", str(tuned), "--max-new-tokens", "8", *TEXTS]) == 0
    assert capsys.readouterr().out.split("\n")[:2] == default
    with pytest.raises(SystemExit, match=r"--n-best must be <= the beam size, 2 \(the model's decode.beam_size"):
        main(["translate", "--checkpoint", str(tuned), "--n-best", "3", *TEXTS])


def test_the_server_fills_what_a_request_leaves_out(tok):
    model = build_model("tiny-encoder-decoder", vocab_size=tok.vocab_size)
    served = ServedModel(model, model.config, tok, tok, "mt", decode=DecodeSection(beam_size=2, length_penalty=1.5))
    assert translation(TranslationRequest(text="hallo"), served).key == (2, None, 1.5)
    assert translation(TranslationRequest(text="hallo", beam_size=1, length_penalty=0.6), served).key == (1, None, 0.6)
    assert served.as_loaded().decode == served.decode  # the server's Python twin translates alike


@pytest.mark.parametrize(("decode", "match"), [
    ("decode: {length_penalty: -1}\n", r"train_config.yaml: decode: decode.length_penalty=-1.0 must be a finite number >= 0"),
    ("decode: {beam_size: 0}\n", r"train_config.yaml: decode: decode.beam_size=0 must be an int >= 1"),
    ("decode: {beam: 5}\n", r"train_config.yaml: .*beam"),
    ("decode: {beam_size: 4}\n# \udcff\n", r"train_config.yaml: the config file is not UTF-8 text"),
])
def test_a_bad_decode_section_is_refused_naming_the_file_and_key(tmp_path, tok, decode, match):
    with pytest.raises(ValueError, match=match):
        aiayn.load(_model_dir(tmp_path / "bad", tok, decode))


def test_decode_settings_are_for_translation():
    with pytest.raises(ValueError, match="decode: beam search settings apply to translation, got data.task='lm'"):
        TrainConfig(data=TrainConfig().data.__class__(task="lm"), decode=DecodeSection(length_penalty=1.0))


def test_a_quantized_copy_keeps_the_decode_settings_and_class_names(tmp_path, tok):
    tuned = _model_dir(tmp_path / "tuned", tok, "decode: {beam_size: 2, length_penalty: 1.5}\n")
    (tuned / "labels.json").write_text('{"labels": ["a", "b"]}')
    assert main(["quantize", "--checkpoint", str(tuned), "--to", str(tmp_path / "q")]) == 0
    copy = aiayn.load(tmp_path / "q")
    assert copy.decode == DecodeSection(beam_size=2, length_penalty=1.5) and copy.labels == ["a", "b"]
    assert main(["quantize", "--checkpoint", str(tuned), "--to", str(tmp_path / "q"), "--overwrite"]) == 0  # replaced whole
