"""The test tree mirrors the source tree, and the RQ 2.12 pass is chosen by a mark, not a list."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
PACKAGE = TESTS.parent / "src" / "sessionfork"
# Beside the source's own packages: the project's (layering, docs, the run script, the bench), the
# tests' shared helpers and fixtures (on pytest's pythonpath), and the test data.
EXTRA = {"project", "support", "data"}
TEST_FILES = sorted(TESTS.rglob("test_*.py"))


def test_every_test_folder_is_a_package_of_the_source_or_a_project_one() -> None:
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders - EXTRA <= packages, f"test folders naming no source package: {sorted(folders - EXTRA - packages)}"
    assert {"core", "protocol", "clients", "worker", "ops", "cli"} <= folders


def test_test_files_live_in_a_folder_and_their_names_are_unique() -> None:
    # pytest imports each test file by its name (no __init__.py): two of one name would clash.
    assert all(p.parent.parent == TESTS for p in TEST_FILES)
    names = [p.name for p in TEST_FILES]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert not list((TESTS / "support").glob("test_*.py"))


def marks_of(path: Path) -> set[str]:
    """The marks of a test file's ``pytestmark`` (``pytest.mark.X``, alone or in a list)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            return {n.attr for n in ast.walk(node.value) if isinstance(n, ast.Attribute)
                    and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"}
    return set()


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: p.name)
def test_a_test_that_imports_rq_runs_again_on_rq2(path: Path) -> None:
    if re.search(r"^\s*(import rq\b|from rq\b)", path.read_text(), re.M):
        assert "rq" in marks_of(path), f"{path.name} imports rq: mark it pytest.mark.rq"


def test_the_rq_mark_picks_the_worker_the_faults_and_the_job_hash() -> None:
    marked = {p.stem for p in TEST_FILES if "rq" in marks_of(p)}
    assert {"test_worker_replies", "test_faults_sigkill", "test_faults_sigterm", "test_hostile_queue",
            "test_aio_job_hash", "test_rq_dashboard", "test_acl", "test_merge_queue", "test_merge_faults"} <= marked
    # a test that only runs a worker to reach what it checks runs on the current RQ only (run.py RQ2_MARK)
    assert not {"test_enqueue_script", "test_aio_connections", "test_cli_conventions", "test_prometheus_live"} & marked
    assert len(marked) >= 25
