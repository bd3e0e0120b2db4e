"""The console browser tests' fixtures: a server of the module's own with the ACL users, a live
worker under ``sf-worker``, the console (the CLI command, an OS process) under ``sf-console`` (the
least-privileged user it needs), and Playwright driving Debian's chromium (never ``playwright
install``). The fixtures, which tests/console/conftest.py imports: ``deployment`` and ``browser``
(module-scoped), ``page`` (one per test).

Set ``CONSOLE_SCREENSHOTS`` to a folder to write each page's screenshot there (the docs' pictures:
``CONSOLE_SCREENSHOTS=docs/images .venv/bin/python -m pytest tests/console/``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from browser import chromium
from helpers import SETTINGS, apply_acl, clean_environ, cli_args, make_client, stop, turn, wait_registered, worker_name
from playwright.sync_api import Browser, Page, sync_playwright
from redis import Redis
from waits import wait_until

from sessionfork.clients.client import Client
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkResult
from sessionfork.embedded import EmbeddedServer
from sessionfork.ops import acl

TOKEN = "console-token-for-tests"
PASSWORDS = {acl.SCHEDULER: "scheduler-secret", acl.WORKER: "worker-secret", acl.HOST: "host-secret",
             acl.PERSIST: "persist-secret", acl.CONSOLE: "console-secret"}
HOSTILE = "<img src=x onerror=window.__pwned=1>"
SHOTS = os.environ.get("CONSOLE_SCREENSHOTS")


@dataclass(frozen=True)
class Deployment:
    server: EmbeddedServer
    admin: Redis
    client: Client
    registry: Registry
    worker: str
    url: str


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def user_url(server: EmbeddedServer, user: str) -> str:
    return f"redis://{user}:{PASSWORDS[user]}@127.0.0.1:{server.port}/0"


def answer(url: str, data: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """The status and body of a GET (or a POST of ``data``) to the console, redirects not followed."""

    class Stay(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    method = "POST" if data is not None else "GET"
    request = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    try:
        with urllib.request.build_opener(Stay).open(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def up(url: str) -> bool:
    try:
        return answer(f"{url}/healthz")[0] == 200
    except urllib.error.URLError:
        return False


@pytest.fixture(scope="module", name="deployment")
def deployment_fixture() -> Iterator[Deployment]:
    with EmbeddedServer() as server:
        admin = server.client()
        apply_acl(admin, SETTINGS, PASSWORDS)
        name = worker_name("console")
        worker = subprocess.Popen(cli_args(user_url(server, acl.WORKER), "worker", "--name", name,
                                           "--log-level", "WARNING"), env=clean_environ(), stdin=subprocess.DEVNULL)
        port = free_port()
        console = subprocess.Popen(cli_args(user_url(server, acl.CONSOLE), "console", "--port", str(port)),
                                   env=clean_environ(SESSIONFORK_CONSOLE_TOKEN=TOKEN), stdin=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_registered(admin, name)
            wait_until(lambda: console.poll() is not None or up(url), 30, "the console to answer")
            assert console.poll() is None, "the console exited"
            registry = Registry(admin)
            registry.append(registry.create("root", cwd="/work"), turn(1))
            yield Deployment(server, admin, make_client(admin), registry, name, url)
        finally:
            assert stop(console) == 0
            assert stop(worker) == 0
            admin.close()


@pytest.fixture(scope="module", name="browser")
def browser_fixture() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium(), args=["--no-sandbox", "--disable-gpu"])
        yield launched
        launched.close()


@pytest.fixture(name="page")
def page_fixture(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(10_000)
    yield page
    context.close()


def shot(page: Page, name: str) -> None:
    if SHOTS:
        page.screenshot(path=str(Path(SHOTS) / f"console-{name}.png"), full_page=True)


def fork(deployment: Deployment, source: str, child: str) -> ForkResult:
    reply = deployment.client.fork(source, session_id=child, timeout=10)
    assert isinstance(reply, ForkResult), reply
    return reply


