"""The HTML explorer: one self-contained file with the weights as JSON (the browser test drives it)."""

import json
import re

import numpy as np
import pytest

from aiayn.cli.main import main
from aiayn.viz.attention import AttentionView
from aiayn.viz.explorer import explorer_html, write_explorer


def _data(html: str) -> dict:
    match = re.search(r'<script id="attention-data" type="application/json">(.*?)</script>', html, re.S)
    assert match, "no data block"
    return json.loads(match.group(1))


def test_self_contained_and_json_round_trips(tmp_path):
    weights = np.random.default_rng(0).dirichlet(np.ones(3), size=(2, 2, 4)).astype(np.float32)  # (L, H, T, S)
    view = AttentionView("decoder_cross", weights, ["<bos>", "a", "</script>", "世"], ["x", "ü", "<eos>"])
    html = write_explorer([view], tmp_path / "e.html", title="t", subtitle="s").read_text(encoding="utf-8")
    assert "http://" not in html and "https://" not in html  # no CDN, no network
    assert "<link" not in html and "src=" not in html  # nothing loaded from elsewhere
    data = _data(html)
    assert data["views"][0]["queries"][2] == "</script>"  # escaped as \u003c/ inside the block, intact after parsing
    assert data["views"][0]["title"] == "encoder-decoder (cross) attention"
    assert (data["views"][0]["layers"], data["views"][0]["heads"]) == (2, 2)
    np.testing.assert_allclose(np.array(data["views"][0]["weights"]), weights, atol=1e-4)


def test_no_views_is_an_error():
    with pytest.raises(ValueError, match="views must not be empty"):
        explorer_html([], title="t")


def test_cli_html(tmp_path, capsys):
    argv = ["viz", "attention", "--preset", "tiny-encoder-decoder", "--text", "Grüße 世界", "--target", "hi", "--html", "--out", str(tmp_path)]
    assert main(argv) == 0
    data = _data((tmp_path / "attention.html").read_text(encoding="utf-8"))
    assert [v["name"] for v in data["views"]] == ["encoder", "decoder_self", "decoder_cross"]
    assert data["views"][2]["queries"] == ["<bos>", "h", "i"]
    assert not list(tmp_path.glob("*.png"))


HOSTILE = ["<!--<script>", "</script><script>alert(1)</script>", "&amp; &lt;", "-->", "<!--", "]]>", "\u2028\u2029", "<bos>"]


@pytest.mark.reliability
def test_hostile_strings_leave_no_markup_in_the_data_block(tmp_path):
    weights = np.full((1, 1, len(HOSTILE), len(HOSTILE)), 1 / len(HOSTILE), dtype=np.float32)
    view = AttentionView("encoder", weights, HOSTILE, HOSTILE[::-1])
    html = explorer_html([view], title="<!--<script>", subtitle="</script><!--<script>&")
    block = re.search(r'<script id="attention-data" type="application/json">(.*?)</script>', html, re.S).group(1)
    assert not set("<>&") & set(block)  # before the fix, "<!--<script>" put the parser into its double-escaped state
    data = json.loads(block)
    assert data["views"][0]["queries"] == HOSTILE and data["views"][0]["keys"] == HOSTILE[::-1]
    assert (data["title"], data["subtitle"]) == ("<!--<script>", "</script><!--<script>&")
