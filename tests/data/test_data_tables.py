"""Tables as users have them: CSV/TSV with or without a header, JSON lines, one file of pairs; and
errors that name the setting first, then the path and the line."""

from __future__ import annotations

import os

import pytest

from aiayn.config_io import apply_overrides
from aiayn.data import DataError, read_classification, read_pairs
from aiayn.training.config import DataSection, TrainConfig
from aiayn.training.files import own_splits, read_task_files


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_a_label_text_csv_header_is_read_with_text_column_set_from_the_cli(tmp_path):
    f = _write(tmp_path / "reviews.csv", 'label,text\npos,"great, really"\nneg,dull\n')
    data = apply_overrides(TrainConfig(), ["data.task=classification", "data.dataset=files", f"data.train_files=[{f}]",
                                           "data.text_column=text", "data.label_column=label"]).data
    read = read_task_files(data, data.train_files, "data.train_files")
    assert (read.texts, read.labels, read.label_names) == (["great, really", "dull"], [1, 0], ["neg", "pos"])
    # the defaults find the same columns: `text` (or `sentence`) and `label`, in any order
    swapped = read_classification(_write(tmp_path / "swapped.csv", "text,label\nfine,pos\nbad,neg\n"))
    assert (swapped.texts, swapped.labels) == (["fine", "bad"], [1, 0])
    glue = read_classification(_write(tmp_path / "glue.tsv", "sentence\tlabel\nfine\t1\nbad\t0\n"))  # GLUE's SST-2 header
    assert (glue.texts, glue.labels) == (["fine", "bad"], [1, 0])


def test_a_headerless_csv_is_read_as_data(tmp_path):
    f = _write(tmp_path / "plain.csv", 'pos,"a fine, warm film"\nneg,dull\n')
    read = read_classification(f)
    assert read.texts == ["a fine, warm film", "dull"] and read.label_names == ["neg", "pos"]
    # columns by number in a file without a header, and data.header=false for a first row that looks like one
    g = _write(tmp_path / "text_first.tsv", "label\tneg\ngood\tpos\n")
    data = DataSection(task="classification", dataset="files", train_files=[str(g)], text_column=0, label_column=1, header=False)
    read = read_task_files(data, data.train_files, "data.train_files")
    assert read.texts == ["label", "good"] and read.labels == [0, 1]


def test_a_header_with_other_column_names_says_which_to_set(tmp_path):
    f = _write(tmp_path / "x.csv", "id,review,sentiment\n1,ok,pos\n")
    with pytest.raises(DataError, match=r"data.text_column: .*x.csv: no column 'text' or 'sentence' in the header"):
        read_classification(f, label_column="sentiment")
    assert read_classification(f, label_column="sentiment", text_column="review").texts == ["ok"]
    # three columns and no header: say which ones
    g = _write(tmp_path / "y.tsv", "1\tok\tpos\n")
    with pytest.raises(DataError, match=r"3 columns in line 1 and no header line: say which to read with data.label_column=N"):
        read_classification(g)
    # a column name, but no header holds it
    with pytest.raises(DataError, match=r"data.text_column='review' names a column, but the first line of .*y.tsv.* set data.header=true"):
        read_classification(g, text_column="review")


def test_json_lines(tmp_path):
    f = _write(tmp_path / "train.jsonl", '{"text": "good", "label": 1}\n\n{"text": "bad", "label": 0}\n')
    read = read_classification(f)
    assert (read.texts, read.labels, read.label_names) == (["good", "bad"], [1, 0], ["0", "1"])
    bad = _write(tmp_path / "bad.jsonl", '{"text": "good", "label": 1}\n{"text": "bad"\n')
    with pytest.raises(DataError, match=r"bad.jsonl: line 2: not valid JSON"):
        read_classification(bad)
    other = _write(tmp_path / "other.jsonl", '{"review": "good", "stars": 5}\n')
    with pytest.raises(DataError, match=r"data.label_column: .*line 1: no key 'label' in the object \(its keys: \['review', 'stars'\]\)"):
        read_classification(other)
    assert read_classification(other, text_column="review", label_column="stars").label_names == ["5"]


def test_one_file_of_pairs_tsv_and_json_lines(tmp_path):
    tsv = _write(tmp_path / "pairs.tsv", "ein Hund\ta dog\nzwei Katzen\ttwo cats\n")
    pairs = read_pairs(tsv)
    assert (pairs.src, pairs.tgt) == (["ein Hund", "zwei Katzen"], ["a dog", "two cats"])
    jsonl = _write(tmp_path / "pairs.jsonl", '{"de": "ein Hund", "en": "a dog"}\n')
    data = DataSection(task="translation", dataset="files", train_files=[str(jsonl)], source_column="de", target_column="en")
    read = read_task_files(data, data.train_files, "data.train_files")
    assert (read.src, read.tgt) == (["ein Hund"], ["a dog"])


