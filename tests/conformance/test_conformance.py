"""Every model variant through every entry point (see :mod:`matrix`), and docs/support.md up to date.

Each cell runs once, in its own test, and must equal the page's cell; the page's text must then be the
table its own cells make (header, rows and settings as the code has them)."""

import pytest
from matrix import COLUMNS, SUPPORT_PAGE, cell, page_cells, support_table
from variants import VARIANTS

STALE = "docs/support.md is out of date: run .venv/bin/python tests/conformance/matrix.py"


@pytest.mark.parametrize("column", COLUMNS)
@pytest.mark.parametrize("name", list(VARIANTS))
def test_cell(name, column):
    outcome = cell(name, column)
    assert outcome == "-" or outcome.startswith(("yes", "refused: "))
    page = page_cells(SUPPORT_PAGE.read_text(encoding="utf-8"))
    assert page.get((name, column)) == outcome, f"{STALE} ({name}, {column}: the page says {page.get((name, column))!r})"


def test_support_page_is_what_the_code_does():
    page = SUPPORT_PAGE.read_text(encoding="utf-8")
    cells = page_cells(page)
    assert set(cells) == {(name, column) for name in VARIANTS for column in COLUMNS}, STALE
    assert page == support_table(lambda name, column: cells[(name, column)]), STALE
