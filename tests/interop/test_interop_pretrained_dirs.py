"""Hugging Face directories with their own tokenizers: imported, then used by aiayn.load and every command.

The special ids used are the checkpoint's own (BERT's [CLS] 2 / [SEP] 3 / [MASK] 4, GPT-2's
<|endoftext|> 0, Marian's </s> 0 and decoder start = <pad>), checked against transformers.
"""

from __future__ import annotations

import json

import pytest
import torch
from pretrained_dirs import GERMAN, SENTENCES, bert_dir, gpt2_dir, marian_dir

import aiayn
from aiayn.cli.main import main
from aiayn.tokenization.special import SpecialIds

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return bert_dir(tmp_path_factory.mktemp("bert"))


@pytest.fixture(scope="module")
def bert_classifier(tmp_path_factory):
    return bert_dir(tmp_path_factory.mktemp("bert-cls"), "BertForSequenceClassification", id2label={0: "sad", 1: "happy"},
                    label2id={"sad": 0, "happy": 1})


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    return gpt2_dir(tmp_path_factory.mktemp("gpt2"))


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    return marian_dir(tmp_path_factory.mktemp("marian"))


def test_special_ids_are_the_checkpoints_own(bert, gpt2, marian):
    assert aiayn.load(bert).special_ids == SpecialIds(pad=0, bos=None, eos=None, unk=1, cls=2, sep=3, mask=4)
    assert aiayn.load(gpt2).special_ids == SpecialIds(pad=None, bos=0, eos=0, unk=0, cls=None, sep=None, mask=None)
    m = aiayn.load(marian)
    pad = json.loads((marian / "vocab.json").read_text())["<pad>"]
    assert m.special_ids == SpecialIds(pad=pad, bos=pad, eos=0, unk=1, cls=None, sep=None, mask=None)


def test_wordpiece_ids_equal_transformers(bert):
    ours = aiayn.load(bert).tokenizer
    theirs = transformers.AutoTokenizer.from_pretrained(bert)
    for text in [*SENTENCES, "The CATS ran, unknown-words!"]:
        ids = ours.encode(text)
        assert ids == theirs(text, add_special_tokens=False)["input_ids"]
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)


def test_marian_ids_equal_transformers(marian):
    m = aiayn.load(marian)
    theirs = transformers.MarianTokenizer.from_pretrained(marian)
    for source, target in zip(GERMAN, SENTENCES):
        assert m.src_tokenizer.encode(source, add_eos=True) == theirs(source)["input_ids"]
        ids = theirs(text_target=target)["input_ids"]
        assert m.tgt_tokenizer.encode(target, add_eos=True) == ids
        assert m.tgt_tokenizer.decode(ids) == theirs.decode(ids, skip_special_tokens=True)


def test_fill_mask_matches_transformers(bert):
    m = aiayn.load(bert)
    hf = transformers.BertForMaskedLM.from_pretrained(bert).eval()
    tok = transformers.AutoTokenizer.from_pretrained(bert)
    text = "the cat [MASK] on the mat ."
    with torch.no_grad():
        enc = tok(text, return_tensors="pt")
        logits = hf(**enc).logits[0, enc["input_ids"][0].tolist().index(4)]
    logits[[0, 1, 2, 3, 4]] = -float("inf")  # specials are never candidates
    result = m.fill_mask(text, top_k=3)
    expected = logits.softmax(-1).topk(3)
    want = [tok.decode([i]) for i in expected.indices.tolist()]
    assert [t for t, _ in result.candidates[0]] == want
    assert result.text == tok.decode(tok(f"the cat {want[0]} on the mat .")["input_ids"], skip_special_tokens=True)


def test_classify_uses_label_names_and_matches_transformers(bert_classifier):
    m = aiayn.load(bert_classifier)
    hf = transformers.BertForSequenceClassification.from_pretrained(bert_classifier).eval()
    tok = transformers.AutoTokenizer.from_pretrained(bert_classifier)
    with torch.no_grad():
        enc = tok(SENTENCES[:3], return_tensors="pt", padding=True)
        probs = hf(**enc).logits.softmax(-1)
    predictions = m.classify(SENTENCES[:3])
    for prediction, row in zip(predictions, probs.tolist()):
        assert set(prediction.probs) == {"sad", "happy"}
        assert prediction.probs["sad"] == pytest.approx(row[0], abs=1e-5)
        assert prediction.label == ("sad" if row[0] > row[1] else "happy")


