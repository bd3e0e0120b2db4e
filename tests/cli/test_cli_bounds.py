"""The command line under hostile input and unlucky servers: one ``error:``
line, never a traceback, the documented exit status, and every command ends within its bound.

Statuses (docs/cli.md): 1 an error code, 2 usage or settings, 3 Redis unreachable,
4 time-out. Servers are real processes the tests start; a frozen server is one stopped with
SIGSTOP (continued in teardown).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import clean_environ, cli_args, make_client
from redis import Redis
from waits import exited, wait_until

from sessionfork.core import wire
from sessionfork.core.wire import ForkResult, Header
from sessionfork.embedded import EmbeddedServer
from sessionfork.worker.outcomes import Outcomes

# The tests that assert a time bound are marked serial (run alone: see pyproject's markers); the
# usage and refusal checks assert no time, so they run in the parallel phase.

USAGE, ERROR_CODE, UNREACHABLE, NO_REPLY = 2, 1, 3, 4


def run(url: str | None, *args: str | bytes, bound: float = 60.0, **env: object) -> tuple[int, str, float]:
    """Run the CLI; returns (status, stderr, seconds). Fails the test past ``bound`` seconds."""
    began = time.monotonic()
    out = subprocess.run(cli_args(url, *args), env=clean_environ(**env), capture_output=True,  # type: ignore[arg-type]
                         timeout=bound, stdin=subprocess.DEVNULL)
    return out.returncode, out.stderr.decode(errors="replace"), time.monotonic() - began


def assert_one_error_line(stderr: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr


@pytest.mark.parametrize(("args", "env"), [
    (["fork", "src", "--wait", "nan"], {}),
    (["fork", "src", "--wait", "inf"], {}),
    (["fork", "src", "--wait", "-1"], {}),
    (["delete", "x", "--timeout", "nan"], {"SESSIONFORK_DELETE_AFTER_PERSIST": "1"}),
    (["delete", "x", "--timeout", "inf"], {"SESSIONFORK_DELETE_AFTER_PERSIST": "1"}),
    (["delete", "x", "--timeout", "-1"], {}),
    (["--redis-url", "notaurl", "health"], {}),
    (["--redis-url", "redis://127.0.0.1:99999/0", "health"], {}),
    (["--queue-url", "redis://127.0.0.1:6379/db", "health"], {}),
    (["acl", "--password", "sf-worker="], {}),
    (["acl", "--password", "nobody=x"], {}),
    (["worker", "--log-level", "bogus"], {}),
    (["worker", "--metrics-port", "70000"], {}),
    (["worker", "--metrics-port", "9100", "--metrics-address", "0.0.0.0:9100"], {}),
    (["worker"], {"SESSIONFORK_METRICS_ADDRESS": "not an address"}),
    (["persist", "--root", "/tmp/x", "--log-level", "bogus"], {}),
    (["stats", "--window", "99999999999999"], {}),
    (["health"], {"SESSIONFORK_RETRIES": "-1"}),
    (["worker"], {"SESSIONFORK_OUTCOME_STREAM_MAXLEN": "-1"}),
    (["health"], {"SESSIONFORK_SOCKET_TIMEOUT": "nan"}),
    (["health"], {"SESSIONFORK_CLUSTER": "maybe"}),
], ids=lambda v: " ".join(v) if isinstance(v, list) else ",".join(f"{k}={x}" for k, x in v.items()) or "-")
def test_bad_usage_and_settings_are_one_line_and_status_2(server: EmbeddedServer, args: list[str],
                                                            env: dict[str, str]) -> None:
    url = None if args[0].startswith("--") else server.url
    status, stderr, _ = run(url, *args, **env)
    assert status == USAGE, stderr
    assert_one_error_line(stderr)


def test_a_source_that_is_not_utf8_is_one_line_and_status_1(server: EmbeddedServer) -> None:
    status, stderr, _ = run(server.url, "fork", os.fsencode("p\udcffq"), "--wait", "1")
    assert status == ERROR_CODE, stderr
    assert_one_error_line(stderr)
    assert "INVALID_REQUEST" in stderr


def test_wait_ignores_messages_that_are_not_its_reply(redis: Redis) -> None:
    client = make_client(redis)
    request = client.request("src", session_id="child", request_id="r-noise")
    client.submit(request)
    result: list[object] = []
    waiter = threading.Thread(target=lambda: result.append(_wait(client, request)))
    waiter.start()
    try:
        wait_until(lambda: redis.pubsub_numsub(client.settings.reply_channel)[0][1] == 1, 10, "the waiter")
        for noise in (b"not json r-noise", b'{"requestId":"r-noise"}', b'["r-noise"]', b"r-noise\xff",
                      b'{"type":"fork/result","requestId":"r-noise","ok":"yes"}'):
            redis.publish(client.settings.reply_channel, noise)
        reply = ForkResult(request_id="r-noise", session=Header(version=0, id="child", created_at=1))
        Outcomes(redis, ttl=60, stream_maxlen=10).record(reply, client.settings.reply_channel,
                                                         digest=wire.digest(request))
    finally:
        waiter.join(15)
    assert result == [reply]


def _wait(client: object, request: object) -> object:
    try:
        return client.wait(request, 10)  # type: ignore[attr-defined]
    except Exception as exc:  # the test's assertion shows it
        return exc


@pytest.mark.serial
@pytest.mark.parametrize("args", [["fork", "src", "--wait", "2"], ["health"], ["stats"]])
def test_a_frozen_server_is_status_3_within_the_socket_timeout(frozen: EmbeddedServer, args: list[str]) -> None:
    status, stderr, took = run(frozen.url, *args, bound=30, SESSIONFORK_SOCKET_TIMEOUT="2",
                               SESSIONFORK_CONNECT_TIMEOUT="2")
    assert status == UNREACHABLE, stderr
    assert_one_error_line(stderr)
    assert took < 2 + 2 + 5, took  # one command's time-out and one connect, plus the interpreter's start


@pytest.mark.serial
def test_fork_wait_1_against_a_frozen_server_is_status_4_within_its_deadline(frozen: EmbeddedServer) -> None:
    """``fork --wait 1`` with a socket time-out far longer (30 s) ends within HARD_AFTER of
    its deadline (it took the socket time-out: the enqueue blocked): status 4, the client's
    ``TimeoutError``. The interpreter's start is measured by runs that touch no server, the slower
    of two (under CI's parallel phases one start may take 0.1 s more than the other)."""
    from sessionfork.protocol.requests import HARD_AFTER

    start = max(run(None, "fork", "--help")[2] for _ in range(2))
    status, stderr, took = run(frozen.url, "fork", "src", "--wait", "1", "--request-id", "r-cli-frozen", bound=60,
                               SESSIONFORK_SOCKET_TIMEOUT="30", SESSIONFORK_CONNECT_TIMEOUT="30")
    assert status == NO_REPLY, stderr
    assert stderr.strip() == ("error: no reply to request r-cli-frozen within 1.0s: the request stays queued; "
                              "wait for its reply with: sessionfork wait r-cli-frozen"), stderr
    assert took < start + 1.0 + HARD_AFTER + 0.5, (took, start)


@pytest.mark.serial
def test_a_frozen_server_is_status_3_within_the_default_bound(frozen: EmbeddedServer) -> None:
    status, stderr, took = run(frozen.url, "health", bound=60)
    assert status == UNREACHABLE, stderr
    assert took < 5 + 3 + 5, took  # SESSIONFORK_SOCKET_TIMEOUT and SESSIONFORK_CONNECT_TIMEOUT defaults


@pytest.mark.serial
def test_a_tls_url_pointed_at_a_plain_server_fails_fast(server: EmbeddedServer) -> None:
    status, stderr, took = run(f"rediss://127.0.0.1:{server.port}/0", "health", bound=30)
    assert status == UNREACHABLE, stderr
    assert_one_error_line(stderr)
    assert took < 3 + 5, took


@pytest.mark.serial
def test_a_refused_password_is_status_3_at_once_without_a_connection_storm() -> None:
    with EmbeddedServer() as srv:
        with srv.client() as setup:
            setup.config_set("requirepass", "s3cret")
        admin = srv.client(password="s3cret")
        before = int(admin.info("stats")["total_connections_received"])
        for url in (srv.url, f"redis://:wrong@127.0.0.1:{srv.port}/0"):
            status, stderr, took = run(url, "fork", "src", "--wait", "2", bound=30)
            assert status == UNREACHABLE, stderr
            assert_one_error_line(stderr)
            assert took < 5, took
        connections = int(admin.info("stats")["total_connections_received"]) - before
        assert connections <= 4, connections  # one or two per command, not one per retry
        admin.close()


def test_python_m_worker_is_the_same_cli(server: EmbeddedServer) -> None:
    """The Procfile's ``python -m worker`` entry: same settings checks, same one-line errors."""
    out = subprocess.run([sys.executable, "-m", "worker", "--log-level", "bogus"], env=clean_environ(),
                         capture_output=True, timeout=60, stdin=subprocess.DEVNULL,
                         cwd=Path(__file__).parents[2])
    assert out.returncode == USAGE, out.stderr
    assert_one_error_line(out.stderr.decode())


BOUND_ARGS = [["fork", "src", "--wait", "2"], ["wait", "r-bound", "--timeout", "2"], ["health", "--timeout", "2"]]


@pytest.mark.serial
@pytest.mark.parametrize("args", BOUND_ARGS, ids=" ".join)
def test_a_server_refusing_connections_fails_within_the_time_given(args: list[str]) -> None:
    """The retries of a refused connection stop at the time the user gave (they took
    5-8 s: ``fork --wait 2`` 7.7 s, ``health`` 7.3 s, against a compose healthcheck's 5 s). The
    interpreter's start is measured by a run that touches no server."""
    from sessionfork.embedded import free_port

    _, _, start = run(None, "--help")
    status, stderr, took = run(f"redis://127.0.0.1:{free_port()}/0", *args, bound=60)
    assert status == UNREACHABLE, stderr
    assert_one_error_line(stderr)
    assert took < start + 2 + 1.0, (took, start)


@pytest.mark.serial
@pytest.mark.parametrize("args", BOUND_ARGS[1:], ids=" ".join)
def test_a_frozen_server_fails_within_the_time_given(frozen: EmbeddedServer, args: list[str]) -> None:
    """``wait --timeout 2`` and ``health --timeout 2`` end within 2 s (and the start) against a
    server that never answers, whatever the socket time-out (5 s by default)."""
    _, _, start = run(None, "--help")
    status, stderr, took = run(frozen.url, *args, bound=60)
    assert status == UNREACHABLE, stderr
    assert_one_error_line(stderr)
    assert took < start + 2 + 1.0, (took, start)


@pytest.mark.serial
def test_health_behind_hung_sentinels_fails_within_the_time_given(frozen: EmbeddedServer) -> None:
    """A sentinel that accepts connections and never answers: each lookup waits its socket time-out
    and is retried (over 40 s before), so ``health --timeout 2`` is bounded as a whole."""
    _, _, start = run(None, "--help")
    url = f"redis+sentinel://127.0.0.1:{frozen.port},127.0.0.1:{frozen.port}/sessionfork/0"
    began = time.monotonic()
    proc = subprocess.Popen(cli_args(url, "health", "--timeout", "2"), env=clean_environ(),  # type: ignore[arg-type]
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        status = exited(proc, start + 2 + 1.0, "health --timeout 2 behind hung sentinels")
        took = time.monotonic() - began
        stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    finally:
        proc.kill()
        proc.wait()
        if proc.stderr:
            proc.stderr.close()
    assert status == UNREACHABLE, stderr
    assert_one_error_line(stderr)
    assert "within 2s" in stderr
    assert took < start + 2 + 1.0, (took, start)


def slow_start(url: str, seconds: float, *args: str) -> list[str]:
    """``sessionfork --redis-url URL ARGS...`` in a process whose start takes ``seconds`` more
    before the CLI is imported: a loaded machine's slow interpreter start, made certain."""
    code = (f"import runpy, sys, time; time.sleep({seconds}); sys.argv = ['sessionfork', *sys.argv[1:]]; "
            "runpy.run_module('sessionfork', run_name='__main__')")
    return [sys.executable, "-c", code, "--redis-url", url, *args]


@pytest.mark.serial
def test_health_answers_within_its_timeout_counted_from_its_start(frozen: EmbeddedServer) -> None:
    """``health --timeout 3`` ends 3 s after the process started, the interpreter's start counted,
    not 3 s after the start: within 3 s, or a second (``MIN_WORK``) past a start that took
    longer (the start: a run that touches no server, measured first, and the 1.5 s added)."""
    from sessionfork.cli.queue_commands import MIN_WORK

    _, _, start = run(None, "--help")
    began = time.monotonic()
    out = subprocess.run(slow_start(frozen.url, 1.5, "health", "--timeout", "3"), env=clean_environ(),
                         capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    took = time.monotonic() - began
    assert out.returncode == UNREACHABLE, out.stderr
    assert_one_error_line(out.stderr.decode())  # the cut's, or a command's time-out at the same deadline
    assert took < max(3, start + 1.5 + MIN_WORK) + 1.0, (took, start)  # 1 s: a start's spread, the exit


@pytest.mark.serial
def test_health_still_asks_the_server_when_its_start_took_the_whole_timeout(server: EmbeddedServer) -> None:
    """A start longer than ``--timeout`` leaves the Redis work a second: a reachable server
    answers (no worker: unhealthy, 1), rather than a time-out that would call it unreachable (3)."""
    out = subprocess.run(slow_start(server.url, 1.5, "health", "--timeout", "1"), env=clean_environ(),
                         capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == ERROR_CODE, out.stderr
    assert out.stderr.decode().startswith("unhealthy: no worker with a fresh heartbeat"), out.stderr
