"""aiayn evaluate and the demo: metrics from the tools made for them, on tiny checkpoints; the demo's fallback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sacrebleu

from aiayn.cli.main import main
from aiayn.data import DataError
from aiayn.evaluation import evaluate_translation
from aiayn.training.loop import train
from loop_fixtures import lm_config

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


def test_bleu_is_sacrebleu_on_detokenized_text():
    hyps, refs = ["a cat sat on the mat .", "hello world"], ["a cat sat on the mat.", "hello there world"]
    result = evaluate_translation(hyps, refs)
    assert result["bleu"] == round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)
    assert result["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert evaluate_translation(refs, refs)["bleu"] == 100.0
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        evaluate_translation(hyps, refs[:1])


@pytest.mark.skipif(not (SHARED_DATA / "tinyshakespeare").is_dir(), reason="needs ../shared/data/tinyshakespeare")
def test_evaluate_lm_checkpoint_on_real_split(tmp_path, monkeypatch, capsys):
    config = lm_config(tmp_path, steps=2)
    result = train(config)
    out = tmp_path / "eval.json"
    code = main(["evaluate", "--checkpoint", str(result.run_dir), "--split", "val", "--dataset", "tinyshakespeare",
                 "--data-dir", str(SHARED_DATA), "--limit", "2000", "--out", str(out)])
    assert code == 0
    metrics = json.loads(out.read_text())
    assert metrics["dataset"] == "tinyshakespeare" and metrics["limit"] == 2000
    assert metrics["perplexity"] == pytest.approx(2.718281828 ** metrics["loss"], rel=1e-2)


def test_evaluate_rejects_a_split_that_is_not_held_out(tmp_path, capsys):
    result = train(lm_config(tmp_path, steps=1))
    code = main(["evaluate", "--checkpoint", str(result.run_dir), "--split", "train", "--dataset", "tinyshakespeare"])
    assert code == 2
    assert "--split 'train' is not a held-out split of tinyshakespeare" in capsys.readouterr().err


def test_demo_without_data_says_how_to_get_it_and_falls_back(monkeypatch, tmp_path):
    import aiayn.demo as demo

    def missing(*args, **kwargs):
        raise DataError("multi30k: put train.de and train.en in /somewhere/multi30k/ or set AIAYN_DATA_DIR")

    monkeypatch.setattr(demo, "resolve_files", missing)
    said: list[str] = []
    code = demo.run_demo(run_dir=tmp_path / "demo", fallback=lambda: 7, say=said.append)
    assert code == 7
    assert "Multi30k is not available here" in said[0] and "AIAYN_DATA_DIR" in said[0]
    assert "copy task" in said[1]
