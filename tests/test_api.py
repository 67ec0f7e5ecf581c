"""aiayn.load: one line from a directory to translations, generations, classes, filled masks and scores,
through the same code as the CLI (so the two agree), with errors that name what is wrong."""

from __future__ import annotations

import json

import pytest
import torch

import aiayn
from aiayn import build_model
from aiayn.cli.main import main
from aiayn.pretrained import LABELS_FILE, save_pretrained
from aiayn.tokenization import CharTokenizer

TEXTS = ["hallo welt", "ein hund", "guten tag"]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("api")
    tok = CharTokenizer.train(["hallo welt hello world ein hund a dog guten tag good day"])
    torch.manual_seed(0)
    out = {}
    for name, preset, extra in (
        ("seq2seq", "tiny-encoder-decoder", {}),
        ("lm", "tiny-decoder-only", {}),
        ("bert", "tiny-encoder-only", {"n_classes": 3}),
    ):
        model = build_model(preset, vocab_size=tok.vocab_size, dropout=0.0, **extra)
        out[name] = save_pretrained(root / name, model, tok)
    (out["bert"] / LABELS_FILE).write_text(json.dumps({"labels": ["neg", "neutral", "pos"]}))
    return out


def test_the_handle_says_what_it_holds(dirs):
    m = aiayn.load(dirs["seq2seq"])
    assert m.family == "encoder-decoder" and m.config == m.model.config and not m.model.training
    assert m.tokenizer is m.src_tokenizer is m.tgt_tokenizer
    assert aiayn.load(dirs["lm"]).family == "decoder-only" and aiayn.load(dirs["bert"]).family == "encoder-only"


def test_translate_is_what_the_cli_prints(dirs, capsys):
    m = aiayn.load(dirs["seq2seq"])
    ours = m.translate(TEXTS, beam_size=3, max_new_tokens=8)
    assert main(["translate", "--checkpoint", str(dirs["seq2seq"]), "--beam-size", "3", "--max-new-tokens", "8", *TEXTS]) == 0
    assert capsys.readouterr().out.split("\n")[:3] == ours
    assert m.translate("hallo welt", beam_size=3, max_new_tokens=8) == ours[:1]  # one text is a list of one


def test_generate_is_what_the_cli_prints(dirs, capsys):
    m = aiayn.load(dirs["lm"])
    text = m.generate("hallo", max_new_tokens=6, greedy=True)
    assert main(["generate", "--checkpoint", str(dirs["lm"]), "--prompt", "hallo", "--max-new-tokens", "6", "--greedy"]) == 0
    assert capsys.readouterr().out == text + "\n"
    assert m.generate("hallo", 6, seed=3) == m.generate("hallo", 6, seed=3)  # seeded sampling repeats
    kept = m.generate("hallo", max_new_tokens=6, greedy=True, kv_dtype="bf16")  # the cache in bf16: what the CLI prints with it
    assert main(["generate", "--checkpoint", str(dirs["lm"]), "--prompt", "hallo", "--max-new-tokens", "6", "--greedy",
                 "--kv-cache-dtype", "bf16"]) == 0
    assert capsys.readouterr().out == kept + "\n" and kept.startswith("hallo")
    with pytest.raises(ValueError, match=r"kv_dtype must be one of float32, bfloat16, float16, got .int8."):
        m.generate("hallo", 6, kv_dtype="int8")


def test_generate_keeps_int8_and_int4_caches_in_bf16_by_default(dirs, monkeypatch):
    """kv_dtype defaults to "auto": bf16 for int8 and int4 weights under fp32 activations, the activations' otherwise;
    None asks for the activations' dtype."""
    import aiayn.api

    made = []

    class Recorded(aiayn.api.CausalLMDecoder):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self.kv_dtype)

    monkeypatch.setattr(aiayn.api, "CausalLMDecoder", Recorded)
    for quantize, kv_dtype in (("int8", "auto"), ("int4", "auto"), ("int8", None), (None, "auto")):
        assert aiayn.load(dirs["lm"], quantize=quantize).generate("hallo", 3, greedy=True, kv_dtype=kv_dtype).startswith("hallo")
    assert aiayn.load(dirs["lm"], quantize="int8").generate("hallo", 3, greedy=True).startswith("hallo")  # the default
    assert made == [torch.bfloat16, torch.bfloat16, None, None, torch.bfloat16]


