"""Your own data, first try: the three worked examples of docs/own-data.md, run as written (with fewer
steps) on small files this module makes, plus the frictions of issue 29 end to end.

``python tests/test_own_data.py DIR`` writes the example files into DIR, to run the page's commands.
"""

from __future__ import annotations

import json
import random
import re
import shlex
import sys
from pathlib import Path

from aiayn.cli.main import main

DOC = Path(__file__).resolve().parents[1] / "docs" / "own-data.md"
SHORT = ["--set", "train.max_steps=2", "--set", "train.eval_every=2", "--set", "train.save_every=2",
         "--set", "train.log_every=1", "--set", "train.tensorboard=false"]

_DE_EN = {"der": "the", "ein": "a", "hund": "dog", "katze": "cat", "mann": "man", "frau": "woman", "kind": "child",
          "sieht": "sees", "hört": "hears", "sucht": "seeks", "große": "big", "kleine": "small", "rote": "red"}
_WORDS = {"neg": "dull awful boring tedious".split(), "neutral": "average plain ordinary okay".split(),
          "pos": "great superb lovely moving".split()}


def write_example_files(directory: Path, *, pairs: int = 1000, reviews: int = 600, text_words: int = 6000) -> None:
    """The files of docs/own-data.md: pairs.tsv / test.tsv (toy German-English), reviews.csv / test.csv
    (three classes, with a header), notes.txt / notes-test.txt (plain text)."""
    rng = random.Random(0)
    directory.mkdir(parents=True, exist_ok=True)
    nouns, verbs, adjectives = ["hund", "katze", "mann", "frau", "kind"], ["sieht", "hört", "sucht"], ["große", "kleine", "rote"]

    def sentence() -> tuple[str, str]:
        de = [rng.choice(["der", "ein"]), *([rng.choice(adjectives)] if rng.random() < 0.5 else []), rng.choice(nouns),
              rng.choice(verbs), rng.choice(["der", "ein"]), rng.choice(nouns)]
        return " ".join(de), " ".join(_DE_EN[w] for w in de)

    for name, n in (("pairs.tsv", pairs), ("test.tsv", max(pairs // 10, 2))):
        (directory / name).write_text("".join("\t".join(sentence()) + "\n" for _ in range(n)), encoding="utf-8")
    filler = "the film has a story and some actors".split()
    for name, n in (("reviews.csv", reviews), ("test.csv", max(reviews // 10, 3))):
        rows = ["text,label"]
        for i in range(n):
            label = ("neg", "neutral", "pos")[i % 3]
            words = rng.sample(filler, 3) + [rng.choice(_WORDS[label])]
            rows.append(f'"{" ".join(words)}, really",{label}')
        (directory / name).write_text("\n".join(rows) + "\n", encoding="utf-8")
    for name, n in (("notes.txt", text_words), ("notes-test.txt", max(text_words // 10, 60))):
        (directory / name).write_text(" ".join(sentence()[1] + "." for _ in range(n // 6)) + "\n", encoding="utf-8")


def _doc_blocks() -> tuple[dict[str, str], list[tuple[str, str]]]:
    """The page's YAML files (a block whose first line is ``# NAME.yaml``) and each ``aiayn`` command
    with the output block shown after it."""
    text = DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S)
    files = {b.splitlines()[0][2:].strip(): b for kind, b in blocks if kind == "yaml" and b.startswith("# ")}
    commands = []
    for k, (kind, body) in enumerate(blocks):
        if kind == "bash":
            shown = blocks[k + 1][1] if k + 1 < len(blocks) and blocks[k + 1][0] == "text" else ""
            commands += [(line, shown) for line in body.splitlines() if line.startswith("aiayn ")]
    return files, commands


def _run(argv: list[str], capsys, *, stdout_only: bool = False) -> str:
    assert main(argv) == 0, argv
    captured = capsys.readouterr()
    return captured.out if stdout_only else captured.out + captured.err


def test_the_three_worked_examples_run_as_written(tmp_path, monkeypatch, capsys, caplog):
    """Every command of docs/own-data.md runs on the page's files (training 2 steps instead of the
    page's), and prints the fields the page shows, with no other ones."""
    write_example_files(tmp_path, pairs=60, reviews=60, text_words=600)
    files, commands = _doc_blocks()
    assert {"translate.yaml", "classify.yaml", "lm.yaml"} <= set(files) and len(commands) >= 9
    for name, body in files.items():
        (tmp_path / name).write_text(body, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    caplog.set_level("INFO")
    for command, shown in commands:
        argv = shlex.split(command)[1:]
        out = _run(argv + (SHORT if argv[0] == "train" else []), capsys, stdout_only=True)
        if argv[0] == "evaluate":  # the summary's fields are the page's, in its order
            assert [line.split()[0] for line in out.splitlines() if line and not line.startswith("wrote")] == \
                   [line.split()[0] for line in shown.splitlines() if line and not line.startswith("wrote")]
        if argv[0] == "classify":
            assert out.split("\t")[0] in ("neg", "neutral", "pos")
    hints = [r.getMessage() for r in caplog.records if r.getMessage().startswith("data: ")]
    assert len(hints) == 3 and all(" training tokens; model: " in h and " parameters" in h for h in hints)


def _three_class_tsv(path: Path, n: int) -> Path:
    rows = [f"{('neg', 'neutral', 'pos')[i % 3]}\t{' '.join(_WORDS[('neg', 'neutral', 'pos')[i % 3]][:1 + i % 4])} film\n" for i in range(n)]
    path.write_text("".join(rows), encoding="utf-8")
    return path


def test_a_three_class_tsv_trains_evaluates_and_classifies_with_its_names(tmp_path, monkeypatch, capsys):
    """n_classes: auto; the names in labels.json, classify and evaluate; no val_ppl for a classifier."""
    monkeypatch.chdir(tmp_path)
    _three_class_tsv(tmp_path / "train.tsv", 60)
    _three_class_tsv(tmp_path / "test.tsv", 9)
    config = tmp_path / "c.yaml"
    config.write_text("run_dir: runs/c\nmodel: {preset: tiny-encoder-only, n_classes: auto, d_model: 16, d_ff: 32, n_heads: 2}\n"
                      "data: {task: classification, dataset: files, train_files: [train.tsv], tokenizer: char, max_len: 128}\n")
    _run(["train", str(config), *SHORT], capsys)
    assert json.loads((tmp_path / "runs/c/labels.json").read_text())["labels"] == ["neg", "neutral", "pos"]
    out = _run(["evaluate", "--checkpoint", "runs/c", "--files", "test.tsv"], capsys)
    assert re.search(r"^accuracy\s+[0-9.]+$", out, flags=re.M) and re.search(r"^examples\s+9$", out, flags=re.M)
    assert _run(["classify", "--checkpoint", "runs/c", "superb film"], capsys).split("\t")[0] in ("neg", "neutral", "pos")
    metrics = [json.loads(line) for line in (tmp_path / "runs/c/metrics.jsonl").read_text().splitlines()]
    assert any("val_accuracy" in m for m in metrics) and not any("val_ppl" in m for m in metrics)


def test_a_fixed_n_classes_too_small_or_one_fails_before_step_1(tmp_path, monkeypatch, capsys):
    write_example_files(tmp_path, pairs=10, reviews=30, text_words=60)
    monkeypatch.chdir(tmp_path)
    base = ["train", "sst2", "--set", "data.dataset=files", "--set", "data.train_files=[reviews.csv]", "--set", "run_dir=runs/s",
            "--set", "train.init_from=null", "--set", "data.tokenizer=char"]
    for n in (2, 1):  # the sst2 recipe with its old pinned value, and a one-class head
        assert main([*base, "--set", f"model.n_classes={n}"]) == 2
        assert (f"model.n_classes={n} is fewer than the 3 labels of the training data ['neg', 'neutral', 'pos']: "
                "set model.n_classes=auto") in capsys.readouterr().err
        assert not (tmp_path / "runs/s/metrics.jsonl").exists()
    assert main([*base, "--set", "model.n_classes=null"]) == 2
    assert "model.n_classes: expected a number of classes or auto" in capsys.readouterr().err


def test_sst2_minilm_fine_tunes_on_a_three_class_label_text_csv(tmp_path, monkeypatch, capsys):
    """The sst2-minilm recipe, started from a tiny encoder of our own instead of MiniLM (same path:
    the checkpoint's config and tokenizer, a new head with a class per label), on a `label,text` CSV
    with --set data.text_column=text."""
    write_example_files(tmp_path, pairs=10, reviews=30, text_words=60)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mlm.tsv").write_text("".join(f"x\t{w} film\n" for w in ("a", "the", "one", "some")), encoding="utf-8")
    _run(["train", "sst2-mlm", "--set", "run_dir=runs/mlm", "--set", "data.dataset=files", "--set", "data.train_files=[mlm.tsv]",
          "--set", "data.tokenizer=char", "--set", "model.n_layers=1", "--set", "model.d_model=16", "--set", "model.d_ff=32",
          *SHORT], capsys)
    rows = (tmp_path / "reviews.csv").read_text().splitlines()[1:]  # the same reviews as a `label,text` CSV
    (tmp_path / "label_text.csv").write_text("label,text\n" + "".join(f"{r.rsplit(',', 1)[1]},{r.rsplit(',', 1)[0]}\n" for r in rows))
    _run(["train", "sst2-minilm", "--init-from", "runs/mlm", "--set", "run_dir=runs/ft", "--set", "data.dataset=files",
          "--set", "data.train_files=[label_text.csv]", "--set", "data.text_column=text", "--set", "train.max_minutes=null",
          *SHORT], capsys)
    assert json.loads((tmp_path / "runs/ft/labels.json").read_text())["labels"] == ["neg", "neutral", "pos"]
    out = _run(["evaluate", "--checkpoint", "runs/ft", "--files", "test.csv"], capsys)
    assert re.search(r"^examples\s+3$", out, flags=re.M)


def test_a_minimal_translation_yaml_without_val_files_trains_on_a_pairs_tsv(tmp_path, monkeypatch, capsys):
    """No val_files: 10% of the pairs is held out; --split val and --split test (data.test_files) and
    --files (a file the config never named) each get their own result file."""
    run = tmp_path / "runs" / "t"
    write_example_files(run, pairs=40, reviews=10, text_words=60)  # inside the run: a model's config may only point inside it
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "t.yaml"
    config.write_text("model: {preset: tiny-encoder-decoder}\n"
                      f"data: {{task: translation, dataset: files, train_files: [{run}/pairs.tsv], test_files: [{run}/test.tsv], "
                      "tokenizer: char}\n")
    _run(["train", str(config), "--set", "run_dir=runs/t", "--set", "decode.length_penalty=1.5", *SHORT], capsys)
    first = _run(["evaluate", "--checkpoint", "runs/t", "--split", "val", "--beam-size", "1"], capsys)
    assert "direction" not in first and re.search(r"^sentences\s+4$", first, flags=re.M)  # 10% of 40 held out
    scored = json.loads((run / "eval-step-000002-files-val.json").read_text())
    assert (scored["beam_size"], scored["length_penalty"]) == (1, 1.5)  # the flag given, the recipe's decode for the other
    test = _run(["evaluate", "--checkpoint", "runs/t", "--split", "test", "--beam-size", "1"], capsys)
    assert re.search(r"^sentences\s+4$", test, flags=re.M)
    (tmp_path / "other.tsv").write_text("der hund sieht\tthe dog sees\nein kind\ta child\n", encoding="utf-8")
    other = _run(["evaluate", "--checkpoint", "runs/t", "--files", "other.tsv", "--beam-size", "1"], capsys)
    assert "direction" not in other and "replacing" not in other and re.search(r"^sentences\s+2$", other, flags=re.M)
    results = sorted(p.name for p in run.glob("eval-*.json"))
    assert results == ["eval-step-000002-files-test.json", "eval-step-000002-files-val.json", "eval-step-000002-other.tsv.json"]
    # the same name for another evaluation (an other.tsv elsewhere) gets -2; the same one again replaces its own
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere/other.tsv").write_text("ein hund\ta dog\n", encoding="utf-8")
    _run(["evaluate", "--checkpoint", "runs/t", "--files", "elsewhere/other.tsv", "--beam-size", "1"], capsys)
    assert json.loads((run / "eval-step-000002-other.tsv-2.json").read_text())["sentences"] == 1
    again = _run(["evaluate", "--checkpoint", "runs/t", "--files", "other.tsv", "--beam-size", "1"], capsys)
    assert "eval-step-000002-other.tsv.json (replacing the earlier results there)" in again


def test_progress_is_one_line_per_log_step_when_the_output_is_not_a_terminal(tmp_path, monkeypatch, capsys):
    write_example_files(tmp_path, pairs=10, reviews=10, text_words=600)
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "l.yaml"
    config.write_text("run_dir: runs/l\nmodel: {preset: tiny-decoder-only}\n"
                      "data: {task: lm, dataset: files, train_files: [notes.txt], tokenizer: char, block_size: 16}\n")
    out = _run(["train", str(config), "--set", "train.max_steps=4", "--set", "train.log_every=2", "--set", "train.eval_every=4",
                "--set", "train.tensorboard=false"], capsys)
    lines = [line for line in out.splitlines() if line.startswith("step ") and "%)" in line]
    assert [line.split()[1] for line in lines] == ["2/4", "4/4"] and all(" loss " in line for line in lines)
    assert "\r" not in out and "it/s" not in out and "step/s" not in out


def test_the_size_hint_says_when_model_and_corpus_are_far_apart():
    from aiayn.training.tasks import TaskData, size_hint

    data = TaskData("translation", None, [], None, None, train_tokens=60_000)  # type: ignore[arg-type]
    assert size_hint(data, 10_000_000) == ("data: 60,000 training tokens; model: 10,000,000 parameters (0.006 tokens per parameter); "
                                           "hint: the model is far larger than the data and will memorise it: try a smaller one "
                                           "(fewer model.n_layers, a smaller model.d_model and model.d_ff) or more data")
    assert "hint" not in size_hint(data, 50_000)
    assert "a larger one" in size_hint(data, 50)
    assert "fine-tuning a pretrained model" in size_hint(data, 10_000_000, pretrained=True)


def test_progress_to_a_file_is_a_line_per_log_step_over_steps_or_the_time_budget():
    import io

    from aiayn.training.config import LoopSection
    from aiayn.training.progress import LineProgress, progress_bar

    stream = io.StringIO()
    bar = progress_bar(LoopSection(max_steps=20), 0, enabled=True, stream=stream)
    assert isinstance(bar, LineProgress)
    for _ in range(10):
        bar.update(1)
    bar.set_postfix(loss="1.2345", lr="1.00e-03")
    budget = progress_bar(LoopSection(max_steps=2000, max_minutes=9.0), 5, enabled=True, stream=stream)
    budget.update(1)
    budget.set_postfix(loss="0.5")
    first, second = stream.getvalue().splitlines()
    assert re.fullmatch(r"step 10/20 \(50%\) loss 1.2345 lr 1.00e-03 \(0:\d\d spent, ~0:\d\d left\)", first)
    assert re.fullmatch(r"step 6 loss 0.5 \(0:\d\d spent of the 9:00 budget\)", second)


if __name__ == "__main__":
    write_example_files(Path(sys.argv[1]))
