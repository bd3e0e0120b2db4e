"""The TypeScript client (``typescript/``, the npm package ``sessionfork``): its own tests, run with
Node's test runner (``npm ci``, then ``npm test``: the build, then ``node --test``) against a server
of this module's own (the ACL users of ``sessionfork acl`` applied and the enqueue library loaded, as
an operator would) and a real worker; they fail this test when they fail. The build copies the Python
package's shipped enqueue and outcome scripts into the package (one source): pinned equal here."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import SETTINGS, apply_acl, clean_environ, cli_args, start_worker, stop, wait_registered, worker_name

from sessionfork import NewEvent, Registry
from sessionfork.embedded import EmbeddedServer
from sessionfork.ops import acl
from sessionfork.protocol.enqueue import OUTCOME_SOURCE, SOURCE, VERSIONED

PACKAGE = Path(__file__).resolve().parents[2] / "typescript"
NPM_TIMEOUT = 600


def npm(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    found = shutil.which("npm")
    assert found, "npm is not installed (python3 run.py test installs Debian's nodejs and npm)"
    return subprocess.run([found, *args], cwd=PACKAGE, capture_output=True, text=True, timeout=NPM_TIMEOUT,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def installed() -> Path:
    """The package with its locked dependencies (``npm ci``) and built (``npm run build``)."""
    for step in (("ci", "--no-audit", "--no-fund"), ("run", "build")):
        done = npm(*step)
        assert done.returncode == 0, (step, done.stdout[-4000:], done.stderr[-4000:])
    return PACKAGE


SCHEDULER_PASSWORD = "ts-scheduler-secret"


@pytest.fixture(scope="module")
def stack() -> Iterator[EmbeddedServer]:
    """A server with sessionfork's ACL users and the enqueue library loaded, and a registered worker."""
    passwords = {user: f"{user}-secret" for user in acl.USERS} | {acl.SCHEDULER: SCHEDULER_PASSWORD}
    with EmbeddedServer() as srv:
        with srv.client() as admin:
            apply_acl(admin, SETTINGS, passwords)
        subprocess.run(cli_args(srv.url, "load-functions"), env=clean_environ(), check=True, timeout=60,
                       capture_output=True)
        name = worker_name("ts")
        worker = start_worker(srv.url, name)
        try:
            with srv.client() as probe:
                wait_registered(probe, name)
            yield srv
        finally:
            assert stop(worker) == 0


def test_the_build_ships_the_python_packages_scripts_unchanged(installed: Path) -> None:
    assert (installed / "dist" / "lua" / "enqueue.lua").read_text() == SOURCE
    assert (installed / "dist" / "lua" / "outcome.lua").read_text() == OUTCOME_SOURCE
    probe = "import('./dist/index.js').then((m) => console.log(m.VERSIONED))"
    out = subprocess.run(["node", "--input-type=module", "-e", probe], cwd=installed, capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.strip() == VERSIONED, out.stderr


@pytest.mark.serial  # the Node tests assert time bounds (a wait's deadline, a frozen server's)
def test_the_typescript_clients_tests_pass_against_a_real_worker(installed: Path, stack: EmbeddedServer) -> None:
    with stack.client() as redis:
        registry = Registry(redis)
        source = registry.create()
        registry.append(source, [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})])
    scheduler = f"redis://{acl.SCHEDULER}:{SCHEDULER_PASSWORD}@127.0.0.1:{stack.port}/0"
    done = npm("test", env={"REDIS_URL": stack.url, "SF_SCHEDULER_URL": scheduler, "SF_SOURCE": source.id})
    report = done.stdout[-6000:] + done.stderr[-3000:]
    assert done.returncode == 0, report
    assert "# fail 0" in done.stdout and "# pass 0" not in done.stdout, report
