#!/usr/bin/env python3
"""Set up and run everything with only Python 3.11+: creates .venv, installs, runs.

    python3 run.py demo [--redis-url URL]   the main job: a walkthrough on an embedded server
    python3 run.py test [PYTEST ARGS]        ruff, mypy --strict, the whole test suite (mkdocs build --strict in it)
                                             (current RQ), then mypy and the worker, fault and hostile tests
                                             on RQ 2.12; installs Debian's chromium and prometheus first when missing
    python3 run.py bench [--quick] [--publish]  the benchmark (table on stdout, JSON in bench-results/), then
                                             its RQ-dependent figures again on RQ 2.12, then the LangGraph
                                             checkpointers' (bench.langgraph); --publish: into the
                                             docs (docs/data/bench.json and the Performance page's table)
    python3 run.py worker [ARGS]             a worker (settings from REDIS_URL, SESSIONFORK_*)
    python3 run.py mutations [-j N] [--baseline] [--file F] [ID ...]
                                             the deliberate breaks of tests/mutations.toml, each applied
                                             to a temporary copy of the tree and run against the test
                                             files named beside it (first unbroken: red there, the break
                                             is not scored); caught only when a test fails an assertion;
                                             exits 1 when any break was not caught
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import venv
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
BIN_DIR = "Scripts" if os.name == "nt" else "bin"
# The older RQ major that sessionfork still supports: its last release.
RQ2 = "rq==2.12.0"
# What runs again on RQ 2: the tests marked ``rq``, those whose outcome may differ by RQ version (the
# worker's loop, the seam and what it writes, faults, hostile queue entries, ACLs of the worker's
# commands, the job hashes the asyncio client writes, rq info and rq-dashboard; tests/project/
# test_test_tree.py checks that every test importing rq carries the mark). Tests that merely run a
# worker to reach what they check (the clients' waits, the enqueue script, the docs' pages, metrics)
# run on the current RQ only.
RQ2_MARK = "rq"
SLOWEST = 25  # each pytest phase prints its slowest tests (--durations)

# The system packages the suite needs, from Debian, each with the commands that show it installed (of
# each tuple, one name on PATH): chromium, the headless browser of the lineage page test
# (tests/support/browser.py looks for either name); prometheus, the server and its promtool, for the
# shipped alert rules and dashboard (tests/support/prometheus.py); nodejs and npm, which build and test
# the TypeScript client (tests/integrations/test_typescript_client.py). One apt-get installs what is missing.
BROWSERS = ("chromium", "chromium-browser")
SYSTEM_PACKAGES: dict[str, tuple[tuple[str, ...], ...]] = {
    "chromium": (BROWSERS,),
    "prometheus": (("prometheus",), ("promtool",)),
    "nodejs": (("node", "nodejs"),),
    "npm": (("npm",),),
}
APT_UPDATE = ("apt-get", "update", "-qq")
APT_INSTALL = ("apt-get", "install", "-y", "-qq")


def missing_packages(which: Callable[[str], str | None] = shutil.which) -> list[str]:
    """The packages of ``SYSTEM_PACKAGES`` whose commands are not all on PATH, in that order."""
    return [package for package, commands in SYSTEM_PACKAGES.items()
            if not all(any(which(name) for name in names) for names in commands)]


def install_hint(packages: list[str]) -> str:
    """The one-line instruction printed when ``packages`` are missing and cannot be installed here."""
    names = " ".join(packages)
    return (f"error: the test suite needs Debian's {', '.join(packages)} (chromium: the lineage page test's "
            "headless browser; prometheus: the server and promtool that check the shipped alert rules; nodejs "
            "and npm: the TypeScript client's build and tests); install "
            f"with `apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq {names}` (as root), "
            "then run python3 run.py test again")


def ensure_system_packages(which: Callable[[str], str | None] = shutil.which, is_root: bool | None = None,
                           sh: Callable[..., Any] = subprocess.run) -> str | None:
    """Make sure the system packages the suite needs (``SYSTEM_PACKAGES``) are installed; None when they are.

    When some are missing and this runs as root with apt-get, installs them all with one
    non-interactive ``apt-get install`` (after ``apt-get update``). Otherwise installs nothing and
    returns the one-line instruction to print (``install_hint``); the caller then stops before
    running anything.
    """
    missing = missing_packages(which)
    if not missing:
        return None
    if is_root is None:
        is_root = hasattr(os, "geteuid") and os.geteuid() == 0
    if not is_root or which("apt-get") is None:
        return install_hint(missing)
    print(f"installing Debian's {', '.join(missing)} (the suite's browser, Prometheus, Node.js) ...", flush=True)
    for cmd in (APT_UPDATE, (*APT_INSTALL, *missing)):  # dpkg's progress is noise unless it fails
        done = sh(list(cmd), env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, stdout=subprocess.PIPE,
                  stderr=subprocess.STDOUT, text=True)
        if done.returncode:
            print(done.stdout[-4000:], file=sys.stderr)
            return f"{install_hint(missing)} ({' '.join(cmd)} failed)"
    still = missing_packages(which)
    return install_hint(still) if still else None


TEST_EXTRAS = "test,docs,console,langgraph"
"""What the test command (and bench, mutations) installs: the suite's tools, the docs site's, the console's
and the LangGraph integration's."""
DEMO_EXTRAS = "embedded"
"""What ``demo`` and ``worker`` install: the embedded server, none of the test or docs tools."""


