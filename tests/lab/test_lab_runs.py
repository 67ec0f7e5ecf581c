"""aiayn lab NAME --quick: every experiment runs, gives a verdict with its numbers, and saves a plot."""

import json

import pytest

from aiayn.cli.main import main
from aiayn.lab import LABS, run_lab
from aiayn.lab.common import VERDICTS, verdict_of
from aiayn.lab.positions import extrapolation_verdict
from aiayn.lab.prenorm import warmup_verdict


def _assert_png(path):
    import matplotlib.image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] >= 200 and image.shape[1] >= 400


@pytest.mark.parametrize("name", list(LABS))
def test_quick_lab(name, tmp_path):
    result = run_lab(name, quick=True, out_dir=tmp_path, seed=0)
    assert result.name == name and result.verdict in VERDICTS
    if "checks" in result.numbers:  # the verdict follows from the checks it reports
        assert result.verdict == verdict_of(result.numbers["checks"].values())
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


def test_a_verdict_counts_the_checks_that_hold():
    assert [verdict_of(c) for c in ([True, True], [True, False], [False, True], [False, False])] == [
        "confirmed", "partly confirmed", "partly confirmed", "not confirmed"]


@pytest.mark.parametrize(("sinusoidal", "learned", "verdict"), [
    (0.90, 0.49, "confirmed"),
    (0.89, 0.49, "partly confirmed"),  # sinusoids under 90%, still 40 points ahead
    (0.90, 0.50, "partly confirmed"),  # learned positions reach 50%
    (0.61, 0.49, "partly confirmed"),
    (0.58, 0.49, "not confirmed"),  # under 10 points ahead
])
def test_the_positions_verdict_on_both_sides_of_its_thresholds(sinusoidal, learned, verdict):
    assert extrapolation_verdict(sinusoidal, learned) == verdict


@pytest.mark.parametrize(("pre", "post", "verdict"), [
    (0.90, 0.89, "confirmed"),  # TRAINS = 0.9
    (0.89, 0.50, "partly confirmed"),  # neither trains, Pre-LN far ahead
    (0.90, 0.90, "not confirmed"),  # both train
    (0.85, 0.80, "not confirmed"),  # neither trains, Pre-LN under 10 points ahead
    (0.50, 0.95, "not confirmed"),
])
def test_the_prenorm_verdict_on_both_sides_of_its_thresholds(pre, post, verdict):
    assert warmup_verdict(pre, post) == verdict


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
