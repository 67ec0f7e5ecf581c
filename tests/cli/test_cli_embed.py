"""``aiayn embed``: lines of a file or stdin -> a ``.npy`` matrix or JSON lines, equal to ``aiayn.load(dir).embed``."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

import aiayn
from aiayn import build_model
from aiayn.cli.main import main
from aiayn.pretrained import save_pretrained
from aiayn.tokenization import CharTokenizer

LINES = ["a cat sat on the mat", "", "the dog ran", "hello world."]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("embed_cli")
    tokenizer = CharTokenizer.train(LINES)
    torch.manual_seed(0)
    bert = save_pretrained(root / "bert", build_model("tiny-encoder-only", vocab_size=tokenizer.vocab_size).eval(), tokenizer)
    lm = save_pretrained(root / "lm", build_model("tiny-decoder-only", vocab_size=tokenizer.vocab_size).eval(), tokenizer)
    return {"bert": str(bert), "lm": str(lm)}


def test_a_file_becomes_an_npy_matrix_row_per_line(checkpoints, tmp_path):
    (tmp_path / "in.txt").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    out = tmp_path / "out.npy"
    assert main(["embed", "--checkpoint", checkpoints["bert"], "--input", str(tmp_path / "in.txt"), "--output", str(out), "--batch-size", "2"]) == 0
    matrix = np.load(out)
    assert matrix.shape == (4, 32) and matrix.dtype == np.float32
    assert np.abs(matrix - aiayn.load(checkpoints["bert"]).embed(LINES).numpy()).max() <= 1e-6


def test_stdin_becomes_json_lines_with_the_chosen_pooling(checkpoints, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("a cat sat\nthe dog ran\n"))
    assert main(["embed", "--checkpoint", checkpoints["bert"], "--pooling", "cls", "--no-normalize"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["index"], r["text"]) for r in rows] == [(0, "a cat sat"), (1, "the dog ran")]
    expected = aiayn.load(checkpoints["bert"]).embed(["a cat sat", "the dog ran"], pooling="cls", normalize=False)
    assert torch.tensor([r["embedding"] for r in rows]) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("argv, message", [
    (["--output", "x.csv", "a"], "--output x.csv: the name must end in one of"),
    (["--output", "no/such/dir/x.npy", "a"], "the directory no/such/dir does not exist"),
    (["--input", "in.txt", "a"], "give TEXT arguments or --input FILE, not both"),
    (["--input", "missing.txt"], "--input missing.txt: "),
    (["--batch-size", "0", "a"], "--batch-size must be >= 1, got 0"),
])
def test_bad_flags_are_named_before_any_work(checkpoints, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.txt").write_text("a\n")
    with pytest.raises(SystemExit, match=message):
        main(["embed", "--checkpoint", checkpoints["bert"], *argv])


def test_a_decoder_only_checkpoint_is_refused(checkpoints):
    with pytest.raises(SystemExit, match="holds a decoder-only model; embed needs an encoder-only model"):
        main(["embed", "--checkpoint", checkpoints["lm"], "a cat"])
