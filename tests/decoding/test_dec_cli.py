"""The inference commands on tiny saved models: output exists and is well formed; bad arguments
give errors that name the argument and its value."""

import io

import pytest
import torch

from aiayn import build_model
from aiayn.cli.main import main
from aiayn.pretrained import save_pretrained
from aiayn.tokenization import CharTokenizer

TEXTS = ["a cat sat", "the dog", "hello world."]


@pytest.fixture(scope="module")
def tokenizer():
    return CharTokenizer.train(TEXTS)


def saved(tmp_path_factory, tokenizer, preset, **overrides):
    torch.manual_seed(0)
    model = build_model(preset, vocab_size=tokenizer.vocab_size, **overrides).eval()
    return str(save_pretrained(tmp_path_factory.mktemp(preset) / "model", model, tokenizer))


@pytest.fixture(scope="module")
def translator(tmp_path_factory, tokenizer):
    return saved(tmp_path_factory, tokenizer, "tiny-encoder-decoder")


@pytest.fixture(scope="module")
def lm(tmp_path_factory, tokenizer):
    return saved(tmp_path_factory, tokenizer, "tiny-decoder-only")


@pytest.fixture(scope="module")
def bert(tmp_path_factory, tokenizer):
    return saved(tmp_path_factory, tokenizer, "tiny-encoder-only", n_classes=3)


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_translate_arguments(capsys, translator):
    code, out, _ = run(capsys, "translate", "--checkpoint", translator, "--max-new-tokens", "5", *TEXTS[:2])
    assert code == 0 and len(out.splitlines()) == 2


def test_translate_stdin_and_n_best(capsys, translator, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("a cat\nthe dog\n"))
    code, out, _ = run(capsys, "translate", "--checkpoint", translator, "--max-new-tokens", "4", "--n-best", "2", "--batch-size", "1")
    lines = [line.split("\t") for line in out.splitlines()]
    assert code == 0 and [f[0] for f in lines] == ["0", "0", "1", "1"]
    scores = [float(f[1]) for f in lines]
    assert scores[0] >= scores[1] and scores[2] >= scores[3]


def test_translate_refuses_empty_input_and_warns_about_empty_lines(capsys, translator):
    with pytest.raises(SystemExit, match="the input is empty: nothing to translate"):
        main(["translate", "--checkpoint", translator, ""])
    code, out, err = run(capsys, "translate", "--checkpoint", translator, "--max-new-tokens", "3", "a cat", " ", "the dog")
    assert code == 0 and out.split("\n")[1] == "" and len(out.splitlines()) == 3
    assert "input 2 is empty" in err


def test_translate_batches_by_length_but_answers_in_input_order(translator, tokenizer):
    """The one translation path: sorted batches give each sentence the output it gets alone."""
    from aiayn.decoding.beam import BeamConfig
    from aiayn.decoding.translate import translate_sentences
    from aiayn.pretrained import load_pretrained

    model = load_pretrained(translator).model
    texts = ["a", "hello world. the dog", "", "the cat sat"]
    beam = BeamConfig(beam_size=2, max_new_tokens=4)
    together = translate_sentences([model], tokenizer, texts, beam, batch_size=2)
    alone = [translate_sentences([model], tokenizer, [t], beam)[0] for t in texts]
    assert together[2] == [] and [[h.tokens for h in hs] for hs in together] == [[h.tokens for h in hs] for hs in alone]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--beam-size", "0"], "--beam-size must be >= 1, got 0"),
        (["--n-best", "5"], r"--n-best must be <= the beam size, 4 \(the model's decode.beam_size; give --beam-size\), got 5"),
        (["--n-best", "5", "--beam-size", "3"], "--n-best must be <= --beam-size=3, got 5"),
        (["--max-new-tokens", "-2"], "--max-new-tokens must be >= 1, got -2"),
    ],
)
def test_translate_bad_arguments(translator, argv, message):
    with pytest.raises(SystemExit, match=message):
        main(["translate", "--checkpoint", translator, *argv, "x"])


def test_translate_with_an_ensemble(capsys, tmp_path_factory, tokenizer, translator):
    """Two --checkpoint flags: the output follows the averaged model, whose scores differ from either member's."""
    other = saved(tmp_path_factory, tokenizer, "tiny-encoder-decoder", positions="rotary")
    scores = {}
    for name, paths in (("a", [translator]), ("b", [other]), ("ab", [translator, other])):
        flags = [f for path in paths for f in ("--checkpoint", path)]
        code, out, _ = run(capsys, "translate", *flags, "--max-new-tokens", "4", "--n-best", "2", TEXTS[0])
        assert code == 0 and len(out.splitlines()) == 2
        scores[name] = [float(line.split("\t")[1]) for line in out.splitlines()]
    assert scores["ab"] != scores["a"] and scores["ab"] != scores["b"]


