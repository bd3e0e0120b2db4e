"""Boundary forks through the queue: the request field, both clients' ``boundary=``, the CLI's
``--boundary``, the reply of ``INVALID_BOUNDARY``, and the boundary as part of a request's identity."""

from __future__ import annotations

import json
import subprocess
import uuid

import msgspec
import pytest
from helpers import clean_environ, cli_args, queue_of, turn
from redis import Redis

from sessionfork.clients.client import Client
from sessionfork.clients.waiting import wait_for_reply
from sessionfork.core import keys, wire
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkFailure, ForkResult, NewEvent, Reply
from sessionfork.embedded import EmbeddedServer
from sessionfork.worker import jobs

TIMEOUT = 30.0
OPEN = [NewEvent("turn/start", {"turn": 9}), NewEvent("tool/call", {"id": "t1"})]


@pytest.fixture
def running(registry: Registry) -> str:
    """Session "run": two finished turns (8 events), then a turn still running (seq 8, 9)."""
    handle = registry.create("run", cwd="/w")
    registry.append(handle, [*turn(1), *turn(2), *OPEN])
    return "run"


def failure(reply: Reply) -> tuple[str, str]:
    assert isinstance(reply, ForkFailure), reply
    return reply.code, reply.message


def test_client_forks_a_running_session_at_its_last_completed_turn(
        client: Client, registry: Registry, running: str) -> None:
    reply = client.fork(running, session_id="c", boundary=registry.last_turn_end(running), timeout=TIMEOUT)
    assert isinstance(reply, ForkResult) and reply.session is not msgspec.UNSET
    assert (reply.session.id, reply.session.parent_session, reply.session.seed_length) == ("c", "run", 8)
    assert [e.seq for e in registry.events("c")] == list(range(8))
    assert registry.events("c") == registry.events("run", 0, 8)


def test_invalid_boundary_is_the_reply_and_nothing_is_created(client: Client, registry: Registry,
                                                              running: str) -> None:
    assert failure(client.fork(running, session_id="c", boundary=9, timeout=TIMEOUT)) == (
        "INVALID_BOUNDARY", 'cannot fork session "run" at boundary 9: inside the turn opened at seq 8')
    assert failure(client.fork(running, session_id="c", boundary=10, timeout=TIMEOUT)) == (
        "INVALID_BOUNDARY", 'cannot fork session "run" at boundary 10: past the end of a log of 10 events')
    assert failure(client.fork(running, session_id="c", timeout=TIMEOUT)) == (
        "OPEN_TURN", 'cannot fork session "run" inside an open turn (last event: tool/call)')
    assert not registry.exists("c")


def test_existing_child_id_is_reported_before_the_boundary(client: Client, registry: Registry,
                                                           running: str) -> None:
    registry.create("taken")
    assert failure(client.fork(running, session_id="taken", boundary=99, timeout=TIMEOUT)) == (
        "SESSION_ALREADY_EXISTS", 'session "taken" already exists')
    assert failure(client.fork("nope", session_id="taken", boundary=99, timeout=TIMEOUT)) == (
        "SESSION_NOT_FOUND", 'session "nope" not found')


def test_fan_out_at_a_boundary_gives_every_child_the_same_seed(client: Client, registry: Registry,
                                                               running: str) -> None:
    reply = client.fork(running, session_ids=["f1", "f2", "f3"], boundary=3, timeout=TIMEOUT)
    assert isinstance(reply, ForkResult) and reply.ok and reply.sessions is not msgspec.UNSET
    assert [s.seed_length for s in reply.sessions] == [4, 4, 4]
    assert registry.events("f1") == registry.events("f3") == registry.events("run", 0, 4)


def test_same_request_id_with_another_boundary_is_an_idempotency_conflict(
        client: Client, registry: Registry, running: str) -> None:
    first = client.fork(running, session_id="c", boundary=3, request_id="bnd-1", timeout=TIMEOUT)
    assert first.ok
    again = client.fork(running, session_id="c", boundary=3, request_id="bnd-1", timeout=TIMEOUT)
    assert again == first
    assert failure(client.fork(running, session_id="c", boundary=7, request_id="bnd-1", timeout=TIMEOUT)) == (
        "IDEMPOTENCY_CONFLICT", 'request id "bnd-1" was already used for a different request')
    assert failure(client.fork(running, session_id="c", request_id="bnd-1", timeout=TIMEOUT))[0] == \
        "IDEMPOTENCY_CONFLICT"
    assert registry.header("c").seed_length == 4


@pytest.mark.parametrize("value", ["true", "1.5", '"7"', '"lastTurn"', "null"])
def test_a_boundary_that_is_not_an_integer_is_invalid_request(redis: Redis, client: Client, registry: Registry,
                                                              running: str, value: str) -> None:
    rid = f"raw-{uuid.uuid4().hex}"
    payload = f'{{"requestId": "{rid}", "source": "run", "sessionId": "c", "boundary": {value}}}'.encode()
    assert jobs.enqueue(queue_of(client), payload, rid, client.settings)
    reply = wait_for_reply(redis, rid, keys.DEFAULT_REPLY_CHANNEL, TIMEOUT)
    assert reply is not None
    code, message = failure(reply)
    assert code == "INVALID_REQUEST" and "boundary" in message
    assert not registry.exists("c")


def test_cli_fork_with_boundary(server: EmbeddedServer, client: Client, registry: Registry, running: str) -> None:
    done = subprocess.run(cli_args(server.url, "fork", running, "--session-id", "c", "--boundary", "3",
                                   "--wait", str(TIMEOUT)),
                          env=clean_environ(), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert (body["ok"], body["session"]["id"], body["session"]["seedLength"]) == (True, "c", 4)
    bad = subprocess.run(cli_args(server.url, "fork", running, "--boundary", "9", "--wait", str(TIMEOUT)),
                         env=clean_environ(), capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 1
    assert json.loads(bad.stdout)["code"] == "INVALID_BOUNDARY"


def test_the_request_on_the_queue_carries_boundary_as_json(client: Client, redis: Redis) -> None:
    request = client.request("run", session_id="c", boundary=5, request_id="shape")
    assert json.loads(wire.encode(request)) == {"source": "run", "requestId": "shape", "sessionId": "c",
                                                "boundary": 5}
