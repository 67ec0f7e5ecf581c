from __future__ import annotations

import pytest

from aiayn.data import DataError, read_classification, read_lines, read_parallel, read_text


def test_read_lines_keeps_the_text_exactly(tmp_path) -> None:
    f = tmp_path / "a.txt"
    f.write_bytes("\ufeffeins\u00a0zwei \nline\u2028same line\r\n\ttab\n\n".encode())
    assert read_lines(f) == ["eins\u00a0zwei ", "line\u2028same line", "\ttab", ""]
    g = tmp_path / "b.txt"
    g.write_bytes(b"no final newline")
    assert read_lines(g) == ["no final newline"]


def test_parallel_files_with_different_line_counts(tmp_path) -> None:
    src, tgt = tmp_path / "train.de", tmp_path / "train.en"
    src.write_text("a\nb\nc\n", encoding="utf-8")
    tgt.write_text("x\ny\n", encoding="utf-8")
    with pytest.raises(DataError) as e:
        read_parallel(src, tgt)
    msg = str(e.value)
    assert f"{src} has 3 lines" in msg and f"{tgt} has 2 lines" in msg
    tgt.write_text("x\ny\nz\n", encoding="utf-8")
    pairs = read_parallel(src, tgt)
    assert (pairs.src, pairs.tgt, len(pairs)) == (["a", "b", "c"], ["x", "y", "z"], 3)
    assert pairs.reversed().src == ["x", "y", "z"]


def test_non_utf8_names_file_and_line(tmp_path) -> None:
    f = tmp_path / "bad.en"
    f.write_bytes("ok\nstill ok ü\nbad \xff here\n".encode().replace(b"\xc3\xbf", b"\xff"))
    with pytest.raises(DataError, match=r"bad\.en: line 3, byte column 5: invalid UTF-8 \(byte 0xff\)"):
        read_lines(f)


def test_empty_file(tmp_path) -> None:
    f = tmp_path / "empty.txt"
    f.write_bytes(b"")
    with pytest.raises(DataError, match="empty.txt: file is empty"):
        read_text(f)
    with pytest.raises(DataError, match="file is empty"):
        read_parallel(f, f)


def test_tsv_classification(tmp_path) -> None:
    f = tmp_path / "train.tsv"
    f.write_text("1\tgood film\n0\tbad film \n\n1\tfine\n", encoding="utf-8")
    data = read_classification(f)
    assert data.texts == ["good film", "bad film ", "fine"]  # the blank line is skipped; texts as written
    assert data.labels == [1, 0, 1] and data.label_names == ["0", "1"]


def test_a_tsv_row_with_another_number_of_columns_names_its_line(tmp_path) -> None:
    f = tmp_path / "train.tsv"
    f.write_text("".join(f"{i % 2}\tsentence {i}\n" for i in range(56)) + "1\ttoo\tmany\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"train.tsv: line 57: 3 columns, expected 2 as in line 1; a tab inside a text"):
        read_classification(f)


def test_unknown_label_names_label_line_and_known_labels(tmp_path) -> None:
    f = tmp_path / "dev.tsv"
    f.write_text("1\tgood\n2\tweird\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"dev.tsv: line 2: label '2' is unknown; known labels: \['0', '1'\]"):
        read_classification(f, label_names=["0", "1"])


def test_tsv_line_without_tab(tmp_path) -> None:
    f = tmp_path / "x.tsv"
    f.write_text("1\tgood\nno tab here\n", encoding="utf-8")
    with pytest.raises(DataError, match="line 2: 1 columns, expected 2 as in line 1"):
        read_classification(f)


def test_csv_with_header_and_named_columns(tmp_path) -> None:
    f = tmp_path / "data.csv"
    f.write_text('id,review,sentiment\n1,"great, really",pos\n2,"multi\nline",neg\n3,meh,neutral\n', encoding="utf-8")
    data = read_classification(f, text_column="review", label_column="sentiment", label_names=["neg", "pos", "neutral"])
    assert data.texts == ["great, really", "multi\nline", "meh"]
    assert data.labels == [1, 0, 2]
    with pytest.raises(DataError, match=r"line 5: label 'neutral' is unknown"):
        read_classification(f, text_column="review", label_column="sentiment", label_names=["neg", "pos"])
    with pytest.raises(DataError, match=r"data.text_column: .*data.csv: no column 'text' or 'sentence' in the header "
                                        r"\['id', 'review', 'sentiment'\]; set data.text_column to one of"):
        read_classification(f, label_column="sentiment")


def test_classification_file_without_examples(tmp_path) -> None:
    f = tmp_path / "h.csv"
    f.write_text("label,sentence\n", encoding="utf-8")
    with pytest.raises(DataError, match="no data rows"):
        read_classification(f)


def test_labels_sort_numerically() -> None:
    from aiayn.data.readers import _sorted_labels

    assert _sorted_labels({"10", "2", "1"}) == ["1", "2", "10"]
    assert _sorted_labels({"pos", "neg"}) == ["neg", "pos"]