def test_a_pairs_file_with_an_empty_target_names_line_3(tmp_path):
    f = _write(tmp_path / "pairs.tsv", "a\tb\nc\td\ne\t \nf\tg\n")
    data = DataSection(task="translation", dataset="files", train_files=[str(f)])
    with pytest.raises(DataError, match=r"^data.train_files: .*pairs.tsv: line 3: the target is empty; every pair needs both sides"):
        own_splits(data)


def test_a_tsv_whose_line_57_has_three_columns_names_the_setting_then_the_line(tmp_path):
    f = _write(tmp_path / "train.tsv", "".join(f"{('neg', 'pos')[i % 2]}\ttext {i}\n" for i in range(56)) + "pos\tone\ttwo\n")
    data = DataSection(task="classification", dataset="files", train_files=[str(f)])
    with pytest.raises(DataError, match=rf"^data.train_files: {f}: line 57: 3 columns, expected 2 as in line 1; a tab inside a text "
                                        r"is not allowed in a TSV file: use CSV \(quoted fields\) or JSON lines$"):
        own_splits(data)


def test_a_label_column_with_one_class_only(tmp_path):
    f = _write(tmp_path / "one.tsv", "pos\tgood\npos\tfine\n")
    data = DataSection(task="classification", dataset="files", train_files=[str(f)], val_files=[str(f)])
    with pytest.raises(DataError, match=r"^data.train_files: .*one.tsv: the label column holds one class only \(\['pos'\]\): "
                                        r"a classifier needs at least 2; check that data.label_column"):
        own_splits(data)


def test_a_validation_label_missing_from_training_names_both_files(tmp_path):
    train = _write(tmp_path / "train.tsv", "neg\tbad\npos\tgood\n")
    val = _write(tmp_path / "val.tsv", "neg\tbad\nneutral\tso so\n")
    data = DataSection(task="classification", dataset="files", train_files=[str(train)], val_files=[str(val)])
    with pytest.raises(DataError, match=rf"^data.val_files: {val}: line 2: label 'neutral' does not occur in "
                                        rf"data.train_files \({train}\); known labels: \['neg', 'pos'\]"):
        own_splits(data)


@pytest.mark.parametrize("case", ["missing", "empty", "directory", "unreadable"])
def test_every_file_error_names_the_setting_first_then_the_path(tmp_path, case):
    path = tmp_path / "corpus.src"
    expected = {"missing": "no such file", "empty": "file is empty", "directory": "is a directory",
                "unreadable": "cannot be read"}[case]
    if case == "empty":
        path.write_bytes(b"")
    elif case == "directory":
        path.mkdir()
    elif case == "unreadable":
        path.write_text("x\n")
        path.chmod(0)
        if os.access(path, os.R_OK):  # root reads anything
            pytest.skip("running as root: a file without permissions is still readable")
    other = _write(tmp_path / "corpus.tgt", "y\n")
    data = DataSection(task="translation", dataset="files", train_files=[str(path), str(other)], val_files=[str(other), str(other)])
    with pytest.raises(DataError, match=rf"^data.train_files: {path}: {expected}"):
        own_splits(data)


def test_without_val_files_ten_percent_is_held_out_the_same_each_time(tmp_path):
    f = _write(tmp_path / "pairs.tsv", "".join(f"s{i}\tt{i}\n" for i in range(30)))
    data = DataSection(task="translation", dataset="files", train_files=[str(f)])
    train, val = own_splits(data)
    assert (len(train), len(val)) == (27, 3) and not set(train.src) & set(val.src)
    assert own_splits(data)[1].src == val.src  # a fixed draw: `aiayn evaluate --split val` finds the same ones


def test_every_example_file_of_docs_data_md_reads_as_its_paragraph_says(tmp_path):
    """The five-line examples of docs/data.md ("Your own data"), each read by the reader it is for."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "data.md").read_text(encoding="utf-8")
    section = doc[doc.index("## Your own data"):doc.index("## Tokenizers")]
    examples = [b for b in re.findall(r"```\n(.*?)```", section, flags=re.S) if not b.startswith(("aiayn", "data."))]
    assert len(examples) == 5 and all(len(b.splitlines()) == 5 for b in examples)
    read = []
    for k, body in enumerate(examples):
        suffix = ".jsonl" if body.startswith("{") else ".csv" if body.startswith("id,") else ".tsv"
        path = _write(tmp_path / f"example{k}{suffix}", body)
        if "pos" in body:
            read.append(read_classification(path).label_names)
        else:
            pairs = read_pairs(path, source_column="de", target_column="en") if suffix == ".jsonl" else read_pairs(path)
            read.append((len(pairs), pairs.tgt[0]))
    assert read == [["neg", "neutral", "pos"]] * 3 + [(5, "A dog runs across the meadow.")] * 2
