"""House rules that keep the layers apart: who may import RQ, who may read the environment."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "sessionfork"
# The job and worker modules (and the benchmark's peers) are the only ones that speak RQ.
RQ_MODULES = {"jobs", "workers", "resilience", "measure"}
# Entry points read the environment; nothing else does.
ENVIRON_MODULES = {"cli", "admin", "jobs"}


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 0}
    return {name.split(".")[0] for name in names}


def test_only_job_and_worker_modules_import_rq() -> None:
    speaking = {p.stem for p in PACKAGE.glob("*.py") if "rq" in imports(p)}
    assert speaking == RQ_MODULES


def test_importing_the_package_does_not_import_rq() -> None:
    code = "import sys, sessionfork, sessionfork.core.forks; print(any(m.split('.')[0] == 'rq' for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_only_entry_points_read_the_environment() -> None:
    reading = set()
    for path in PACKAGE.glob("*.py"):
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.Attribute) and n.attr == "environ" for n in ast.walk(tree)):
            reading.add(path.stem)
    assert reading <= ENVIRON_MODULES


def test_key_names_are_built_only_in_keys() -> None:
    for path in PACKAGE.glob("*.py"):
        if path.stem in {"keys", "acl"}:  # acl writes key *patterns* from keys' constants
            continue
        text = path.read_text()
        assert 'f"sf:' not in text and "'sf:" not in text and '"sf:' not in text, path.name
