"""Shared fixtures reach a test through its folder's conftest.py: no test file imports a fixture of
tests/support by name (a ``*_fixture`` function, which a test module would then hold unused)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SUPPORT = {p.stem for p in (TESTS / "support").glob("*.py")}


def fixture_imports(path: Path) -> list[str]:
    """The ``*_fixture`` names ``path`` imports from a module of tests/support."""
    return [alias.name for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.ImportFrom) and node.module in SUPPORT
            for alias in node.names if alias.name.endswith("_fixture")]


def test_no_test_file_imports_a_shared_fixture() -> None:
    found = {p.relative_to(TESTS).as_posix(): names for p in sorted(TESTS.rglob("test_*.py"))
             if (names := fixture_imports(p))}
    assert found == {}


def test_each_shared_fixture_a_test_file_used_reaches_its_folder_through_the_conftest() -> None:
    imported = {p.parent.name: set(fixture_imports(p)) for p in sorted(TESTS.glob("*/conftest.py"))}
    assert imported["worker"] >= {"worker_fixture", "client_fixture", "source_fixture", "procs_fixture",
                                  "own_server_fixture", "rds_fixture", "cluster_fixture", "queue_client_fixture"}
    assert imported["core"] >= {"cluster_fixture", "cluster_registry_fixture", "ctx_fixture", "spawned_fixture"}
    assert imported["ops"] >= {"root_fixture", "make_backend_fixture"}
    assert imported["cli"] >= {"worker_fixture", "client_fixture"}
    assert imported["console"] >= {"deployment_fixture", "browser_fixture", "page_fixture"}
