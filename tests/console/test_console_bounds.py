"""The console without a browser: read-only without a token, an action's body read only after its
token and only so far, a Redis outage an error banner (status 503) within its bound (a live view
open or not), never a traceback, and open live views that leave the pages and ``/healthz`` prompt.
The app runs in-process (uvicorn in a thread); a live view is a raw socket reading ``/events``."""

from __future__ import annotations

import json
import signal
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

from sessionfork.console import Console, create_app, reads
from sessionfork.core import connections, keys, wire
from sessionfork.core.config import Settings
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkFailure, ForkResult, Header
from sessionfork.embedded import EmbeddedServer
from sessionfork.ops import pauses
from sessionfork.protocol.outcomes import STREAM_FIELDS

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


class LiveView:
    """An open ``GET /events`` (a raw socket): its status, then its server-sent events by name."""

    def __init__(self, url: str, path: str = "/events") -> None:
        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n\r\n".encode())
        self.buffer = b""

    def status(self) -> int:
        """The response's status (its headers read)."""
        head = self._until(b"\r\n\r\n", 10, "the live view's headers")
        return int(head.split(b" ", 2)[1])

    def wait_event(self, name: str, timeout: float) -> str:
        """The data of the next event called ``name`` (others skipped); fail the test at the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            block = self._until(b"\n\n", deadline - time.monotonic(), f"event {name!r} on the live view")
            lines = dict(line.split(": ", 1) for line in block.decode().splitlines() if ": " in line)
            if lines.get("event") == name:
                return lines.get("data", "")

    def _until(self, end: bytes, timeout: float, what: str) -> bytes:
        deadline = time.monotonic() + timeout
        while end not in self.buffer:
            left = deadline - time.monotonic()
            assert left > 0, f"no {what} within {timeout:.1f}s"
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                continue  # the loop's deadline check fails the test
            assert chunk, f"the console closed the connection before {what}"
            self.buffer += chunk
        block, self.buffer = self.buffer.split(end, 1)
        return block

    def close(self) -> None:
        self.sock.close()


def timed_fetch(url: str) -> tuple[int, float]:
    """A GET's status and how long its answer took (seconds)."""
    started = time.monotonic()
    status, _ = fetch(url)
    return status, time.monotonic() - started


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


