"""aiayn average-checkpoints: the last N checkpoints of a run -> a model directory load_pretrained reads."""

from pathlib import Path

import pytest
import torch

from aiayn import build_model
from aiayn.checkpoint.state import save_checkpoint
from aiayn.cli.main import main
from aiayn.pretrained import load_pretrained
from aiayn.tokenization.char import CharTokenizer


def _run_with_checkpoints(tmp_path: Path, n: int) -> tuple[Path, list[dict[str, torch.Tensor]], CharTokenizer]:
    """A run directory with ``n`` checkpoints of a tiny decoder-only model, each carrying the tokenizer."""
    tokenizer = CharTokenizer.train(["the quick brown fox"])
    tok_file = tokenizer.save(tmp_path / "tokenizer" / "char_tokenizer.json")
    run = tmp_path / "run"
    states = []
    for i in range(n):
        torch.manual_seed(i)
        model = build_model("tiny-decoder-only")
        save_checkpoint(run, step=10 * (i + 1), model=model, config=model.config, extra_files=[tok_file], save_rng=False)
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    return run, states, tokenizer


def test_average_checkpoints_loads_with_load_pretrained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run, states, tokenizer = _run_with_checkpoints(tmp_path, 4)
    out = tmp_path / "averaged"
    assert main(["average-checkpoints", str(run), "--last", "3", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "averaged 3 checkpoints" in printed and "step-000020 .. step-000040" in printed
    assert "char_tokenizer.json" in printed

    loaded = load_pretrained(out)
    assert loaded.src_tokenizer is not None and loaded.src_tokenizer.chars == tokenizer.chars
    got = loaded.model.state_dict()
    assert list(got) == list(states[-1])
    for name, last in states[-1].items():
        expected = (torch.stack([s[name].double() for s in states[1:]]).mean(0)).to(last.dtype)  # float64 mean, cast
        assert torch.equal(got[name], expected), name
    assert loaded.model.output.weight is loaded.model.embed.weight  # still tied after loading


def test_average_checkpoints_errors_name_the_path_and_the_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run, _, _ = _run_with_checkpoints(tmp_path, 2)
    assert main(["average-checkpoints", str(run), "--last", "5", "--out", str(tmp_path / "avg")]) == 2
    err = capsys.readouterr().err
    assert f"needs 5 complete checkpoints in {run}, found 2" in err and "(--last 2)" in err
    assert not (tmp_path / "avg").exists()
    assert main(["average-checkpoints", str(tmp_path / "nope"), "--out", str(tmp_path / "avg")]) == 2
    assert f"run directory does not exist: {tmp_path / 'nope'}" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--last must be >= 1, got 0"):
        main(["average-checkpoints", str(run), "--last", "0", "--out", str(tmp_path / "avg")])