def ensure_env(name: str = ".venv", *pins: str, extras: str = TEST_EXTRAS) -> Path:
    """Create ``name`` and install the project with ``extras`` (and ``pins``), once per pyproject.
    An env set up with ``TEST_EXTRAS`` serves any ``extras`` (they include the embedded server).

    Returns the env's bin directory.
    """
    if sys.version_info < (3, 11):  # noqa: UP036 - this file runs before any check of the Python version
        sys.exit(f"sessionfork needs Python 3.11+, this is {sys.version.split()[0]}")
    env = ROOT / name
    bin_dir = env / BIN_DIR
    stamp = env / ".sessionfork-installed"
    project = (ROOT / "pyproject.toml").read_bytes() + repr(pins).encode()
    want = hashlib.sha256(project + extras.encode()).hexdigest()
    full = hashlib.sha256(project + TEST_EXTRAS.encode()).hexdigest()  # the test env holds the others
    if stamp.exists() and stamp.read_text() in {want, full}:
        return bin_dir
    if not (bin_dir / "python").exists():
        print(f"creating {name} ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(env)
    print(f"installing sessionfork[{extras}] into {name} {' '.join(pins)}...", flush=True)
    pip = [str(bin_dir / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "-e", f"{ROOT}[{extras}]", *pins], check=True)
    stamp.write_text(want)
    return bin_dir


def run(*cmd: str, env: dict[str, str] | None = None, stdout: Any = None) -> int:
    return subprocess.run(cmd, cwd=ROOT, env=None if env is None else {**os.environ, **env}, stdout=stdout,
                          stderr=None if stdout is None else subprocess.STDOUT).returncode


def start(*cmd: str, env: dict[str, str] | None = None, stdout: Any = None) -> subprocess.Popen[bytes]:
    """``run``'s command started, not awaited (``wait()`` gives its status)."""
    return subprocess.Popen(cmd, cwd=ROOT, env=None if env is None else {**os.environ, **env}, stdout=stdout,
                            stderr=None if stdout is None else subprocess.STDOUT)


def docs_build(bin_dir: Path, site_dir: Path, config: Path = ROOT / "mkdocs.yml") -> list[str]:
    """The docs site's build: strict, so a broken link, anchor or API reference fails it (never
    ``--quiet``: MkDocs 1.6 then stops counting the warnings that strict mode turns into a failure)."""
    return [str(bin_dir / "mkdocs"), "build", "--strict", "--config-file", str(config), "--site-dir", str(site_dir)]


def test(bin_dir: Path, rest: list[str]) -> int:
    """Lint and type-check, build the docs site strictly, the whole suite on the current RQ (in its
    ``phases``), then RQ 2.12 (unless ``rest`` picks tests: then pytest runs just those, in one process)."""
    # The RQ 2.12 env is made meanwhile (pip waits on the network and the disk more than the CPU).
    rq2_env: Future[Path] | None = None
    if not rest:
        rq2_env = ThreadPoolExecutor(max_workers=1).submit(ensure_env, ".venv-rq2", RQ2)
    # The docs site's strict build is a test of the suite (tests/project/test_docs.py), not a step here:
    # one build, where a step and the test built it twice.
    for step in ([str(bin_dir / "ruff"), "check", "src", "tests", "bench", "worker", "run.py"],
                 [str(bin_dir / "mypy")]):
        code = run(*step, env={"NO_MKDOCS_2_WARNING": "1"})
        if code:
            return code
    if rest:
        return run(str(bin_dir / "python"), "-m", "pytest", *rest)
    assert rq2_env is not None
    return suite_on_both(bin_dir, rq2_env)


RQ2_ENV = {"SESSIONFORK_EXPECT_RQ": "2"}


def suite_on_both(bin_dir: Path, rq2_env: Future[Path]) -> int:
    """The suite on the current RQ and, again, its ``rq`` tests on RQ 2.12 (after ``mypy`` there): the
    two parallel phases at once (they spend most of their time waiting on the servers and workers
    they start, so together they take little longer than the longer one), then the two serial
    phases at once, one process each. The RQ 2.12 phases' output is printed when each ends (its
    parallel phase starts once its env is made). The first failing step's status."""
    current_parallel, current_serial = phases()
    older_parallel, older_serial = phases(RQ2_MARK, processes=PARALLEL_RQ2)
    print(f"\n== pytest {' '.join(current_parallel)} (and, beside it, the {RQ2} parallel phase) ==", flush=True)
    current = start(str(bin_dir / "python"), "-m", "pytest", *current_parallel)
    rq2 = rq2_env.result()
    with tempfile.TemporaryFile("w+") as out:
        code = run(str(rq2 / "mypy"), stdout=out)
        older = start(str(rq2 / "python"), "-m", "pytest", *older_parallel, env=RQ2_ENV, stdout=out) if not code \
            else None
        codes = [current.wait(), code or (older.wait() if older else 1)]
        out.seek(0)
        print(f"\n== on {RQ2}: mypy, then pytest {' '.join(older_parallel)} ==\n{out.read()}", flush=True)
    if any(codes):
        return next(c for c in codes if c)
    # The serial phases side by side, one process each (two on two cores): their tests mostly wait
    # on the deadlines they assert, and each has a core; more processes beside them (the parallel
    # phases, or -n 2) made their time bounds fail.
    print(f"\n== pytest {' '.join(current_serial)} (and, beside it, the {RQ2} serial phase) ==", flush=True)
    with tempfile.TemporaryFile("w+") as out:
        older = start(str(rq2 / "python"), "-m", "pytest", *older_serial, env=RQ2_ENV, stdout=out)
        codes = [run(str(bin_dir / "python"), "-m", "pytest", *current_serial), older.wait()]
        out.seek(0)
        print(f"\n== pytest {' '.join(older_serial)} (on {RQ2}) ==\n{out.read()}", flush=True)
    return next((c for c in codes if c), 0)


def phases(mark: str | None = None, processes: int | None = None) -> list[list[str]]:
    """The suite's two pytest runs: every test not marked ``serial`` in ``PARALLEL`` processes (each
    test file in one), then the ``serial`` ones alone (they assert a time bound or measure, so a
    neighbour's load must not weigh on them). Together they run every test once (``mark``: every
    test with that mark). Each prints its ``SLOWEST`` tests."""
    only = f"{mark} and " if mark else ""
    slowest = f"--durations={SLOWEST}"
    return [["-n", str(processes or PARALLEL), "--dist", "loadfile", "-m", f"{only}not serial", slowest],
            ["-m", f"{only}serial", slowest]]


PARALLEL = 3  # pytest-xdist processes of the parallel phase: 2 cores, and the tests wait on servers and workers
PARALLEL_RQ2 = 2  # the RQ 2.12 parallel phase's, beside the current RQ's


MUTATIONS = ROOT / "tests" / "mutations.toml"
MUTATION_TIMEOUT = 1800  # seconds one break's test run may take before it counts as hung
BREAK_FIELDS = {"id", "promise", "file", "old", "new", "tests"}
BREAK_OPTIONAL = {"expect"}  # a regular expression the failed assertion's text must match
VERDICT_PLUGIN = "tests.mutation_verdict"  # tells how each test failed (tests/mutation_verdict.py)
REPORT_ENV = "SESSIONFORK_MUTATION_REPORT"
# Loads every Lua script of the broken copy (and the enqueue Function library) into a throwaway
# server: a break whose Lua does not compile is refused, never scored (a NoScriptError is no catch).
LUA_CHECK = """
from sessionfork.core import lua
from sessionfork.embedded import EmbeddedServer
from sessionfork.ops import bundles
from sessionfork.protocol import enqueue
from sessionfork.worker import outcomes
with EmbeddedServer() as server, server.client() as redis:
    for spec in [*lua.SCRIPTS.values(), *outcomes.SCRIPTS.values(), enqueue.SPEC, enqueue.OUTCOME_SPEC,
                 *bundles.SCRIPTS.values()]:
        redis.script_load(lua.source(f"{spec.name}.lua", spec.package))
    enqueue.load_library(redis)
"""


def load_mutations(path: Path = MUTATIONS) -> list[dict[str, object]]:
    """The breaks of ``path``, each checked: its fields, its old text found exactly once, its
    ``expect`` (optional) a valid regular expression."""
    breaks = tomllib.loads(path.read_text())["break"]
    problems = []
    for b in breaks:
        missing = BREAK_FIELDS - set(b)
        unknown = set(b) - BREAK_FIELDS - BREAK_OPTIONAL
        if missing or unknown:
            problems.append(f"{b.get('id', '?')}: missing {sorted(missing)}, unknown {sorted(unknown)}")
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
        try:
            re.compile(str(b.get("expect", "")))
        except re.error as exc:
            problems.append(f"{b['id']}: expect is not a regular expression ({exc})")
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


@dataclass(frozen=True)
class BreakRun:
    """One pytest run of a break's tests: its exit status (None: hung), the failures the verdict
    plugin wrote (``nodeid``, ``when``, ``assertion``, ``text``), its seconds and its last lines."""

    status: int | None
    failures: list[dict[str, Any]]
    seconds: float
    tail: str
    refused: bool = False  # the break was not run: its Lua does not load, or the copy is not what is imported


def verdict(run: BreakRun, expect: str | None = None) -> str:
    """A break's verdict from its tests' run: ``caught`` only when a test failed an assertion (and,
    with ``expect``, one whose text matches it); ``missed`` when every test passed; ``hung``; else
    ``not caught (...)``: the tests failed, but only by errors, time-outs or set-up failures;
    ``refused``: the break could not be run."""
    if run.refused:
        return "refused"
    if run.status is None:
        return "hung"
    asserted = [f for f in run.failures if f["assertion"]]
    if expect is not None:
        matching = [f for f in asserted if re.search(expect, f["text"])]
        if asserted and not matching:
            return "not caught (no failed assertion matches expect)"
        asserted = matching
    if asserted:
        return "caught"
    if run.status == 0 and not run.failures:
        return "missed"
    kinds = sorted({f["when"] if f["when"] != "call" else "error" for f in run.failures}) or [f"exit {run.status}"]
    return f"not caught (no failed assertion: {', '.join(kinds)})"


def _in_copy(py: str, b: dict[str, object] | None, tests: list[str]) -> BreakRun:
    """Apply ``b`` (None: no break) to a fresh copy of the tree and run ``tests`` there.

    The copy's ``src`` comes first on ``PYTHONPATH``, so that the tests and every worker process
    they start import the copy, never this tree (checked before the tests run). A break of a Lua
    script that does not load is refused (status 2, the error as its tail) before any test runs.
    """
    with tempfile.TemporaryDirectory(prefix="sessionfork-mutant-") as tmp:
        copy = Path(tmp)
        _copy_tree(copy)
        if b is not None:
            target = copy / str(b["file"])
            target.write_text(target.read_text().replace(str(b["old"]), str(b["new"]), 1))
        report = copy / "verdicts.jsonl"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(copy / "src"), str(copy)]),
               "PYTHONDONTWRITEBYTECODE": "1", REPORT_ENV: str(report)}
        imported = subprocess.run([py, "-c", "import sessionfork; print(sessionfork.__file__)"], cwd=copy, env=env,
                                  capture_output=True, text=True)
        where = imported.stdout.strip()  # a break that makes the package fail to import is left to its tests
        if imported.returncode == 0 and not where.startswith((str(copy.resolve()), str(copy))):
            return BreakRun(2, [], 0.0, f"the copy is not what gets imported: {where}", refused=True)
        if b is not None and str(b["file"]).endswith(".lua"):
            loaded = subprocess.run([py, "-c", LUA_CHECK], cwd=copy, env=env, capture_output=True, text=True)
            if loaded.returncode:
                return BreakRun(2, [], 0.0, "the broken Lua does not load: "
                                + (loaded.stderr.strip().splitlines() or ["?"])[-1], refused=True)
        began = time.monotonic()
        try:
            out = subprocess.run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", VERDICT_PLUGIN, *tests],
                                 cwd=copy, env=env, capture_output=True, text=True, timeout=MUTATION_TIMEOUT)
        except subprocess.TimeoutExpired:
            return BreakRun(None, [], time.monotonic() - began, "")
        took = time.monotonic() - began
        failures = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
        lines = (out.stdout + out.stderr).strip().splitlines()
        why = [f["text"].splitlines()[0] for f in failures if f["assertion"]][:1] or [
            line for line in lines if line.startswith("E ")][:1]
        return BreakRun(out.returncode, failures, took, "\n".join(why + lines[-2:]))


