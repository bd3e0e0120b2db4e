"""House rules that keep the layers apart: who may import RQ, who may read the environment, which
way imports go (core <- queue <- ops <- cli), where key names are built."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "sessionfork"
MODULES = sorted(PACKAGE.rglob("*.py"))
# RQ is spoken by the queue layer's job and worker modules (RQ beyond its documented API only in
# rq_seam) and by the public job-function façade.
RQ_MODULES = {"jobs", "queue/jobs", "queue/rq_seam", "queue/worker"}
# Entry points read the environment; nothing else does.
ENVIRON_MODULES = {"cli/__init__", "jobs"}
LAYERS = ["core", "queue", "ops", "cli"]  # a layer imports only from itself and the layers before it


def name(path: Path) -> str:
    return path.relative_to(PACKAGE).with_suffix("").as_posix()


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 0}
    return {n.split(".")[0] for n in names}


def reads_environment(path: Path) -> bool:
    """``os.environ``, ``os.environb``, ``os.getenv``, ``os.getenvb``, or any of them imported by name."""
    readers = {"environ", "environb", "getenv", "getenvb"}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in readers:
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "os" and readers & {a.name for a in node.names}:
            return True
    return False


def test_only_job_and_worker_modules_import_rq() -> None:
    speaking = {name(p) for p in MODULES if "rq" in imports(p)}
    assert speaking == RQ_MODULES


def test_importing_the_package_does_not_import_rq() -> None:
    code = "import sys, sessionfork, sessionfork.core.forks; print(any(m.split('.')[0] == 'rq' for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_only_entry_points_read_the_environment() -> None:
    assert {name(p) for p in MODULES if reads_environment(p)} == ENVIRON_MODULES


@pytest.mark.parametrize("source", ["import os\nos.getenv('X')\n", "from os import getenv\n",
                                    "from os import environ as e\n", "import os\nos.environ.get('X')\n"])
def test_the_environment_check_catches_every_way_to_read_it(tmp_path: Path, source: str) -> None:
    module = tmp_path / "m.py"
    module.write_text(source)
    assert reads_environment(module)


def test_imports_go_down_the_layers() -> None:
    upward = []
    for path in MODULES:
        layer = name(path).split("/")[0]
        if layer not in LAYERS:
            continue
        allowed = set(LAYERS[:LAYERS.index(layer) + 1])
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level >= 2 and node.module:
                target = node.module.split(".")[0]
                if target in LAYERS and target not in allowed:
                    upward.append(f"{name(path)} imports {target}")
    assert upward == []


def test_key_names_are_built_only_in_keys() -> None:
    for path in MODULES:
        if name(path) in {"core/keys", "ops/acl"}:  # acl writes key *patterns* from keys' constants
            continue
        text = path.read_text()
        assert 'f"sf:' not in text and "'sf:" not in text and '"sf:' not in text, name(path)
