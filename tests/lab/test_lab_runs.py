"""aiayn lab NAME --quick: every experiment runs, gives a verdict with its numbers, and saves a plot."""

import json

import pytest

from aiayn.cli.main import main
from aiayn.lab import LABS, run_lab

VERDICTS = {"confirmed", "partly confirmed", "not confirmed"}


def _assert_png(path):
    import matplotlib.image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] >= 200 and image.shape[1] >= 400


@pytest.mark.parametrize("name", list(LABS))
def test_quick_lab(name, tmp_path):
    result = run_lab(name, quick=True, out_dir=tmp_path, seed=0)
    assert result.name == name and result.verdict in VERDICTS
    assert result.claim and result.summary and result.numbers
    _assert_png(result.plot)
    assert result.plot == tmp_path / f"lab_{name}.png"
    text = result.format()
    assert text.startswith(f"lab {name} (QUICK RUN, NOT CONCLUSIVE") and "measured:" in text
    assert result.verdict.upper() not in text.splitlines()[0]  # no "CONFIRMED" headline for a quick run
    json.dumps(result.to_dict())  # serialisable


def test_unknown_lab():
    with pytest.raises(ValueError, match="unknown lab 'nope'; valid labs: scaling, prenorm"):
        run_lab("nope")


def test_cli_writes_json(tmp_path, capsys):
    assert main(["lab", "scaling", "--quick", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "lab_scaling.json").read_text())
    assert data["verdict"] in VERDICTS and data["name"] == "scaling" and data["quick"] is True
    assert "lab scaling (QUICK RUN, NOT CONCLUSIVE" in capsys.readouterr().out


def test_a_full_run_states_its_verdict_plainly():
    from aiayn.lab.common import LabResult

    result = LabResult("x", "claim", "partly confirmed", "numbers", {"a": 1})
    assert result.format().startswith("lab x: PARTLY CONFIRMED")


SHARED_DATA = __import__("pathlib").Path(__file__).resolve().parents[3] / "shared" / "data"


def test_efficient_lab_reads_the_data_dir_it_is_given(tmp_path, monkeypatch):
    """--data-dir is where the lab looks first; an empty one (and no other source) falls back to the quick toy text."""
    monkeypatch.delenv("AIAYN_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty-cache"))
    empty = run_lab("efficient", quick=True, out_dir=tmp_path / "a", data_dir=tmp_path / "no-data")
    assert "toy text" in empty.format()
    if not (SHARED_DATA / "tinyshakespeare").is_dir():
        pytest.skip(f"real data absent ({SHARED_DATA}): only the fallback was checked")
    assert main(["lab", "efficient", "--quick", "--out", str(tmp_path / "b"), "--data-dir", str(SHARED_DATA)]) == 0
    saved = json.loads((tmp_path / "b" / "lab_efficient.json").read_text())
    assert "tinyshakespeare" in json.dumps(saved) and "toy text" not in json.dumps(saved)