def test_generate_greedy_matches_transformers(gpt2):
    m = aiayn.load(gpt2)
    hf = transformers.GPT2LMHeadModel.from_pretrained(gpt2).eval()
    prompt = "the cat"
    ids = m.tokenizer.encode(prompt)
    with torch.no_grad():
        theirs = hf.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, pad_token_id=0)[0, len(ids):].tolist()
    if 0 in theirs:  # <|endoftext|> ends the text
        theirs = theirs[: theirs.index(0)]
    assert m.generate(prompt, 8, greedy=True) == prompt + m.tokenizer.decode(theirs)


def test_score_of_gpt2_is_its_log_likelihood(gpt2):
    m = aiayn.load(gpt2)
    hf = transformers.GPT2LMHeadModel.from_pretrained(gpt2).eval()
    text = SENTENCES[0]
    ids = torch.tensor([[0, *m.tokenizer.encode(text)]])  # after BOS = <|endoftext|>
    with torch.no_grad():
        loss = hf(ids, labels=ids).loss  # mean over the len - 1 predicted tokens
    assert m.score(text)[0] == pytest.approx(-float(loss) * (ids.shape[1] - 1), abs=1e-3)


def test_translate_matches_transformers(marian):
    m = aiayn.load(marian)
    hf = transformers.MarianMTModel.from_pretrained(marian).eval()
    tok = transformers.MarianTokenizer.from_pretrained(marian)
    with torch.no_grad():  # greedy: the source ends with </s>, decoding starts from <pad> and stops at </s>
        out = hf.generate(**tok(GERMAN[:3], return_tensors="pt", padding=True), num_beams=1, max_new_tokens=10, do_sample=False)
    assert m.translate(GERMAN[:3], beam_size=1, max_new_tokens=10) == [tok.decode(row, skip_special_tokens=True) for row in out]


@pytest.mark.parametrize("which", ["bert", "gpt2", "marian"])
def test_every_command_runs_on_the_hugging_face_directory(which, bert, gpt2, marian, tmp_path, capsys):
    path = {"bert": bert, "gpt2": gpt2, "marian": marian}[which]
    commands = {
        "bert": [["fill-mask", "--checkpoint", str(path), "the cat [MASK] on the mat ."],
                 ["fill-mask", "--checkpoint", str(path), "the cat <mask> on the mat ."],
                 ["viz", "attention", "--checkpoint", str(path), "--text", "the cat sat", "--out", str(tmp_path / "v")]],
        "gpt2": [["generate", "--checkpoint", str(path), "--prompt", "the cat", "--max-new-tokens", "5", "--greedy"],
                 ["viz", "attention", "--checkpoint", str(path), "--text", "the cat sat", "--out", str(tmp_path / "v")]],
        "marian": [["translate", "--checkpoint", str(path), "--beam-size", "2", "--max-new-tokens", "6", GERMAN[0]],
                   ["viz", "attention", "--checkpoint", str(path), "--text", GERMAN[0], "--out", str(tmp_path / "v")]],
    }[which]
    for argv in commands:
        assert main(argv) == 0, argv
    out = capsys.readouterr().out
    if which == "bert":
        assert "filled: the cat" in out and "[MASK]" not in out.split("filled:")[-1]


def test_convert_keeps_the_tokenizer(bert, marian, tmp_path):
    from aiayn.interop.convert import convert_from_hf
    from aiayn.pretrained import load_pretrained

    convert_from_hf(bert, tmp_path / "bert")
    convert_from_hf(marian, tmp_path / "marian")
    assert (tmp_path / "bert" / "hf_tokenizer.json").is_file()
    assert (tmp_path / "marian" / "src_spm_tokenizer.json").is_file()
    again = aiayn.load(tmp_path / "bert")
    assert again.special_ids == aiayn.load(bert).special_ids
    assert again.fill_mask("the cat [MASK] on the mat .") == aiayn.load(bert).fill_mask("the cat [MASK] on the mat .")
    marian_again = load_pretrained(tmp_path / "marian")
    assert marian_again.src_tokenizer.encode(GERMAN[0]) == aiayn.load(marian).src_tokenizer.encode(GERMAN[0])
    assert aiayn.load(tmp_path / "marian").translate(GERMAN[:2], beam_size=2) == aiayn.load(marian).translate(GERMAN[:2], beam_size=2)


def test_export_writes_the_pretrained_tokenizer_back(bert, tmp_path):
    from aiayn.interop.convert import convert_from_hf, convert_to_hf

    convert_from_hf(bert, tmp_path / "ours")
    _, note = convert_to_hf(tmp_path / "ours", tmp_path / "back")
    assert note is None
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")
    assert (theirs.cls_token_id, theirs.sep_token_id, theirs.mask_token_id, theirs.pad_token_id) == (2, 3, 4, 0)
    assert theirs("the cats sat")["input_ids"] == [2, *aiayn.load(bert).tokenizer.encode("the cats sat"), 3]