def _score(py: str, b: dict[str, object], unbroken: Callable[[tuple[str, ...]], BreakRun]) -> tuple[str, float, str]:
    """``b``'s (verdict, seconds, output tail): its tests first on the unbroken copy (red there: the
    break is not scored), then on the broken one."""
    tests = tuple(str(t) for t in b["tests"])  # type: ignore[attr-defined]
    clean = unbroken(tests)
    if verdict(clean) != "missed":
        return "unscored (its tests fail unbroken)", clean.seconds, clean.tail
    broken = _in_copy(py, b, list(tests))
    return verdict(broken, str(b["expect"]) if "expect" in b else None), broken.seconds, broken.tail


def mutations(bin_dir: Path, rest: list[str]) -> int:
    """Run the deliberate breaks (all, or the ids in ``rest``); 1 when any was not caught."""
    jobs = 1
    if "-j" in rest:
        at = rest.index("-j")
        jobs = int(rest[at + 1])
        rest = rest[:at] + rest[at + 2:]
    path = MUTATIONS
    if "--file" in rest:  # another list of breaks (a trial of new ones)
        at = rest.index("--file")
        path = Path(rest[at + 1])
        rest = rest[:at] + rest[at + 2:]
    baseline = "--baseline" in rest
    wanted = [r for r in rest if r != "--baseline"]
    try:
        breaks = load_mutations(path)
    except (ValueError, KeyError, tomllib.TOMLDecodeError) as exc:
        print(f"{path} is broken:\n{exc}")
        return 1
    unknown = set(wanted) - {str(b["id"]) for b in breaks}
    if unknown:
        print(f"no such break: {', '.join(sorted(unknown))}")
        return 2
    chosen = [b for b in breaks if not wanted or b["id"] in wanted]
    py = str(bin_dir / "python")
    if baseline:
        whole = _in_copy(py, None, ["tests"])
        print(f"baseline (no break, whole suite): {'green' if verdict(whole) == 'missed' else 'red'} "
              f"({whole.seconds:.0f}s)")
        if verdict(whole) != "missed":
            print(whole.tail)
            return 1
    clean: dict[tuple[str, ...], Future[BreakRun]] = {}  # each test set's unbroken run, once
    lock = threading.Lock()

    def unbroken(tests: tuple[str, ...]) -> BreakRun:
        with lock:
            if tests not in clean:
                clean[tests] = Future()
                mine = True
            else:
                mine = False
        if mine:
            clean[tests].set_result(_in_copy(py, None, list(tests)))
        return clean[tests].result()

    print(f"{len(chosen)} break(s), {jobs} at a time; each on a fresh copy of the tree, its tests run unbroken "
          "first; caught = a test failed an assertion", flush=True)
    counts: dict[str, int] = {}
    with ThreadPoolExecutor(jobs) as pool:
        for b, (said, took, tail) in zip(chosen, pool.map(lambda b: _score(py, b, unbroken), chosen), strict=True):
            print(f"{said:>8}  {b['id']}  ({took:.0f}s)  {b['promise']}", flush=True)
            counts[said.split(" (")[0]] = counts.get(said.split(" (")[0], 0) + 1
            print("          " + tail.replace("\n", "\n          "))
    caught = counts.get("caught", 0)
    print(f"{caught} of {len(chosen)} caught" + "".join(
        f", {n} {kind}" for kind, n in sorted(counts.items()) if kind != "caught"))
    return 0 if caught == len(chosen) else 1


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"demo", "test", "bench", "worker", "mutations"}:
        print(__doc__)
        return 2
    task, rest = argv[0], argv[1:]
    if task in {"test", "mutations"}:  # a break's tests may include the browser's or Prometheus's
        problem = ensure_system_packages()
        if problem:
            print(problem, file=sys.stderr)
            return 1
    bin_dir = ensure_env(extras=DEMO_EXTRAS) if task in {"demo", "worker"} else ensure_env()
    py = str(bin_dir / "python")
    if task == "mutations":
        return mutations(bin_dir, rest)
    if task in {"demo", "worker"}:
        return run(py, "-m", "sessionfork", task, *rest)
    if task == "bench":
        publish = "--publish" in rest
        rest = [arg for arg in rest if arg != "--publish"]
        code = run(py, "-m", "bench.main", *rest)
        if code or "--help" in rest or "-h" in rest:
            return code
        print(f"\n== the RQ-dependent figures again on {RQ2} ==", flush=True)
        rq2 = ensure_env(".venv-rq2", RQ2)
        quick = ["--quick"] if "--quick" in rest else []
        code = run(str(rq2 / "python"), "-m", "bench.main", "--queue-only", *quick, "--out", "bench-results/rq2")
        if code:
            return code
        print("\n== LangGraph's checkpointers ==", flush=True)
        code = run(py, "-m", "bench.langgraph", *quick)
        if code or not publish:
            return code
        return run(py, "-m", "bench.publish", "--results", "bench-results")
    return test(bin_dir, rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
