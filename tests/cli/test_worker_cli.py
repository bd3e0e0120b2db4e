"""The command line against real workers and servers: ``fork`` prints the reply JSON (exit 0 or 1),
``health`` reports the workers, an unreachable server is one error line, ``demo`` runs through."""

from __future__ import annotations

import json
import subprocess

import pytest
from helpers import clean_environ, cli_args, start_worker, stop, turn, wait_registered, worker_name

from sessionfork.clients.client import Client
from sessionfork.core.registry import Registry
from sessionfork.embedded import EmbeddedServer

pytestmark = pytest.mark.rq  # runs again on RQ 2.12 (run.py test)


def run_cli(*args: str, url: str | None, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_args(url, *args), env=clean_environ(), capture_output=True, text=True,
                          timeout=timeout, check=False)


# -- command line ---------------------------------------------------------------------------------


def test_cli_fork_prints_the_reply_json_and_exits_0(server: EmbeddedServer, registry: Registry,
                                                     client: Client, source: str) -> None:
    done = run_cli("fork", source, "--session-id", "x", "--wait", "10", url=server.url)

    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert (body["type"], body["ok"], body["session"]["id"], body["session"]["parentSession"]) \
        == ("fork/result", True, "x", "a")
    assert registry.header("x").parent_session == "a"


def test_cli_fork_exits_1_on_open_turn(server: EmbeddedServer, registry: Registry, client: Client) -> None:
    registry.append(registry.create("o"), turn(1)[:1])

    done = run_cli("fork", "o", "--session-id", "x", "--wait", "10", url=server.url)

    assert done.returncode == 1
    body = json.loads(done.stdout)
    assert (body["type"], body["code"]) == ("fork/error", "OPEN_TURN")
    assert not registry.exists("x")


def test_cli_health_exits_0_while_a_worker_runs() -> None:
    with EmbeddedServer() as own:
        name = worker_name("health")
        proc = start_worker(own.url, name)
        try:
            probe = own.client()
            try:
                wait_registered(probe, name)
            finally:
                probe.close()

            done = run_cli("health", url=own.url)
        finally:
            code = stop(proc)

    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok: 1 worker(s):") and name in done.stdout
    assert code == 0


def test_cli_health_exits_1_without_a_worker() -> None:
    with EmbeddedServer() as fresh:
        done = run_cli("health", url=fresh.url)

    assert done.returncode == 1
    assert done.stderr.startswith("unhealthy:")


def test_cli_fork_with_an_unreachable_server_prints_one_error_line() -> None:
    done = run_cli("fork", "a", url="redis://127.0.0.1:1/0")

    assert done.returncode == 3  # the documented status for "Redis unreachable"
    assert "Redis unreachable" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), done.stderr
    assert done.stdout == ""


def test_demo_walks_through_every_outcome() -> None:
    done = run_cli("demo", url=None, timeout=120)

    assert done.returncode == 0, done.stderr
    for expected in ("OPEN_TURN", "SESSION_NOT_FOUND", "SESSION_NOT_LIVE", "SESSION_ALREADY_EXISTS",
                     "INVALID_REQUEST", "idempotent retry", "└──", "INVALID_BOUNDARY",
                     "at its last completed turn (boundary) -> ok", "edit and retry", "8:turn/start, 9:user/message",
                     "(ifLength) -> PRECONDITION_FAILED", "variants: one snapshot, a different next prompt each -> ok",
                     "summary fork: events 0-3 replaced by one summary, the last turn kept -> ok",
                     "0:session/summary, 1:turn/start"):
        assert expected in done.stdout, expected
    assert "Traceback" not in done.stdout + done.stderr


def test_the_demo_names_its_requests_and_its_sessions_apart() -> None:
    """No string is both a request id and a session id of the walkthrough, and its stale handle's
    refusal says what is stale."""
    done = run_cli("demo", url=None, timeout=120)
    assert done.returncode == 0, done.stderr
    replies = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    request_ids = {r["requestId"] for r in replies}
    session_ids = {s["id"] for r in replies for s in [r.get("session"), *r.get("sessions", [])] if s}
    session_ids |= {line.split()[-1] for line in done.stdout.splitlines() if "── " in line}  # the lineage tree
    assert len(request_ids) == len(replies) and session_ids, done.stdout
    assert request_ids & session_ids == set()
    stale = next(r for r in replies if r.get("code") == "SESSION_NOT_LIVE")
    assert stale["message"].endswith("is stale: its instance is not the live one"), stale
