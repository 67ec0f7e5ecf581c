"""Generic readers: parallel text, plain text, and labelled text (TSV or CSV), all strict UTF-8.

Lines are split on ``\\n`` only (never on U+2028 and friends, which would break the alignment of
parallel files); a trailing ``\\r`` is removed; a leading byte-order mark is ignored. Nothing else
is touched, so no-break spaces and trailing whitespace reach the tokenizer as they are.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

from aiayn.data.errors import DataError

__all__ = [
    "ParallelText",
    "LabeledText",
    "read_text",
    "read_lines",
    "read_parallel",
    "read_classification",
]


@dataclass(frozen=True)
class ParallelText:
    """Aligned sentence pairs: ``src[i]`` translates to ``tgt[i]``."""

    src: list[str]
    tgt: list[str]

    def __post_init__(self) -> None:
        if len(self.src) != len(self.tgt):
            raise DataError(f"src has {len(self.src)} lines but tgt has {len(self.tgt)}")

    def __len__(self) -> int:
        return len(self.src)

    def reversed(self) -> ParallelText:
        """The other translation direction."""
        return ParallelText(self.tgt, self.src)


@dataclass(frozen=True)
class LabeledText:
    """Texts with integer labels; ``label_names[labels[i]]`` is the label as written in the file."""

    texts: list[str]
    labels: list[int]
    label_names: list[str]

    def __post_init__(self) -> None:
        if len(self.texts) != len(self.labels):
            raise DataError(f"{len(self.texts)} texts but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.texts)


def read_text(path: str | Path) -> str:
    """Whole file as one string. Raises ``DataError`` for an empty file or bytes that are not UTF-8
    (naming the line)."""
    path = Path(path)
    data = path.read_bytes()
    if not data:
        raise DataError(f"{path}: file is empty (0 bytes); expected UTF-8 text")
    return _decode(path, data)


def read_lines(path: str | Path) -> list[str]:
    """Lines of a text file without their line endings (the final newline ends the last line)."""
    text = read_text(path)
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_parallel(src_path: str | Path, tgt_path: str | Path) -> ParallelText:
    """Two files aligned by line. Raises ``DataError`` naming both files when the line counts differ."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(
            f"parallel files differ in length: {src_path} has {len(src)} lines, {tgt_path} has {len(tgt)} lines; "
            "line i of one must translate line i of the other"
        )
    return ParallelText(src, tgt)


def read_classification(
    path: str | Path,
    *,
    label_names: Sequence[str] | None = None,
    format: Literal["tsv", "csv"] | None = None,
    text_column: str = "sentence",
    label_column: str = "label",
) -> LabeledText:
    """Labelled texts from ``label<TAB>text`` lines (TSV, no header) or a CSV with a header.

    ``format`` defaults to the file suffix. ``label_names`` fixes the label set and its order (pass
    the training set's ``label_names`` when reading a dev set); without it the set is what the file
    holds, sorted (numerically when every label is an integer). Raises ``DataError`` for an unknown
    label (naming it, the line and the known labels), a malformed line, or a file with no examples.
    """
    path = Path(path)
    if format is None:
        format = "csv" if path.suffix.lower() == ".csv" else "tsv"
    if format == "tsv":
        rows = _tsv_rows(path)
    elif format == "csv":
        rows = _csv_rows(path, text_column, label_column)
    else:
        raise ValueError(f"format must be 'tsv', 'csv' or None, got {format!r}")
    if not rows:
        raise DataError(f"{path}: no examples (the file has no data lines)")
    if label_names is None:
        label_names = _sorted_labels({label for _, label, _ in rows})
    index = {name: i for i, name in enumerate(label_names)}
    texts, labels = [], []
    for line, label, text in rows:
        if label not in index:
            raise DataError(f"{path}: line {line}: unknown label {label!r}; known labels: {list(label_names)}")
        texts.append(text)
        labels.append(index[label])
    return LabeledText(texts, labels, list(label_names))


def _tsv_rows(path: Path) -> list[tuple[int, str, str]]:
    rows = []
    for n, line in enumerate(read_lines(path), start=1):
        label, tab, text = line.partition("\t")
        if not tab:
            raise DataError(f"{path}: line {n}: expected 'label<TAB>text', found no tab in {line[:60]!r}")
        rows.append((n, label, text))
    return rows


def _csv_rows(path: Path, text_column: str, label_column: str) -> list[tuple[int, str, str]]:
    reader = csv.DictReader(io.StringIO(read_text(path), newline=""))
    header = reader.fieldnames or []
    missing = [c for c in (label_column, text_column) if c not in header]
    if missing:
        raise DataError(f"{path}: missing column(s) {missing} in the header {header}; pass label_column/text_column")
    rows = []
    for record in reader:
        if record[label_column] is None or record[text_column] is None:
            raise DataError(f"{path}: line {reader.line_num}: fewer fields than the header {header}")
        rows.append((reader.line_num, record[label_column], record[text_column]))
    return rows


def _sorted_labels(labels: set[str]) -> list[str]:
    try:
        return sorted(labels, key=int)
    except ValueError:
        return sorted(labels)


def _decode(path: Path, data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise DataError(
            f"{path}: line {line}, byte column {column}: invalid UTF-8 (byte 0x{data[e.start]:02x}); "
            "the file must be UTF-8 encoded"
        ) from None
    return text[1:] if text.startswith("\ufeff") else text