def test_classify_names_the_labels(dirs, capsys):
    m = aiayn.load(dirs["bert"])
    predictions = m.classify(TEXTS)
    assert [set(p.probs) for p in predictions] == [{"neg", "neutral", "pos"}] * 3
    for p in predictions:
        assert p.label == max(p.probs, key=p.probs.get) and p.prob == p.probs[p.label]
        assert sum(p.probs.values()) == pytest.approx(1.0, abs=1e-5)
    assert main(["classify", "--checkpoint", str(dirs["bert"]), *TEXTS]) == 0
    assert [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()] == [p.label for p in predictions]


def test_fill_mask_gives_text(dirs):
    result = aiayn.load(dirs["bert"]).fill_mask("hal<mask>o welt", top_k=2)
    assert len(result.candidates) == 1 and len(result.candidates[0]) == 2
    best = result.candidates[0][0][0]
    assert result.text == f"hal{best}o welt"


def test_score_is_the_log_likelihood(dirs):
    m = aiayn.load(dirs["lm"])
    text = "hallo welt"
    ids = torch.tensor([[1, *m.tokenizer.encode(text)]])  # after <bos>
    with torch.no_grad():
        log_probs = m.model(ids[:, :-1]).log_softmax(-1)
    expected = float(log_probs.gather(-1, ids[:, 1:, None]).sum())
    assert m.score(text) == [pytest.approx(expected, abs=1e-4)]
    seq2seq = aiayn.load(dirs["seq2seq"])
    assert len(seq2seq.score(TEXTS, TEXTS)) == 3
    with pytest.raises(ValueError, match="targets must have 3 texts"):
        seq2seq.score(TEXTS)
    assert len(aiayn.load(dirs["bert"]).score(TEXTS)) == 3  # pseudo-log-likelihood


def test_dtype_and_device(dirs):
    m = aiayn.load(dirs["lm"], dtype="bfloat16", device="cpu")
    assert {p.dtype for p in m.model.parameters()} == {torch.bfloat16}
    assert isinstance(m.generate("hallo", 3, greedy=True), str)
    with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16, float16"):
        aiayn.load(dirs["lm"], dtype="float33")


def test_errors_name_what_is_wrong(dirs, tmp_path):
    with pytest.raises(ValueError, match=r"translate\(\) needs an encoder-decoder model; .* holds a decoder-only model"):
        aiayn.load(dirs["lm"]).translate(TEXTS)
    with pytest.raises(ValueError, match=r"classify\(\) needs an encoder-only model"):
        aiayn.load(dirs["seq2seq"]).classify(TEXTS)
    with pytest.raises(FileNotFoundError, match="no model at"):
        aiayn.load(tmp_path / "nothing")
    save_pretrained(tmp_path / "bare", build_model("tiny-decoder-only"))
    with pytest.raises(ValueError, match="no tokenizer, so text cannot be encoded"):
        aiayn.load(tmp_path / "bare")
    with pytest.raises(TypeError, match=r"texts\[1\] must be a str"):
        aiayn.load(dirs["bert"]).classify(["ok", 3])


def test_the_package_names_are_listed_alike_three_times():
    """``aiayn/__init__.py`` names its lazy exports three times (the lookup table, ``__all__``, the type checkers'
    imports): the three lists must agree, and every name must resolve."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(aiayn.__file__).read_text(encoding="utf-8"))
    checked = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.If)
               for inner in node.body if isinstance(inner, ast.ImportFrom) for alias in inner.names}
    assert set(aiayn._EXPORTS) == set(aiayn.__all__) - {"__version__"} == checked
    assert all(getattr(aiayn, name) is not None for name in aiayn._EXPORTS)
