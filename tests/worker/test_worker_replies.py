"""A fork through a real ``sessionfork worker`` process and RQ: the result with the child's header
(or the children's, for a fan-out), or the error code of a fork that cannot be made."""

from __future__ import annotations

import json

import msgspec
import pytest
from helpers import count_session_keys, stored_outcome, turn
from msgspec import UNSET
from redis import Redis
from worker_fixtures import TIMEOUT, failure, next_message, subscribed

from sessionfork.clients.client import Client
from sessionfork.core import keys
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ChildError, ForkResult, LiveHandle

pytestmark = pytest.mark.rq  # runs again on RQ 2.12 (run.py test)

# -- success --------------------------------------------------------------------------------------


def test_fork_reply_is_a_result_with_the_child_header(client: Client, registry: Registry, source: str) -> None:
    reply = client.fork(source, session_id="c", timeout=TIMEOUT)

    assert isinstance(reply, ForkResult)
    assert reply.ok is True
    assert reply.session is not UNSET
    assert (reply.session.id, reply.session.parent_session, reply.session.seed_length, reply.session.cwd) \
        == ("c", "a", 4, "/workspace")
    assert reply.sessions is UNSET and reply.failed is UNSET
    assert registry.header("c") == reply.session
    assert registry.children("a") == ["c"]


def test_fork_reply_json_has_exactly_type_request_id_ok_session(redis: Redis, client: Client, source: str) -> None:
    with subscribed(redis, keys.DEFAULT_REPLY_CHANNEL) as pubsub:
        reply = client.fork(source, session_id="c", request_id="shape-1", timeout=TIMEOUT)
        _, published = next_message(pubsub)

    stored = stored_outcome(redis, "shape-1")
    assert stored is not None
    for raw in (published, stored):
        body = json.loads(raw)
        assert set(body) == {"type", "requestId", "ok", "session"}
        assert (body["type"], body["requestId"], body["ok"]) == ("fork/result", "shape-1", True)
        assert (body["session"]["parentSession"], body["session"]["seedLength"]) == ("a", 4)
    assert published == stored
    assert json.loads(stored) == msgspec.to_builtins(reply)


# -- error codes through the queue ----------------------------------------------------------------


def test_missing_source_is_session_not_found(client: Client, redis: Redis) -> None:
    before = count_session_keys(redis)

    reply = client.fork("missing", session_id="c", timeout=TIMEOUT)

    assert failure(reply) == ("SESSION_NOT_FOUND", 'session "missing" not found')
    assert count_session_keys(redis) == before


def test_live_handle_with_a_wrong_instance_is_session_not_live(client: Client, registry: Registry,
                                                               source: str) -> None:
    reply = client.fork(LiveHandle(source, "wrong-instance"), session_id="c", timeout=TIMEOUT)

    assert failure(reply) == ("SESSION_NOT_LIVE",
                              'live handle of session "a" is stale: its instance is not the live one')
    assert not registry.exists("c")


def test_live_handle_with_the_right_instance_forks(client: Client, registry: Registry) -> None:
    handle = registry.create("h")
    registry.append(handle, turn(1))

    reply = client.fork(handle, session_id="c", timeout=TIMEOUT)

    assert isinstance(reply, ForkResult) and reply.session is not UNSET
    assert reply.session.parent_session == "h"


def test_used_child_id_is_session_already_exists(client: Client, registry: Registry, source: str) -> None:
    registry.create("taken")

    reply = client.fork(source, session_id="taken", timeout=TIMEOUT)

    assert failure(reply) == ("SESSION_ALREADY_EXISTS", 'session "taken" already exists')
    assert registry.header("taken").parent_session is UNSET
    assert registry.children("a") == []


def test_source_inside_an_open_turn_is_open_turn(client: Client, registry: Registry) -> None:
    handle = registry.create("o")
    registry.append(handle, [*turn(1), *turn(2)[:2]])

    reply = client.fork("o", session_id="c", timeout=TIMEOUT)

    assert failure(reply) == (
        "OPEN_TURN", 'cannot fork session "o" inside an open turn (last event: user/message)')
    assert not registry.exists("c")
    assert registry.children("o") == []


# -- fan-out --------------------------------------------------------------------------------------


def test_fan_out_count_creates_that_many_children_from_one_snapshot(
        registry: Registry, client: Client, source: str) -> None:
    reply = client.fork(source, count=5, timeout=TIMEOUT)

    assert isinstance(reply, ForkResult) and reply.sessions is not UNSET
    assert reply.ok is True and reply.failed is UNSET and reply.session is UNSET
    assert len({h.id for h in reply.sessions}) == 5
    assert {(h.parent_session, h.seed_length) for h in reply.sessions} == {("a", 4)}
    assert registry.children(source) == sorted(h.id for h in reply.sessions)
    expected = [(e.type, e.data) for e in registry.events(source)]
    for header in reply.sessions:
        assert [(e.type, e.data) for e in registry.events(header.id)] == expected


def test_fan_out_with_an_existing_id_reports_it_and_creates_the_others(
        registry: Registry, client: Client, source: str) -> None:
    registry.create("taken")

    reply = client.fork(source, session_ids=["k1", "taken", "k2"], timeout=TIMEOUT)

    assert isinstance(reply, ForkResult) and reply.sessions is not UNSET
    assert reply.ok is False
    assert reply.failed == [ChildError(session_id="taken", code="SESSION_ALREADY_EXISTS",
                                       message='session "taken" already exists')]
    assert [h.id for h in reply.sessions] == ["k1", "k2"]
    assert registry.children(source) == ["k1", "k2"]
    assert registry.header("taken").parent_session is UNSET
