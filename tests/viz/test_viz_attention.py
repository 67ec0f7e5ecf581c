"""aiayn viz attention: weights from the math backend, PNG grids with tokens on the axes."""

import pytest
import torch
from viz_helpers import assert_png

from aiayn import build_model
from aiayn.cli.main import main
from aiayn.pretrained import save_pretrained
from aiayn.tokenization import CharTokenizer
from aiayn.viz.attention import collect_attention, plot_attention_grid

TEXT = "Grüße, 世界"


@pytest.mark.parametrize(
    "preset, names",
    [
        ("tiny-encoder-decoder", ["encoder", "decoder_self", "decoder_cross"]),
        ("tiny-decoder-only", ["decoder_self"]),
        ("tiny-encoder-only", ["encoder"]),
    ],
)
def test_views_of_each_family(preset, names):
    tok = CharTokenizer.train([TEXT, "hallo"])
    torch.manual_seed(0)
    model = build_model(preset, vocab_size=tok.vocab_size)
    views, target = collect_attention(model, tok, TEXT, target="hallo" if "decoder_cross" in names else None)
    assert [v.name for v in views] == names
    for view in views:
        layers, heads, q_len, k_len = view.weights.shape
        assert (layers, heads) == (2, 4)
        assert (q_len, k_len) == (len(view.queries), len(view.keys))
        assert abs(view.weights.sum(-1) - 1).max() < 1e-5  # every row is a distribution
    if preset == "tiny-encoder-decoder":
        assert views[0].keys == list("Grüße,␣世界") + ["<eos>"]
        assert views[1].queries == ["<bos>", *"hallo"]
        assert views[2].weights.shape[2:] == (6, 10)
        assert torch.all(torch.from_numpy(views[1].weights).triu(1) == 0)  # causal
        assert target == "hallo"
    if preset == "tiny-encoder-only":
        assert views[0].queries[0] == "<cls>" and views[0].queries[-1] == "<sep>"


def test_grid_png(tmp_path):
    tok = CharTokenizer.train([TEXT])
    model = build_model("tiny-encoder-only", vocab_size=tok.vocab_size)
    views, _ = collect_attention(model, tok, TEXT)
    image = assert_png(plot_attention_grid(views[0], tmp_path / "grid.png"), min_width=600, min_height=300)
    assert image.shape[1] > image.shape[0]  # 4 heads across, 2 layers down


def test_cli_preset_writes_three_pngs(tmp_path, capsys):
    assert main(["viz", "attention", "--preset", "tiny-encoder-decoder", "--text", TEXT, "--out", str(tmp_path)]) == 0
    for name in ("encoder", "decoder_self", "decoder_cross"):
        assert_png(tmp_path / f"attention_{name}.png", min_width=600, min_height=300)
    assert "the text itself" in capsys.readouterr().out


def test_cli_checkpoint_with_greedy_target(tmp_path, capsys):
    tok = CharTokenizer.train(["hallo welt", "hello world"])
    save_pretrained(tmp_path / "m", build_model("tiny-encoder-decoder", vocab_size=tok.vocab_size), tok)
    argv = ["viz", "attention", "--checkpoint", str(tmp_path / "m"), "--text", "hello", "--max-target-len", "6",
            "--out", str(tmp_path / "o")]
    assert main(argv) == 0
    assert "greedy output" in capsys.readouterr().out
    assert_png(tmp_path / "o" / "attention_decoder_cross.png", min_width=300, min_height=100)


def test_cli_errors(tmp_path):
    with pytest.raises(SystemExit, match="--target needs an encoder-decoder"):
        main(["viz", "attention", "--preset", "tiny-decoder-only", "--text", "ab", "--target", "c", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="unknown preset 'nope'"):
        main(["viz", "attention", "--preset", "nope", "--text", "ab", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="no model at"):
        main(["viz", "attention", "--checkpoint", str(tmp_path / "missing"), "--text", "ab", "--out", str(tmp_path)])