def test_ensemble_members_must_share_a_tokenizer(capsys, tmp_path_factory, translator):
    other = saved(tmp_path_factory, CharTokenizer.train(["xyz qrs"]), "tiny-encoder-decoder")
    code, _, err = run(capsys, "translate", "--checkpoint", translator, "--checkpoint", other, "x")
    assert code == 2 and f"--checkpoint {other} has a different src tokenizer from {translator}" in err


def test_wrong_family_and_missing_checkpoint(lm, tmp_path):
    with pytest.raises(SystemExit, match=f"--checkpoint {lm} holds a decoder-only model; translate needs an encoder-decoder"):
        main(["translate", "--checkpoint", lm, "x"])
    missing = str(tmp_path / "nope")
    with pytest.raises(SystemExit, match=f"--checkpoint {missing}: no model at"):
        main(["generate", "--checkpoint", missing, "--prompt", "a", "--max-new-tokens", "2"])


def test_generate_streams_the_continuation(capsys, lm):
    code, out, _ = run(capsys, "generate", "--checkpoint", lm, "--prompt", "the ", "--max-new-tokens", "12", "--seed", "1")
    assert code == 0 and out.startswith("the ") and out.endswith("\n")
    assert len(out) > len("the \n")
    code, again, _ = run(capsys, "generate", "--checkpoint", lm, "--prompt", "the ", "--max-new-tokens", "12", "--seed", "1")
    assert again == out  # the seed makes it reproducible


def test_generate_stop_string(capsys, lm):
    _, free, _ = run(capsys, "generate", "--checkpoint", lm, "--prompt", "a", "--max-new-tokens", "20", "--greedy")
    stop = free[2:4]  # two characters of the greedy continuation
    _, out, _ = run(capsys, "generate", "--checkpoint", lm, "--prompt", "a", "--max-new-tokens", "20", "--greedy", "--stop", stop)
    assert out.rstrip("\n").endswith(stop) and len(out) <= len(free)


@pytest.mark.parametrize(
    "argv, message",
    [
        # GenerationConfig's checks (shared with Python and the server), named as flags
        (["--temperature", "0"], r"--temperature=0.0 must be a finite number in \(0, 100\] \(for temperature 0 use greedy"),
        (["--temperature", "101"], r"--temperature=101.0 must be a finite number in \(0, 100\]"),
        (["--top-p", "1.5"], r"--top-p=1.5 must be a finite number in \(0, 1\]"),
        (["--top-k", "0"], "--top-k=0 must be an integer >= 1"),
        (["--max-new-tokens", "0"], "--max-new-tokens=0 must be an integer >= 1"),
        (["--min-new-tokens", "9"], "--min-new-tokens=9 must be <= max_new_tokens=3"),
    ],
)
def test_generate_bad_arguments(lm, argv, message):
    base = ["generate", "--checkpoint", lm, "--prompt", "a", "--max-new-tokens", "3"]
    with pytest.raises(SystemExit, match=message):
        main(base + argv)


def test_fill_mask(capsys, bert):
    code, out, _ = run(capsys, "fill-mask", "--checkpoint", bert, "--top-k", "3", "the <mask>at <mask>")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 3
    assert lines[0].startswith("<mask> 1: ") and lines[0].count(", ") == 2
    assert lines[2].startswith("filled: the ")


def test_fill_mask_needs_a_mask(bert):
    with pytest.raises(SystemExit, match="TEXT must contain <mask>, got 'no mask here'"):
        main(["fill-mask", "--checkpoint", bert, "no mask here"])
    with pytest.raises(SystemExit, match="--top-k must be >= 1, got 0"):
        main(["fill-mask", "--checkpoint", bert, "--top-k", "0", "<mask>"])


def test_classify(capsys, bert):
    code, out, _ = run(capsys, "classify", "--checkpoint", bert, *TEXTS)
    rows = [line.split("\t") for line in out.splitlines()]
    assert code == 0 and [r[2] for r in rows] == TEXTS
    assert all(r[0] in ("0", "1", "2") and 1 / 3 <= float(r[1]) <= 1 for r in rows)


def test_classify_needs_an_encoder_only_model(translator):
    with pytest.raises(SystemExit, match="holds a encoder-decoder model; classify needs an encoder-only model"):
        main(["classify", "--checkpoint", translator, "x"])
