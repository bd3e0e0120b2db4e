"""Every test a documentation page names exists, so the promise-to-test mapping cannot rot.

A reference is ``tests/<path>.py::<name>`` in backquotes (a ``[param]`` suffix allowed) in README.md
or any docs/*.md page; it resolves when the file exists and defines a module-level test function
(``def`` or ``async def``) of that name.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
REFERENCE = re.compile(r"`(tests/[\w/.-]+\.py)::(\w+)(?:\[[^\]`]*\])?`")


def references() -> list[tuple[str, str, str]]:
    return [(page.relative_to(ROOT).as_posix(), path, name)
            for page in PAGES for path, name in REFERENCE.findall(page.read_text())]


def defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")}


def test_the_guarantees_page_names_its_tests() -> None:
    named = [r for r in references() if r[0] == "docs/guarantees.md"]
    assert len(named) >= 40, named  # every promise on the page names at least one test


@pytest.mark.parametrize(("page", "path", "name"), references())
def test_every_test_a_page_names_exists(page: str, path: str, name: str) -> None:
    file = ROOT / path
    assert file.is_file(), f"{page} names {path}, which does not exist"
    assert name in defined_tests(file), f"{page} names {path}::{name}, which is not a test function there"
