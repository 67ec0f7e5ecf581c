"""Generic readers: parallel text (two files or one table of pairs), plain text, and labelled text (TSV, CSV or
JSON lines), all strict UTF-8.

Lines are split on ``\\n`` only (never on U+2028 and friends, which would break the alignment of
parallel files); a trailing ``\\r`` is removed; a leading byte-order mark is ignored. Nothing else
is touched, so no-break spaces and trailing whitespace reach the tokenizer as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from aiayn.data.errors import DataError
from aiayn.data.tables import Column, TableFormat, read_table

__all__ = [
    "ParallelText",
    "LabeledText",
    "read_text",
    "read_lines",
    "read_parallel",
    "read_classification",
    "read_pairs",
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
    """Whole file as one string. Raises ``DataError`` for a missing or unreadable file, an empty file,
    or bytes that are not UTF-8 (naming the line)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory; expected a file") from None
    except PermissionError:
        raise DataError(f"{path}: cannot be read (permission denied)") from None
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror or e})") from None
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
    format: TableFormat | None = None,
    text_column: str | None = None,
    label_column: str | None = None,
    header: bool | None = None,
    known_from: str | None = None,
) -> LabeledText:
    """Labelled texts from a table: TSV, CSV or JSON lines (see :mod:`aiayn.data.tables`).

    ``format`` defaults to the file suffix (``.csv``, ``.jsonl``, else TSV). Columns: ``text_column``
    and ``label_column`` by name or number; by default the header's ``text`` (or ``sentence``) and
    ``label``, or, without a header, ``label`` then ``text`` (SST-2's ``label<TAB>text``). ``header``:
    ``None`` detects it. ``label_names`` fixes the label set and its order (pass the training set's
    when reading a dev set; ``known_from`` says where they come from, for the error); without it the
    set is what the file holds, sorted (numerically when every label is an integer). Raises
    ``DataError`` for an unknown label (naming it, the line and the known labels), a malformed row,
    or a file with no examples.
    """
    path = Path(path)
    columns = [
        Column("data.label_column", label_column, ("label",), 0),
        Column("data.text_column", text_column, ("text", "sentence"), 1),
    ]
    rows = read_table(path, read_text(path), columns, header=header, format=format)
    rows = [(line, [label.strip(), text]) for line, (label, text) in rows]
    if label_names is None:
        label_names = _sorted_labels({label for _, (label, _) in rows})
    index = {name: i for i, name in enumerate(label_names)}
    texts, labels = [], []
    for line, (label, text) in rows:
        if label not in index:
            where = f"does not occur in {known_from}" if known_from else "is unknown"
            raise DataError(f"{path}: line {line}: label {label!r} {where}; known labels: {list(label_names)}")
        texts.append(text)
        labels.append(index[label])
    return LabeledText(texts, labels, list(label_names))


def read_pairs(
    path: str | Path,
    *,
    format: TableFormat | None = None,
    source_column: str | None = None,
    target_column: str | None = None,
    header: bool | None = None,
) -> ParallelText:
    """Sentence pairs from one table: ``source<TAB>target`` lines, a CSV, or JSON lines with
    ``source`` / ``target`` keys (``source_column`` / ``target_column`` choose others, by name or
    number). Raises ``DataError`` naming the line of a pair with an empty side."""
    path = Path(path)
    columns = [
        Column("data.source_column", source_column, ("source", "src"), 0),
        Column("data.target_column", target_column, ("target", "tgt"), 1),
    ]
    src, tgt = [], []
    for line, (source, target) in read_table(path, read_text(path), columns, header=header, format=format):
        for side, text in (("source", source), ("target", target)):
            if not text.strip():
                raise DataError(f"{path}: line {line}: the {side} is empty; every pair needs both sides (fill it in or remove the line)")
        src.append(source)
        tgt.append(target)
    return ParallelText(src, tgt)


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
