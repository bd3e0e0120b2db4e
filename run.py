#!/usr/bin/env python3
"""Set up and run everything with only Python 3.11+: creates .venv, installs, runs.

    python3 run.py demo [--redis-url URL]   the main job: a walkthrough on an embedded server
    python3 run.py test [PYTEST ARGS]        ruff, mypy --strict, the whole test suite (current RQ), then
                                             mypy and the worker, fault and hostile tests on RQ 2.12
    python3 run.py bench [--quick]           the benchmark (table on stdout, JSON in bench-results/), then
                                             its RQ-dependent figures again on RQ 2.12
    python3 run.py worker [ARGS]             a worker (settings from REDIS_URL, SESSIONFORK_*)
    python3 run.py mutations [-j N] [--baseline] [ID ...]
                                             the deliberate breaks of tests/mutations.toml, each applied
                                             to a temporary copy of the tree and run against the test
                                             files named beside it; exits 1 when any break was missed
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import venv
from concurrent.futures import ThreadPoolExecutor
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
             "tests/integration/test_worker_exit.py", "tests/integration/test_worker_outages.py",
             "tests/integration/test_outcome_rules.py", "tests/integration/test_acl.py",
             "tests/integration/test_rq_compat.py", "tests/integration/test_unreached_paths.py",
             "tests/integration/test_aio.py", "tests/integration/test_rq_dashboard.py"]


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


MUTATIONS = ROOT / "tests" / "mutations.toml"
MUTATION_TIMEOUT = 1800  # seconds one break's test run may take before it counts as hung


def load_mutations(path: Path = MUTATIONS) -> list[dict[str, object]]:
    """The breaks of ``path``, each checked: its fields, and its old text found exactly once."""
    breaks = tomllib.loads(path.read_text())["break"]
    problems = []
    for b in breaks:
        missing = {"id", "promise", "file", "old", "new", "tests"} - set(b)
        if missing:
            problems.append(f"{b.get('id', '?')}: missing {sorted(missing)}")
            continue
        source = ROOT / str(b["file"])
        found = source.read_text().count(str(b["old"])) if source.is_file() else -1
        if found != 1:
            problems.append(f"{b['id']}: old text found {found} times in {b['file']} (must be exactly once)")
        if b["old"] == b["new"]:
            problems.append(f"{b['id']}: new text equals old text")
        for test in b["tests"]:  # type: ignore[attr-defined]
            if not (ROOT / str(test).split("::")[0]).is_file():
                problems.append(f"{b['id']}: no test file {test}")
    ids = [b.get("id") for b in breaks]
    problems += [f"{i}: id used twice" for i in sorted({str(i) for i in ids if ids.count(i) > 1})]
    if problems:
        raise ValueError("\n".join(problems))
    return breaks


def _copy_tree(dest: Path) -> None:
    """Copy the work tree (tracked and untracked files, git-ignored ones excluded) to ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def _run_break(py: str, b: dict[str, object] | None) -> tuple[str, float, str]:
    """Apply ``b`` (None: no break) to a fresh copy and run its tests there; (verdict, seconds, output tail).

    The copy's ``src`` comes first on ``PYTHONPATH``, so that the tests and every worker process
    they start import the broken copy, never this tree (checked before the tests run).
    """
    with tempfile.TemporaryDirectory(prefix="sessionfork-mutant-") as tmp:
        copy = Path(tmp)
        _copy_tree(copy)
        tests = ["tests"] if b is None else [str(t) for t in b["tests"]]  # type: ignore[attr-defined]
        if b is not None:
            target = copy / str(b["file"])
            target.write_text(target.read_text().replace(str(b["old"]), str(b["new"]), 1))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(copy / "src"), str(copy)]),
               "PYTHONDONTWRITEBYTECODE": "1"}
        where = subprocess.run([py, "-c", "import sessionfork; print(sessionfork.__file__)"], cwd=copy, env=env,
                               capture_output=True, text=True).stdout.strip()
        if not where.startswith(str(copy.resolve())) and not where.startswith(str(copy)):
            return "error", 0.0, f"the copy is not what gets imported: {where}"
        began = time.monotonic()
        try:
            out = subprocess.run([py, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests], cwd=copy,
                                 env=env, capture_output=True, text=True, timeout=MUTATION_TIMEOUT)
        except subprocess.TimeoutExpired:
            return "hung", time.monotonic() - began, ""
        took = time.monotonic() - began
        lines = (out.stdout + out.stderr).strip().splitlines()
        why = [line for line in lines if line.startswith("E ")][:1]  # the first failed assertion
        tail = "\n".join(why + lines[-2:])
        verdict = {0: "missed", 1: "caught"}.get(out.returncode, f"error (pytest exit {out.returncode})")
        return verdict, took, tail


def mutations(bin_dir: Path, rest: list[str]) -> int:
    """Run the deliberate breaks (all, or the ids in ``rest``); 1 when any was missed or failed to run."""
    jobs = 1
    if "-j" in rest:
        at = rest.index("-j")
        jobs = int(rest[at + 1])
        rest = rest[:at] + rest[at + 2:]
    baseline = "--baseline" in rest
    wanted = [r for r in rest if r != "--baseline"]
    try:
        breaks = load_mutations()
    except (ValueError, KeyError, tomllib.TOMLDecodeError) as exc:
        print(f"tests/mutations.toml is broken:\n{exc}")
        return 1
    unknown = set(wanted) - {str(b["id"]) for b in breaks}
    if unknown:
        print(f"no such break: {', '.join(sorted(unknown))}")
        return 2
    chosen = [b for b in breaks if not wanted or b["id"] in wanted]
    py = str(bin_dir / "python")
    if baseline:
        verdict, took, tail = _run_break(py, None)
        print(f"baseline (no break, whole suite): {'green' if verdict == 'missed' else verdict} ({took:.0f}s)")
        if verdict != "missed":
            print(tail)
            return 1
    print(f"{len(chosen)} break(s), {jobs} at a time; each on a fresh copy of the tree", flush=True)
    bad = 0
    with ThreadPoolExecutor(jobs) as pool:
        for b, (verdict, took, tail) in zip(chosen, pool.map(lambda b: _run_break(py, b), chosen), strict=True):
            print(f"{verdict:>8}  {b['id']}  ({took:.0f}s)  {b['promise']}", flush=True)
            if verdict != "caught":
                bad += 1
            print("          " + tail.replace("\n", "\n          "))
    print(f"{len(chosen) - bad} of {len(chosen)} caught")
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"demo", "test", "bench", "worker", "mutations"}:
        print(__doc__)
        return 2
    bin_dir = ensure_env()
    task, rest = argv[0], argv[1:]
    py = str(bin_dir / "python")
    if task == "mutations":
        return mutations(bin_dir, rest)
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