def raw_post(url: str, head: str, body: bytes, timeout: float = 5.0) -> tuple[int, str]:
    """Send a POST's ``head`` (request line and headers) and ``body``, however little of the body
    that declares; the status and text of the answer. No answer within ``timeout`` fails the test
    (the console is waiting for the rest of the body)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(head.encode() + b"\r\n" + body)
        answer = b""
        deadline = time.monotonic() + timeout
        while not _whole(answer):
            left = deadline - time.monotonic()
            assert left > 0, f"no answer within {timeout}s: the console waits for the body ({answer[:80]!r})"
            sock.settimeout(left)
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue  # the loop's deadline check fails the test
            assert chunk, f"the console closed the connection without a whole answer ({answer[:80]!r})"
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split(b" ")[1]), rest.decode("utf-8", "replace")


def _whole(answer: bytes) -> bool:
    head, found, body = answer.partition(b"\r\n\r\n")
    if not found:
        return False
    lengths = [line.split(b":", 1)[1] for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")]
    return len(body) >= (int(lengths[0]) if lengths else 0)


BIG = 300 * 1024 * 1024


def _head(path: str, *headers: str) -> str:
    return "\r\n".join([f"POST {path} HTTP/1.1", "Host: console",
                         "Content-Type: application/x-www-form-urlencoded", *headers]) + "\r\n"


@pytest.mark.parametrize(("token", "headers", "status", "reason"), [
    (None, (), 403, "actions are disabled: no console token is set"),
    ("t", ("Authorization: Bearer wrong",), 403, "a valid console token is needed"),
    ("t", (), 413, "an action&#39;s form is at most 16 KiB"),
], ids=["no-token-set", "wrong-bearer", "form-too-long"])
def test_a_big_action_body_is_refused_before_it_is_read(redis: Redis, token: str | None, headers: tuple[str, ...],
                                                        status: int, reason: str) -> None:
    # 300 MB declared, 1 KiB sent: an answer at all proves the rest was never waited for.
    console = Console(shards=[redis], registry=Registry(redis), settings=Settings(), token=token)
    with serving(console) as url:
        answered = raw_post(url, _head("/shards/0/pause", f"Content-Length: {BIG}", *headers), b"token=t&" * 128)

    assert answered[0] == status
    assert reason in answered[1]
    assert not pauses.is_paused(redis)


def test_a_chunked_action_body_is_refused_once_it_is_longer_than_a_form(redis: Redis) -> None:
    # No declared length: the console reads up to its bound, then answers, the body unfinished.
    console = Console(shards=[redis], registry=Registry(redis), settings=Settings(), token="t")
    chunk = b"x" * 65536
    body = b"".join(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" for _ in range(16))  # 1 MiB, no last chunk
    with serving(console) as url:
        answered = raw_post(url, _head("/shards/0/pause", "Transfer-Encoding: chunked"), body)

    assert answered[0] == 413
    assert not pauses.is_paused(redis)


def test_an_action_with_its_token_in_the_form_is_done(redis: Redis) -> None:
    console = Console(shards=[redis], registry=Registry(redis), settings=Settings(), token="t")
    with serving(console) as url:
        status, _ = raw_post(url, _head("/shards/0/pause", "Content-Length: 20"), b"token=t&reason=tests")

    assert status == 303
    assert pauses.is_paused(redis)
    assert pauses.audit(redis, 1, shard=0)[0].detail == "tests"


@pytest.mark.serial  # asserts a time bound
def test_with_a_live_view_open_a_hung_redis_is_an_error_banner_within_the_bound() -> None:
    with EmbeddedServer() as server:
        assert server.process is not None
        settings = Settings(socket_timeout=BOUND, connect_timeout=BOUND)
        redis = connections.queue_client(settings, server.url)
        console = Console(shards=[redis], registry=Registry(redis), settings=settings, token="t", bound=BOUND)
        with serving(console) as url:
            view = LiveView(url)
            assert view.status() == 200
            view.wait_event("ready", 5)
            server.process.send_signal(signal.SIGSTOP)  # hung: accepts connections, never answers
            try:
                fault = view.wait_event("fault", 4 * BOUND + 2)
                answers = {path: timed_fetch(url + path) for path in ("/", "/search?q=a", "/workers", "/healthz")}
            finally:
                server.process.send_signal(signal.SIGCONT)
            view.wait_event("restored", 4 * BOUND + 2)  # and the view carries on
            view.close()

    assert "Redis unreachable or failing" in fault
    assert {path: status for path, (status, _) in answers.items()} == {"/": 503, "/search?q=a": 503,
                                                                        "/workers": 503, "/healthz": 200}
    slowest = max(took for path, (_, took) in answers.items() if path != "/healthz")
    assert slowest < 2 * BOUND + 1, answers
    assert answers["/healthz"][1] < 0.5, answers


@pytest.mark.serial  # asserts a time bound
def test_hundreds_of_open_live_views_leave_healthz_and_the_pages_prompt(redis: Redis) -> None:
    console = Console(shards=[redis], registry=Registry(redis), settings=Settings(), token=None)
    with serving(console) as url:
        views = [LiveView(url) for _ in range(400)]  # no token needed: the views are read-only
        try:
            statuses = sorted(view.status() for view in views)
            answers = {path: timed_fetch(url + path) for path in ("/healthz", "/", "/workers", "/search?q=a")}
        finally:
            for view in views:
                view.close()

    assert {path: status for path, (status, _) in answers.items()} == {"/healthz": 200, "/": 200, "/workers": 200,
                                                                        "/search?q=a": 404}
    assert answers["/healthz"][1] < 0.5, answers  # the compose healthcheck allows 3 s
    assert max(took for _, took in answers.values()) < 1.0, answers
    assert statuses == [200] * 100 + [503] * 300  # at most 100 open at once


@pytest.mark.parametrize("index", ["1", "7", "-1", "x"])
def test_an_action_on_a_shard_past_the_last_is_not_found(redis: Redis, index: str) -> None:
    console = Console(shards=[redis], registry=Registry(redis), settings=Settings(), token="t")
    with serving(console) as url:
        status, body = fetch(f"{url}/shards/{index}/pause", b"token=t")

    assert status == 404
    assert "no such shard or action" in body
    assert not pauses.is_paused(redis)


def _outcomes(redis: Redis, count: int, now_ms: int, span_ms: int) -> None:
    """``count`` outcome entries as the worker writes them, evenly over the ``span_ms`` before
    ``now_ms``: every tenth a ``SESSION_NOT_FOUND``, the others a fork's ``OK``."""
    ok = wire.encode(ForkResult(request_id="r", session=Header(version=0, id="c", created_at=1, parent_session="root",
                                                                   seed_length=4)))
    failed = wire.encode(ForkFailure(request_id="r", code="SESSION_NOT_FOUND", message='session "x" not found'))
    pipe = redis.pipeline(transaction=False)
    for i in range(count):
        bad = i % 10 == 0
        pipe.xadd(keys.OUTCOME_STREAM, dict(zip(STREAM_FIELDS, (f"req-{i}", "SESSION_NOT_FOUND" if bad else "OK",
                                                                   "900", "2000", failed if bad else ok), strict=True)),
                  id=f"{now_ms - span_ms + i * span_ms // count}-0")
        if i % 5000 == 4999:
            pipe.execute()
    pipe.execute()


@pytest.mark.serial  # asserts a time bound
def test_a_window_of_a_hundred_thousand_outcomes_is_a_page_within_the_bound(redis: Redis) -> None:
    now_ms = int(time.time() * 1000)
    _outcomes(redis, 100_000, now_ms, 3_500_000)
    console = Console(shards=[redis], registry=Registry(redis), settings=Settings(), token=None, bound=BOUND)
    with serving(console) as url:
        started = time.monotonic()
        status, body = fetch(f"{url}/?window=3600")
        took = time.monotonic() - started
        op_status, _ = fetch(f"{url}/?window=3600&op=fork")

    assert (status, op_status) == (200, 200)
    assert took < BOUND, took
    assert f'<strong id="total">{reads.WINDOW_MOST}</strong>' in body
    assert "each shard's newest 20,000, since" in body
    assert '<tr data-request="req-99999">' in body  # the newest first


def test_a_live_view_told_ready_gets_every_outcome_stored_after(redis: Redis) -> None:
    console = Console(shards=[redis], registry=Registry(redis), settings=Settings(), token=None)
    with serving(console) as url:
        views = [LiveView(url), LiveView(url, "/events?code=SESSION_NOT_FOUND")]
        for view in views:
            assert view.status() == 200
            view.wait_event("ready", 5)
        _outcomes(redis, 10, int(time.time() * 1000), 10)  # straight after: req-0 fails, the rest are OK
        first = [json.loads(views[0].wait_event("outcome", 5))["requestId"] for _ in range(10)]
        kept = json.loads(views[1].wait_event("outcome", 5))
        for view in views:
            view.close()

    assert first == [f"req-{i}" for i in range(10)]  # each view its filter's, in order
    assert (kept["requestId"], kept["code"]) == ("req-0", "SESSION_NOT_FOUND")
