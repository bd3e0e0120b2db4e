"""Composed forks through the queue and a worker process: ``ifLength`` (``PRECONDITION_FAILED``
and its place in the error order), ``edits``, ``variants`` (a fan-out in variant order), both
clients, the request's JSON, and the new fields as part of a request's identity."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from pathlib import Path

import msgspec
import pytest
from helpers import (
    SETTINGS,
    make_client,
    queue_of,
    start_worker,
    stop,
    turn,
    worker_name,
)
from helpers import (
    run_fork_cli as run_cli,
)
from redis import Redis

from sessionfork.aio import AsyncClient
from sessionfork.client import Client, Variant
from sessionfork.clients.waiting import wait_for_reply
from sessionfork.core import keys, wire
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkFailure, ForkResult, NewEvent, Reply
from sessionfork.embedded import EmbeddedServer
from sessionfork.worker import jobs

TIMEOUT = 30.0
RETRY = [NewEvent("turn/start", {"turn": 3}), NewEvent("user/message", {"text": "again"}, extra={"surfaceOp": "x"})]


@pytest.fixture
def src(registry: Registry) -> str:
    """Session "src": two finished turns (8 events)."""
    registry.append(registry.create("src", cwd="/w"), [*turn(1), *turn(2)])
    return "src"


def failure(reply: Reply) -> tuple[str, str]:
    assert isinstance(reply, ForkFailure), reply
    return reply.code, reply.message


def raw_request(redis: Redis, client: Client, body: dict[str, object]) -> Reply:
    rid = f"raw-{uuid.uuid4().hex}"
    assert jobs.enqueue(queue_of(client), json.dumps({"requestId": rid, **body}).encode(), rid, client.settings)
    reply = wait_for_reply(redis, rid, keys.DEFAULT_REPLY_CHANNEL, TIMEOUT)
    assert reply is not None
    return reply


def test_the_guard_through_a_worker(client: Client, registry: Registry, src: str) -> None:
    assert failure(client.fork(src, session_id="c", if_length=7, timeout=TIMEOUT)) == (
        "PRECONDITION_FAILED", 'session "src" has 8 events, not 7')
    assert not registry.exists("c")
    reply = client.fork(src, session_id="c", if_length=8, timeout=TIMEOUT)
    assert isinstance(reply, ForkResult) and reply.session is not msgspec.UNSET
    assert reply.session.seed_length == 8


def test_the_guard_holds_with_edits_through_a_worker(client: Client, registry: Registry, src: str) -> None:
    """docs/guarantees.md, "Atomic steps, one slot each" (the ``ifLength`` guard is checked in the
    source step): a request with ``edits`` (or variants carrying them) is guarded as any other, so
    a stale length is ``PRECONDITION_FAILED`` and no child exists, edits or not."""
    stale = client.fork(src, session_id="c", if_length=7, edits=RETRY, timeout=TIMEOUT)
    assert failure(stale) == ("PRECONDITION_FAILED", 'session "src" has 8 events, not 7')
    fan = client.fork(src, if_length=7, variants=[Variant("v1", RETRY), Variant("v2")], timeout=TIMEOUT)
    assert failure(fan) == ("PRECONDITION_FAILED", 'session "src" has 8 events, not 7')
    assert not registry.exists("c") and not registry.exists("v1") and not registry.exists("v2")
    reply = client.fork(src, session_id="c", if_length=8, edits=RETRY, timeout=TIMEOUT)
    assert isinstance(reply, ForkResult) and reply.session is not msgspec.UNSET
    assert (reply.session.seed_length, registry.length("c")) == (8, 10)


def test_the_error_order_through_a_worker(client: Client, registry: Registry, src: str) -> None:
    registry.create("taken")
    assert failure(client.fork("nope", session_id="taken", if_length=1, boundary=99, timeout=TIMEOUT))[0] == \
        "SESSION_NOT_FOUND"
    assert failure(client.fork(src, session_id="taken", if_length=1, boundary=99, timeout=TIMEOUT))[0] == \
        "PRECONDITION_FAILED"
    assert failure(client.fork(src, session_id="taken", if_length=8, boundary=99, timeout=TIMEOUT))[0] == \
        "SESSION_ALREADY_EXISTS"
    assert failure(client.fork(src, session_id="c", if_length=8, boundary=99, timeout=TIMEOUT))[0] == \
        "INVALID_BOUNDARY"


def test_edits_through_a_worker(client: Client, registry: Registry, src: str) -> None:
    reply = client.fork(src, session_id="c", boundary=3, edits=RETRY, timeout=TIMEOUT)
    assert isinstance(reply, ForkResult) and reply.session is not msgspec.UNSET
    assert reply.session.seed_length == 4
    events = registry.events("c")
    assert [(e.type, e.seq, e.data, e.extra) for e in events[4:]] == [
        ("turn/start", 4, {"turn": 3}, {}), ("user/message", 5, {"text": "again"}, {"surfaceOp": "x"})]
    assert {e.time for e in events[4:]} == {reply.session.created_at}


def test_variants_answer_a_fan_out_in_variant_order(client: Client, registry: Registry, src: str) -> None:
    registry.create("v-taken")
    variants = [Variant("v-b", [NewEvent("user/message", {"text": "b"})]), Variant(),
                Variant("v-taken", RETRY), Variant("v-a", [NewEvent("user/message", {"text": "a"})])]
    reply = client.fork(src, variants=variants, if_length=8, timeout=TIMEOUT)
    assert isinstance(reply, ForkResult) and reply.sessions is not msgspec.UNSET
    assert not reply.ok and [f.session_id for f in reply.failed or []] == ["v-taken"]
    ids = [h.id for h in reply.sessions]
    assert ids[0] == "v-b" and ids[2] == "v-a" and ids[1].startswith("session-")
    assert [e.data for e in registry.events("v-b")[8:]] == [{"text": "b"}]
    assert [e.data for e in registry.events("v-a")[8:]] == [{"text": "a"}]
    assert registry.length(ids[1]) == 8
    assert registry.events("v-b")[:8] == registry.events(ids[1]) == registry.events(src)


def test_the_asyncio_client_sends_the_same_fields(server: EmbeddedServer, worker: subprocess.Popen[bytes],
                                                  registry: Registry, src: str) -> None:
    async def main() -> Reply:
        async with AsyncClient.from_url(server.url, SETTINGS) as aio:
            guarded = await aio.fork(src, session_id="x", if_length=2, timeout=TIMEOUT)
            assert failure(guarded)[0] == "PRECONDITION_FAILED"
            first = await aio.fork(src, session_id="a0", edits=RETRY, request_id="aio-ed", timeout=TIMEOUT)
            assert first.ok
            other = await aio.fork(src, session_id="a0", edits=RETRY[:1], request_id="aio-ed", timeout=TIMEOUT)
            assert failure(other) == ("IDEMPOTENCY_CONFLICT", 'request id "aio-ed" was already used for a different '
                                      "request")
            assert await aio.fork(src, session_id="a0", edits=RETRY, request_id="aio-ed", timeout=TIMEOUT) == first
            return await aio.fork(src, variants=[Variant("a1", RETRY), Variant("a2")], if_length=8, timeout=TIMEOUT)

    reply = asyncio.run(main())
    assert reply.ok and [e.type for e in registry.events("a1")[8:]] == ["turn/start", "user/message"]
    assert registry.length("a2") == 8 and registry.length("a0") == 10


@pytest.mark.parametrize(("body", "words"), [
    ({"ifLength": -1}, "ifLength"),
    ({"ifLength": True}, "ifLength"),
    ({"edits": []}, "expected 1 to 256 events, got 0"),
    ({"edits": [{"data": 1}]}, "edits[0]: expected a non-empty string type"),
    ({"edits": [{"type": "x", "seq": 3}]}, "edits[0]"),
    ({"edits": [{"type": "x"}] * 257}, "expected 1 to 256"),
    ({"variants": []}, "variants"),
    ({"variants": [{"sessionId": "a"}, {"sessionId": "a"}]}, "distinct"),
    ({"variants": [{"sessionId": "bad id"}]}, "variants[0].sessionId"),
    ({"variants": [{"edits": [{"type": ""}]}]}, "variants[0].edits[0]"),
    ({"variants": [{"sessionId": "a", "other": 1}]}, "other"),
    ({"variants": [{}], "sessionId": "c"}, "sessionId and variants are exclusive"),
    ({"variants": [{}], "count": 2}, "count and variants are exclusive"),
    ({"variants": [{}], "edits": [{"type": "x"}]}, "variants and edits are exclusive"),
])
def test_bad_fields_are_invalid_request_before_any_work(redis: Redis, client: Client, registry: Registry, src: str,
                                                        body: dict[str, object], words: str) -> None:
    before = set(redis.keys("sf:s:*"))
    code, message = failure(raw_request(redis, client, {"source": src, **body}))
    assert code == "INVALID_REQUEST" and words in message, message
    assert set(redis.keys("sf:s:*")) == before


def test_an_edit_over_the_workers_event_limit_is_invalid_request_before_any_work(
        server: EmbeddedServer, redis: Redis, registry: Registry, src: str) -> None:
    name = worker_name("small")
    proc = start_worker(server.url, name, SESSIONFORK_MAX_EVENT_BYTES=200, SESSIONFORK_QUEUE="small")
    try:
        small = make_client(redis, queue="small")
        reply = small.fork(src, session_id="big", edits=[NewEvent("x", "y" * 300)], timeout=TIMEOUT)
        code, message = failure(reply)
        assert code == "INVALID_REQUEST" and "over the limit of 200" in message, message
        assert not registry.exists("big")
        # Refused before any work: never claimed (no kept request), digested as an invalid request.
        record = redis.hgetall(keys.request(reply.request_id))
        assert b"request" not in record and record[b"digest"].startswith(b"invalid:"), record
        assert small.fork(src, session_id="fits", edits=[NewEvent("x", "y")], timeout=TIMEOUT).ok
    finally:
        stop(proc)


def test_reusing_a_request_id_with_other_edits_is_an_idempotency_conflict(client: Client, registry: Registry,
                                                                         src: str) -> None:
    first = client.fork(src, session_id="c", edits=RETRY, if_length=8, request_id="ed-1", timeout=TIMEOUT)
    assert first.ok
    assert client.fork(src, session_id="c", edits=RETRY, if_length=8, request_id="ed-1", timeout=TIMEOUT) == first
    other = [RETRY[0], NewEvent("user/message", {"text": "other"})]
    for kwargs in ({"edits": other, "if_length": 8}, {"edits": RETRY, "if_length": 9}, {"edits": RETRY},
                   {"if_length": 8}, {"variants": [Variant("c", RETRY)], "if_length": 8}):
        reply = client.fork(src, session_id=None if "variants" in kwargs else "c", request_id="ed-1",
                            timeout=TIMEOUT, **kwargs)  # type: ignore[arg-type]
        assert failure(reply) == ("IDEMPOTENCY_CONFLICT", 'request id "ed-1" was already used for a different request')
    assert registry.length("c") == 10  # the edits once


def test_the_request_on_the_queue_carries_the_fields_as_json(client: Client) -> None:
    request = client.request("run", if_length=4, edits=RETRY[:1], request_id="shape")
    assert json.loads(wire.encode(request)) == {"source": "run", "requestId": "shape", "ifLength": 4,
                                                "edits": [{"type": "turn/start", "data": {"turn": 3}}]}
    request = client.request("run", variants=[Variant("a", RETRY[1:]), Variant()], request_id="shape")
    assert json.loads(wire.encode(request)) == {"source": "run", "requestId": "shape", "variants": [
        {"sessionId": "a", "edits": [{"type": "user/message", "data": {"text": "again"}, "surfaceOp": "x"}]}, {}]}


def test_cli_fork_with_a_guard_edits_and_variants(server: EmbeddedServer, client: Client, registry: Registry,
                                                  src: str, tmp_path: Path) -> None:
    edits = json.dumps([{"type": "turn/start", "data": {"turn": 3}}, {"type": "user/message", "data": "hi", "k": 1}])
    done = run_cli(server.url, src, "--session-id", "c", "--if-length", "8", "--edits", "-", stdin=edits)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["session"]["seedLength"] == 8
    assert [(e.type, e.data, e.extra) for e in registry.events("c")[8:]] == [
        ("turn/start", {"turn": 3}, {}), ("user/message", "hi", {"k": 1})]
    guarded = run_cli(server.url, src, "--if-length", "3")
    assert guarded.returncode == 1
    assert json.loads(guarded.stdout) == {"type": "fork/error", "requestId": json.loads(guarded.stdout)["requestId"],
                                          "ok": False, "code": "PRECONDITION_FAILED",
                                          "message": 'session "src" has 8 events, not 3'}
    variants = tmp_path / "variants.json"
    variants.write_text(json.dumps([{"sessionId": "cv1", "edits": [{"type": "x"}]}, {"sessionId": "cv2"}]))
    fan = run_cli(server.url, src, "--variants", str(variants))
    assert fan.returncode == 0, fan.stderr
    assert [h["id"] for h in json.loads(fan.stdout)["sessions"]] == ["cv1", "cv2"]
    assert registry.length("cv1") == 9 and registry.length("cv2") == 8


@pytest.mark.parametrize(("args", "stdin", "words"), [
    (["--edits", "-"], "not json", "--edits"),
    (["--edits", "-"], '{"type": "x"}', "JSON array of events"),
    (["--edits", "-"], '[{"type": "x", "seq": 1}]', "may not redefine"),
    (["--variants", "-"], '[{"sessionId": "a", "extra": 1}]', "unknown field"),
    (["--if-length", "-1"], None, "--if-length"),
])
def test_cli_bad_files_are_usage_errors(server: EmbeddedServer, src: str, args: list[str], stdin: str | None,
                                        words: str) -> None:
    done = run_cli(server.url, src, *args, stdin=stdin)
    assert done.returncode == 2 and words in done.stderr, done.stderr
