#!/usr/bin/env python3
"""Set up and run everything with only Python 3.11+: creates .venv, installs, runs.

    python3 run.py demo [--redis-url URL]   the main job: a walkthrough on an embedded server
    python3 run.py test [PYTEST ARGS]        ruff, mypy --strict, then the whole test suite
    python3 run.py bench [--quick]           the benchmark (table on stdout, JSON in bench-results/)
    python3 run.py worker [ARGS]             a worker (settings from REDIS_URL, SESSIONFORK_*)
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
STAMP = VENV / ".sessionfork-installed"


def ensure_env() -> None:
    """Create the virtual env and install the project with its test extras, once per pyproject."""
    if sys.version_info < (3, 11):  # noqa: UP036 - this file runs before any check of the Python version
        sys.exit(f"sessionfork needs Python 3.11+, this is {sys.version.split()[0]}")
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text() == want:
        return
    if not (BIN / "python").exists():
        print("creating .venv ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    print("installing sessionfork and its test tools into .venv ...", flush=True)
    pip = [str(BIN / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "-e", f"{ROOT}[test]"], check=True)
    STAMP.write_text(want)


def run(*cmd: str) -> int:
    return subprocess.run(cmd, cwd=ROOT).returncode


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"demo", "test", "bench", "worker"}:
        print(__doc__)
        return 2
    ensure_env()
    task, rest = argv[0], argv[1:]
    py = str(BIN / "python")
    if task in {"demo", "worker"}:
        return run(py, "-m", "sessionfork", task, *rest)
    if task == "bench":
        return run(py, "-m", "bench.main", *rest)
    for step in ([str(BIN / "ruff"), "check", "src", "tests", "worker", "run.py"], [str(BIN / "mypy")]):
        code = run(*step)
        if code:
            return code
    return run(py, "-m", "pytest", *rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
