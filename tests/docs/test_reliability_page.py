"""docs/reliability.md cites a test for every fault: each cited path must exist, be collected by pytest,
and carry the `reliability` marker (so `pytest -m reliability` runs exactly the page)."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

pytestmark = pytest.mark.reliability
ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reliability.md"
CITED = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?")


def _citations() -> list[tuple[str, str | None]]:
    found = {(path, name or None) for path, name in CITED.findall(PAGE.read_text(encoding="utf-8"))}
    return sorted(found, key=lambda c: (c[0], c[1] or ""))


def _marks_reliability(decorators: list[ast.expr]) -> bool:
    return any("reliability" in ast.unparse(d) for d in decorators)


@cache
def _tests(path: str) -> tuple[bool, dict[str, bool]]:
    """(the module is marked reliability, {test function: marked reliability itself})."""
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    module_marked = any(
        isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets)
        and "reliability" in ast.unparse(node.value)
        for node in tree.body
    )
    found: dict[str, bool] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            found[node.name] = _marks_reliability(node.decorator_list)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            marked = _marks_reliability(node.decorator_list)
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("test"):
                    found[item.name] = marked or _marks_reliability(item.decorator_list)
    return module_marked, found


def test_every_test_the_page_cites_exists_and_is_a_collected_reliability_test():
    citations = _citations()
    assert len(citations) > 50  # the page's tables, not an empty match
    problems = []
    for path, name in citations:
        file = ROOT / path
        if not file.is_file():
            problems.append(f"{path}: no such file")
            continue
        if not re.fullmatch(r"test_\w+\.py", file.name):  # pytest's default python_files
            problems.append(f"{path}: pytest does not collect this file name")
            continue
        module_marked, tests = _tests(path)
        if name is None:
            if not tests:
                problems.append(f"{path}: holds no test")
            elif not module_marked and not all(tests.values()):
                problems.append(f"{path}: not every test is marked reliability")
        elif name not in tests:
            problems.append(f"{path}::{name}: no such test")
        elif not (module_marked or tests[name]):
            problems.append(f"{path}::{name}: not marked reliability")
    assert not problems, "\n".join(problems)
