#!/usr/bin/env python3
"""Set up and run everything with only Python 3.11+: creates .venv, installs, runs.

    python3 run.py demo [--redis-url URL]   the main job: a walkthrough on an embedded server
    python3 run.py test [PYTEST ARGS]        ruff, mypy --strict, the whole test suite (current RQ), then
                                             mypy and the worker, fault and hostile tests on RQ 2.12
    python3 run.py bench [--quick]           the benchmark (table on stdout, JSON in bench-results/), then
                                             its RQ-dependent figures again on RQ 2.12
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
BIN_DIR = "Scripts" if os.name == "nt" else "bin"
# The older RQ major that sessionfork still supports: its last release.
RQ2 = "rq==2.12.0"
# What runs again on RQ 2: everything that touches RQ (the worker, faults, hostile input, ACLs, the
# job hashes the asyncio client writes, rq info and rq-dashboard).
RQ2_SUITE = ["tests/unit", "tests/integration/test_worker.py", "tests/integration/test_faults.py",
             "tests/integration/test_hostile.py", "tests/integration/test_hostile_queue.py",
             "tests/integration/test_hardening.py",
             "tests/integration/test_worker_exit.py", "tests/integration/test_acl.py",
             "tests/integration/test_rq_compat.py", "tests/integration/test_unreached_paths.py",
             "tests/integration/test_aio.py", "tests/integration/test_rq_dashboard.py",
             "tests/integration/test_enqueue_script.py"]


def ensure_env(name: str = ".venv", *pins: str) -> Path:
    """Create ``name`` and install the project with its test extras (and ``pins``), once per pyproject.

    Returns the env's bin directory.
    """
    if sys.version_info < (3, 11):  # noqa: UP036 - this file runs before any check of the Python version
        sys.exit(f"sessionfork needs Python 3.11+, this is {sys.version.split()[0]}")
    env = ROOT / name
    bin_dir = env / BIN_DIR
    stamp = env / ".sessionfork-installed"
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + repr(pins).encode()).hexdigest()
    if stamp.exists() and stamp.read_text() == want:
        return bin_dir
    if not (bin_dir / "python").exists():
        print(f"creating {name} ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(env)
    print(f"installing sessionfork and its test tools into {name} {' '.join(pins)}...", flush=True)
    pip = [str(bin_dir / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "-e", f"{ROOT}[test]", *pins], check=True)
    stamp.write_text(want)
    return bin_dir


def run(*cmd: str, env: dict[str, str] | None = None) -> int:
    return subprocess.run(cmd, cwd=ROOT, env=None if env is None else {**os.environ, **env}).returncode


def test(bin_dir: Path, rest: list[str]) -> int:
    """Lint and type-check, the whole suite on the current RQ, then RQ 2.12 (unless ``rest`` picks tests)."""
    for step in ([str(bin_dir / "ruff"), "check", "src", "tests", "bench", "worker", "run.py"],
                 [str(bin_dir / "mypy")]):
        code = run(*step)
        if code:
            return code
    code = run(str(bin_dir / "python"), "-m", "pytest", *rest)
    if code or rest:
        return code
    print(f"\n== again on {RQ2}: mypy --strict, then the worker, fault and hostile-input tests ==", flush=True)
    rq2 = ensure_env(".venv-rq2", RQ2)
    code = run(str(rq2 / "mypy"))
    if code:
        return code
    return run(str(rq2 / "python"), "-m", "pytest", *RQ2_SUITE, env={"SESSIONFORK_EXPECT_RQ": "2"})


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"demo", "test", "bench", "worker"}:
        print(__doc__)
        return 2
    bin_dir = ensure_env()
    task, rest = argv[0], argv[1:]
    py = str(bin_dir / "python")
    if task in {"demo", "worker"}:
        return run(py, "-m", "sessionfork", task, *rest)
    if task == "bench":
        code = run(py, "-m", "bench.main", *rest)
        if code or "--help" in rest or "-h" in rest:
            return code
        print(f"\n== the RQ-dependent figures again on {RQ2} ==", flush=True)
        rq2 = ensure_env(".venv-rq2", RQ2)
        quick = ["--quick"] if "--quick" in rest else []
        return run(str(rq2 / "python"), "-m", "bench.main", "--queue-only", *quick, "--out", "bench-results/rq2")
    return test(bin_dir, rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
