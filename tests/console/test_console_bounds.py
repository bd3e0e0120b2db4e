"""The console without a browser: read-only without a token, and a Redis outage is an error banner
(status 503) within its bound, never a traceback. The app runs in-process (uvicorn in a thread)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import uvicorn
import yaml
from redis import Redis

from sessionfork.console import Console, create_app
from sessionfork.core import connections
from sessionfork.core.config import Settings
from sessionfork.core.registry import Registry
from sessionfork.embedded import EmbeddedServer
from sessionfork.ops import pauses

BOUND = 1.0


@contextmanager
def serving(console: Console) -> Iterator[str]:
    """The console app on a free port, in a thread of this process; its base URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(console), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the console did not start"
        time.sleep(0.01)  # polling the server's own started flag, with a deadline
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def fetch(url: str, data: bytes | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def read_only(redis: Redis) -> Iterator[str]:
    with serving(Console(shards=[redis], registry=Registry(redis), settings=Settings(), token=None)) as url:
        yield url


def test_without_a_token_the_console_is_read_only(read_only: str, redis: Redis) -> None:
    status, body = fetch(f"{read_only}/shards/0/pause", b"token=")

    assert status == 403
    assert "actions are disabled: no console token is set" in body
    assert not pauses.is_paused(redis)
    assert "read-only" in fetch(f"{read_only}/workers")[1]


def test_every_page_is_sent_with_a_policy_that_runs_no_inline_script(read_only: str) -> None:
    with urllib.request.urlopen(f"{read_only}/", timeout=10) as response:
        policy = response.headers.get("Content-Security-Policy") or ""

    assert "script-src 'self'" in policy and "unsafe-inline" not in policy


@pytest.mark.serial  # asserts a time bound
@pytest.mark.parametrize("path", ["/", "/search?q=a", "/workers"])
def test_a_redis_outage_is_an_error_banner_within_the_bound(frozen: EmbeddedServer, path: str) -> None:
    # A frozen server (accepts connections, never answers): every read waits out its time-out.
    settings = Settings(socket_timeout=BOUND, connect_timeout=BOUND)
    redis = connections.queue_client(settings, frozen.url)  # as the console command makes them
    console = Console(shards=[redis], registry=Registry(redis), settings=settings, token="t", bound=BOUND)
    with serving(console) as url:
        started = time.monotonic()
        status, body = fetch(url + path)
        took = time.monotonic() - started

    assert status == 503
    assert "Redis unreachable or failing" in body and 'role="alert"' in body
    assert "Traceback" not in body
    assert took < 4 * BOUND + 2


COMPOSE_FILES = ("docker-compose.yml", "docker-compose.sharded.yml")
ROOT = Path(__file__).resolve().parents[2]


def console_check(file: str) -> list[str]:
    """The console service's healthcheck command (``CMD`` form) in a compose file, ``python`` as this one."""
    service = yaml.safe_load((ROOT / file).read_text())["services"]["console"]
    assert service["command"][:2] == ["sessionfork", "console"]
    test: list[str] = service["healthcheck"]["test"]
    assert test[0] == "CMD"
    return [sys.executable if word == "python" else word for word in test[1:]]


@pytest.mark.serial  # asserts a time bound
def test_the_compose_consoles_check_passes_on_a_live_console_and_fails_in_time_on_a_hung_one(read_only: str) -> None:
    check = console_check(COMPOSE_FILES[0])
    assert all(console_check(file) == check for file in COMPOSE_FILES)  # one check, run once
    port = read_only.rsplit(":", 1)[1]
    live = subprocess.run([w.replace(":8080/", f":{port}/") for w in check], capture_output=True, timeout=30,
                          check=False)
    assert live.returncode == 0, live.stderr
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        hung = [w.replace(":8080/", f":{silent.getsockname()[1]}/") for w in check]
        started = time.monotonic()
        done = subprocess.run(hung, capture_output=True, timeout=30, check=False)
        assert done.returncode != 0 and time.monotonic() - started < 5  # within the check's timeout
