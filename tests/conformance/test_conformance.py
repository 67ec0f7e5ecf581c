"""Every model variant through every entry point (see :mod:`matrix`), and docs/support.md up to date."""

import pytest
from matrix import COLUMNS, SUPPORT_PAGE, cell, support_table
from variants import VARIANTS


@pytest.mark.parametrize("column", COLUMNS)
@pytest.mark.parametrize("name", list(VARIANTS))
def test_cell(name, column):
    outcome = cell(name, column)
    assert outcome == "-" or outcome.startswith(("yes", "refused: "))


def test_support_page_is_what_the_code_does():
    expected = support_table()
    assert SUPPORT_PAGE.read_text(encoding="utf-8") == expected, (
        "docs/support.md is out of date: run .venv/bin/python tests/conformance/matrix.py"
    )
