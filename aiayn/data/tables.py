"""Rows of a table file as users have them: TSV, CSV or JSON lines, with or without a header.

Columns are chosen by name (matched against the header, or the keys of a JSON object) or by number
(``0`` is the first column, for a file without a header). With ``header=None`` a header is detected:
the first row is one when a field of it is a name the caller looks for (``text``, ``label``, the
name set in ``data.text_column``, ...). Blank lines are skipped; every other row must have as many
columns as the first (a TSV text cannot hold a tab: use CSV with quotes, or JSON lines). Errors
name the file, the line and the setting to change.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

from aiayn.data.errors import DataError

__all__ = ["TableFormat", "TABLE_FORMATS", "Column", "table_format", "read_table"]

TableFormat = Literal["tsv", "csv", "jsonl"]
TABLE_FORMATS: tuple[TableFormat, ...] = ("tsv", "csv", "jsonl")
_SUFFIXES: dict[str, TableFormat] = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}


@dataclass(frozen=True)
class Column:
    """A column to read: the ``setting`` that chooses it (``data.text_column``), the user's ``choice``
    (a name, a number as text, or ``None`` for the defaults), the header ``names`` looked for without
    a choice, and its ``position`` in a file without a header."""

    setting: str
    choice: str | None
    names: tuple[str, ...]
    position: int

    @property
    def number(self) -> int | None:
        """The choice as a column number, when it is one."""
        return int(self.choice) if self.choice is not None and self.choice.isdigit() else None

    def wanted(self) -> tuple[str, ...]:
        """The names that mark a header row (lower case)."""
        if self.choice is not None and self.number is None:
            return (self.choice.strip().lower(),)
        return tuple(n.lower() for n in self.names) if self.choice is None else ()

    def describe(self) -> str:
        return repr(self.choice) if self.choice is not None else " or ".join(repr(n) for n in self.names)


def table_format(path: str | Path) -> TableFormat:
    """``csv`` for ``.csv``, ``jsonl`` for ``.jsonl`` / ``.ndjson`` / ``.json``, else ``tsv``."""
    return _SUFFIXES.get(Path(path).suffix.lower(), "tsv")


def read_table(
    path: Path, text: str, columns: Sequence[Column], *, header: bool | None = None, format: TableFormat | None = None,
) -> list[tuple[int, list[str]]]:
    """``(line, [value of each column])`` for every data row of ``text`` (the content of ``path``).

    Raises ``DataError`` naming the line for a malformed row, and the setting for a column not found.
    """
    format = format or table_format(path)
    if format not in TABLE_FORMATS:
        raise ValueError(f"format must be one of {TABLE_FORMATS} or None, got {format!r}")
    if format == "jsonl":
        rows = _json_rows(path, text, columns)
    else:
        rows = _delimited_rows(path, text, columns, header, "\t" if format == "tsv" else ",")
    if not rows:
        raise DataError(f"{path}: no data rows (the file holds {'a header only' if text.strip() else 'only blank lines'})")
    return rows


def _delimited_rows(
    path: Path, text: str, columns: Sequence[Column], header: bool | None, delimiter: str,
) -> list[tuple[int, list[str]]]:
    records = _split_tsv(text) if delimiter == "\t" else _split_csv(path, text)
    if not records:
        return []
    first_line, first = records[0]
    if header is None:
        marks = {name for c in columns for name in c.wanted()}
        header = any(field.strip().lower() in marks for field in first)
    where = f"the header (line {first_line})" if header else f"line {first_line}"
    indices = _header_indices(path, first, columns) if header else _positions(path, first, columns, delimiter)
    width = len(first)
    rows = []
    for line, fields in records[1:] if header else records:
        if len(fields) != width:
            hint = "; a tab inside a text is not allowed in a TSV file: use CSV (quoted fields) or JSON lines" if delimiter == "\t" else ""
            raise DataError(f"{path}: line {line}: {len(fields)} columns, expected {width} as in {where}{hint}")
        rows.append((line, [fields[i] for i in indices]))
    return rows


def _split_tsv(text: str) -> list[tuple[int, list[str]]]:
    lines = text.split("\n")
    return [(n, (line[:-1] if line.endswith("\r") else line).split("\t")) for n, line in enumerate(lines, start=1) if line.strip()]


def _split_csv(path: Path, text: str) -> list[tuple[int, list[str]]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    records, start = [], 1
    try:
        for fields in reader:
            if fields and any(f.strip() for f in fields):
                records.append((start, fields))
            start = reader.line_num + 1
    except csv.Error as e:
        raise DataError(f"{path}: line {reader.line_num}: not valid CSV ({e})") from None
    return records


def _header_indices(path: Path, header: list[str], columns: Sequence[Column]) -> list[int]:
    lowered = [h.strip().lower() for h in header]
    indices = []
    for column in columns:
        names = (column.choice,) if column.choice is not None else column.names
        found = [lowered.index(n.strip().lower()) for n in names if n.strip().lower() in lowered]
        if not found and column.number is not None and column.number < len(header):
            found = [column.number]
        if not found:
            raise DataError(
                f"{column.setting}: {path}: no column {column.describe()} in the header {header}; "
                f"set {column.setting} to one of {[h.strip() for h in header]}"
            )
        indices.append(found[0])
    _check_distinct(path, columns, indices)
    return indices


def _positions(path: Path, first: list[str], columns: Sequence[Column], delimiter: str) -> list[int]:
    """Column numbers in a file without a header: the choices, else the default positions when the
    file has exactly as many columns as are read."""
    kind = "TSV" if delimiter == "\t" else "CSV"
    named = [c for c in columns if c.choice is not None and c.number is None]
    if named:
        c = named[0]
        raise DataError(
            f"{c.setting}={c.choice!r} names a column, but the first line of {path}, {first}, is not a header that holds it: "
            f"set data.header=true if it is the header, or give the column's number ({c.setting}=0 for the first)"
        )
    if any(c.number is None for c in columns) and len(first) != len(columns):
        settings = " and ".join(f"{c.setting}=N" for c in columns)
        raise DataError(
            f"{path}: {len(first)} columns in line 1 and no header line: say which to read with {settings} "
            f"(0 = the first column), or add a header line naming them ({', '.join(c.describe() for c in columns)}); "
            f"a {kind} file without a header holds exactly {len(columns)} columns in the order "
            f"{', '.join(c.setting.split('.')[-1] for c in sorted(columns, key=lambda c: c.position))}"
        )
    indices = [c.number if c.number is not None else c.position for c in columns]
    for c, i in zip(columns, indices):
        if i >= len(first):
            raise DataError(f"{c.setting}={i}: {path} has only {len(first)} columns (0 = the first)")
    _check_distinct(path, columns, indices)
    return indices


def _check_distinct(path: Path, columns: Sequence[Column], indices: list[int]) -> None:
    for k, i in enumerate(indices):
        if i in indices[:k]:
            other = columns[indices.index(i)]
            raise DataError(f"{columns[k].setting} and {other.setting} both name column {i} of {path}: give two different columns")


def _json_rows(path: Path, text: str, columns: Sequence[Column]) -> list[tuple[int, list[str]]]:
    rows = []
    keys: list[str] | None = None
    for n, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: line {n}: not valid JSON ({e.msg} at column {e.colno}); JSON lines hold one object per line") from None
        if not isinstance(record, dict):
            raise DataError(f"{path}: line {n}: expected a JSON object such as {{\"text\": ..., \"label\": ...}}, got {type(record).__name__}")
        if keys is None:
            keys = [_json_key(path, n, record, c) for c in columns]
        values = []
        for column, key in zip(columns, keys):
            if key not in record:
                raise DataError(f"{path}: line {n}: no key {key!r} ({column.setting}); the object's keys: {sorted(record)}")
            values.append(_json_text(path, n, key, record[key]))
        rows.append((n, values))
    return rows


def _json_key(path: Path, line: int, record: dict, column: Column) -> str:
    names = (column.choice,) if column.choice is not None else column.names
    for name in names:
        if name in record:
            return name
    raise DataError(
        f"{column.setting}: {path}: line {line}: no key {column.describe()} in the object (its keys: {sorted(record)}); "
        f"set {column.setting} to one of them"
    )


def _json_text(path: Path, line: int, key: str, value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # numeric labels: 0, 1, 2
    raise DataError(f"{path}: line {line}: {key!r} holds {type(value).__name__} {value!r}; expected a string (or a number for a label)")
