"""aiayn evaluate and the demo: metrics from the tools made for them, on tiny checkpoints; the demo's fallback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sacrebleu
from loop_fixtures import lm_config

from aiayn.cli.main import main
from aiayn.data import DataError
from aiayn.evaluation import evaluate_translation
from aiayn.training.loop import train

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


def _two_language_models(tmp_path):
    """Two tiny LMs on the same text and tokenizer, from different seeds."""
    a = train(lm_config(tmp_path / "a", steps=4, seed=0))
    b = train(lm_config(tmp_path / "b", steps=4, seed=1))
    return a, b


def test_an_ensemble_scores_at_least_as_well_as_its_members_on_average(tmp_path):
    """-log(mean p) <= mean(-log p) (Jensen): the ensemble's loss is at most its members' mean loss,
    and an ensemble of one model twice is that model."""
    from aiayn.evaluation import evaluate_lm
    from aiayn.pretrained import load_pretrained

    a, b = (load_pretrained(r.run_dir) for r in _two_language_models(tmp_path))
    text = (tmp_path / "a" / "data" / "text.txt").read_text()[:3000]
    loss = {name: evaluate_lm(models, a.src_tokenizer, text, block_size=16)["loss"]
            for name, models in (("a", a.model), ("b", b.model), ("ab", [a.model, b.model]), ("aa", [a.model, a.model]))}
    assert loss["a"] != loss["b"]
    assert loss["ab"] <= (loss["a"] + loss["b"]) / 2 + 1e-4
    assert loss["aa"] == pytest.approx(loss["a"], abs=1e-4)


@pytest.mark.skipif(not (SHARED_DATA / "tinyshakespeare").is_dir(), reason="needs ../shared/data/tinyshakespeare")
def test_evaluate_an_ensemble_from_the_command_line(tmp_path, capsys):
    a, b = _two_language_models(tmp_path)
    out = tmp_path / "eval.json"
    code = main(["evaluate", "--checkpoint", str(a.run_dir), "--checkpoint", str(b.run_dir), "--split", "val",
                 "--dataset", "tinyshakespeare", "--data-dir", str(SHARED_DATA), "--limit", "2000", "--out", str(out)])
    assert code == 0
    metrics = json.loads(out.read_text())
    assert [Path(p).parent for p in metrics["checkpoints"]] == [a.run_dir, b.run_dir] and "checkpoint" not in metrics


def test_ensemble_members_with_different_tokenizers_are_refused(tmp_path, capsys):
    a = train(lm_config(tmp_path / "a", steps=1))
    config = lm_config(tmp_path / "b", steps=1)
    Path(config.data.train_files[0]).write_text("xyz qrs " * 400)  # other characters: another vocabulary
    b = train(config)
    code = main(["evaluate", "--checkpoint", str(a.run_dir), "--checkpoint", str(b.run_dir), "--split", "val",
                 "--dataset", "tinyshakespeare"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"--checkpoint {b.run_dir}" in err and "different src tokenizer" in err


def test_ensemble_members_of_different_families_are_refused(tmp_path, capsys):
    from loop_fixtures import translation_config

    lm = train(lm_config(tmp_path / "lm", steps=1))
    mt = train(translation_config(tmp_path / "mt", steps=1))
    code = main(["evaluate", "--checkpoint", str(lm.run_dir), "--checkpoint", str(mt.run_dir), "--split", "val",
                 "--dataset", "tinyshakespeare"])
    assert code == 2
    assert f"--checkpoint {mt.run_dir}" in (err := capsys.readouterr().err) and "family encoder-decoder" in err


def test_evaluate_own_files_from_the_checkpoint_data_spec_into_the_run_dir(tmp_path, capsys):
    """A run on data.dataset=files evaluates on its own validation files without --dataset, writes
    its JSON into the run directory, and says so when it replaces an earlier result."""
    from loop_fixtures import translation_config

    config = translation_config(tmp_path, steps=2)
    config.run_dir = str(tmp_path)  # the data inside the run directory: a model directory's paths are confined to it
    run = train(config)
    args = ["evaluate", "--checkpoint", str(run.run_dir), "--split", "val", "--limit", "5", "--beam-size", "1"]
    assert main(args) == 0
    out = run.run_dir / "eval-step-000002-files-val-limit5.json"  # named after the checkpoint, the split and the limit
    metrics = json.loads(out.read_text())
    assert metrics["dataset"] == "files" and metrics["task"] == "translation" and metrics["sentences"] == 5
    assert "replacing" not in capsys.readouterr().out
    assert main(args) == 0
    assert f"wrote {out} (replacing the earlier results there)" in capsys.readouterr().out


def test_evaluate_uses_the_data_dir_recorded_in_the_checkpoint(tmp_path, monkeypatch):
    from aiayn.data import ENV_VAR

    shared = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "tinyshakespeare" / "input.txt"
    if not shared.is_file():  # a named data set is checked against its published sha256: a made-up file is refused
        pytest.skip(f"real data not found at {shared.resolve()} (expected ../shared/data beside the repo)")
    data_dir = tmp_path / "somewhere"
    (data_dir / "tinyshakespeare").mkdir(parents=True)
    (data_dir / "tinyshakespeare" / "input.txt").write_bytes(shared.read_bytes())
    config = lm_config(tmp_path, steps=1)
    config.data = type(config.data)(task="lm", dataset="tinyshakespeare", data_dir=str(data_dir), tokenizer="char",
                                    block_size=16, batch_size=4)
    config.run_dir = str(tmp_path)  # data_dir inside the run directory: a model directory's paths are confined to it
    run = train(config)
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty-cache"))
    out = tmp_path / "eval.json"
    assert main(["evaluate", "--checkpoint", str(run.run_dir), "--split", "val", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["tokens"] > 0


def write_labelled(path: Path, n: int = 60) -> Path:
    from loop_fixtures import WORDS

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{i % 2}\t{' '.join(WORDS[(i + k) % len(WORDS)] for k in range(5))}\n" for i in range(n)))
    return path


def mlm_config(tmp_path: Path, steps: int = 2):
    from aiayn.training.config import DataSection, LoopSection, ModelSection, TrainConfig
    from aiayn.training.optim import OptimConfig, ScheduleConfig

    tsv = write_labelled(tmp_path / "data" / "text.tsv")
    return TrainConfig(
        run_dir=str(tmp_path / "run"),
        model=ModelSection(preset="tiny-encoder-only", dropout=0.0, max_len=32),
        data=DataSection(task="mlm", dataset="files", train_files=[str(tsv)], val_files=[str(tsv)], tokenizer="char",
                         batch_size=8, max_len=32),
        optim=OptimConfig(name="adamw", lr=1e-3),
        schedule=ScheduleConfig(name="constant", warmup=0),
        train=LoopSection(max_steps=steps, eval_every=steps, save_every=steps, progress=False, tensorboard=False),
    )


def test_evaluate_an_mlm_checkpoint_reports_masked_token_metrics(tmp_path, capsys):
    """An MLM-only checkpoint has an untrained classifier head: evaluate reports MLM loss and accuracy,
    and classify refuses it."""
    config = mlm_config(tmp_path)
    config.run_dir = str(tmp_path)  # the data inside the run directory: a model directory's paths are confined to it
    run = train(config)
    out = tmp_path / "eval.json"
    assert main(["evaluate", "--checkpoint", str(run.run_dir), "--split", "val", "--out", str(out)]) == 0
    metrics = json.loads(out.read_text())
    assert metrics["task"] == "mlm" and "accuracy" not in metrics
    assert 0.0 <= metrics["mlm_accuracy"] <= 1.0 and metrics["mlm_loss"] > 0 and metrics["predicted_tokens"] > 0
    with pytest.raises(SystemExit, match="classifier head was never trained"):
        main(["classify", "--checkpoint", str(run.run_dir), "a cat"])


@pytest.mark.parametrize(("dataset", "direction"), [("wmt14-en-de", "en-de"), ("multi30k", "de-en")])
def test_without_a_training_config_the_direction_is_the_corpus_own(dataset, direction):
    """A checkpoint without train_config.yaml evaluated with --dataset wmt14-en-de reads English -> German (the
    paper's newstest2014 direction), not multi30k's default de-en; --direction still wins."""
    import argparse

    from aiayn.cli.evaluate import _data_section
    loaded = argparse.Namespace(config=argparse.Namespace(max_len=16))  # all _data_section reads of the model
    args = argparse.Namespace(files=None, dataset=dataset, direction=None, data_dir=None, checkpoint=["x"])
    assert _data_section(args, loaded, None).direction == direction
    args.direction = "de-en" if direction == "en-de" else "en-de"
    assert _data_section(args, loaded, None).direction == args.direction
