"""Where a real worker's outcome goes: stored (for late waiters), streamed once per request, kept as
the RQ job's result, and published on the request's reply channel."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import msgspec
import pytest
from helpers import make_client, outcome_entries, stored_outcome
from msgspec import UNSET
from redis import Redis
from rq.job import Job, JobStatus
from waits import wait_until
from worker_fixtures import TIMEOUT, next_message, subscribed, wait_job_status

from sessionfork.clients.client import Client
from sessionfork.clients.waiting import wait_for_reply
from sessionfork.core import keys
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkFailure, ForkResult
from sessionfork.embedded import EmbeddedServer
from sessionfork.worker import jobs

pytestmark = pytest.mark.rq  # runs again on RQ 2.12 (run.py test)

# -- outcomes: stored, streamed, RQ result, reply channel -----------------------------------------


def test_late_waiter_gets_the_stored_outcome(redis: Redis, client: Client, source: str) -> None:
    request = client.request(source, session_id="late")
    client.submit(request)
    wait_until(lambda: any(e.request == request.request_id for e in outcome_entries(redis)), TIMEOUT,
               "the outcome to be published")

    assert isinstance(request.request_id, str)
    reply = wait_for_reply(redis, request.request_id, keys.DEFAULT_REPLY_CHANNEL, 2.0)

    assert isinstance(reply, ForkResult) and reply.session is not UNSET
    assert reply.session.id == "late"
    assert msgspec.json.encode(reply) == stored_outcome(redis, request.request_id)


def test_outcome_stream_has_every_outcome_exactly_once_with_its_fields(
        redis: Redis, registry: Registry, client: Client, source: str) -> None:
    replies = [
        client.fork(source, session_id="s1", timeout=TIMEOUT),
        client.fork(source, count=3, timeout=TIMEOUT),
        client.fork("missing", timeout=TIMEOUT),
        client.fork(source, session_id="not valid!", timeout=TIMEOUT),
    ]
    replies.append(client.fork(source, session_id="s1", request_id=replies[0].request_id, timeout=TIMEOUT))

    entries = outcome_entries(redis)

    assert sorted(e.request for e in entries) == sorted({r.request_id for r in replies})
    for entry in entries:
        assert entry.fields == {"requestId", "code", "durationUs", "latencyUs", "reply"}
        assert entry.raw == stored_outcome(redis, entry.request)
        assert entry.reply.request_id == entry.request
        assert entry.code == (entry.reply.code if isinstance(entry.reply, ForkFailure) else "OK")
        assert entry.us >= 0
    assert [e.code for e in entries] == ["OK", "OK", "SESSION_NOT_FOUND", "INVALID_REQUEST"]
    assert entries[0].us > 0


def test_rq_job_result_holds_the_outcome_as_json(redis: Redis, client: Client, source: str) -> None:
    reply = client.fork(source, session_id="c", request_id="result-1", timeout=TIMEOUT)
    wait_job_status(redis, "result-1", JobStatus.FINISHED)

    job = Job.fetch("result-1", connection=redis, serializer=jobs.JSONSerializer)

    assert job.return_value() == msgspec.to_builtins(reply)
    assert job.return_value() == json.loads(stored_outcome(redis, "result-1") or b"null")


def test_reply_to_channel_gets_the_reply_and_the_default_channel_does_not(
        redis: Redis, client: Client, source: str) -> None:
    with subscribed(redis, "team-a:replies", keys.DEFAULT_REPLY_CHANNEL) as pubsub:
        routed = client.fork(source, session_id="routed", reply_to="team-a:replies", timeout=TIMEOUT)
        marker = client.fork(source, session_id="marker", timeout=TIMEOUT)  # published after "routed"
        seen = []
        while not seen or seen[-1][1] != marker.request_id:
            channel, data = next_message(pubsub)
            seen.append((channel, json.loads(data)["requestId"]))

    assert routed.ok is True
    assert seen == [("team-a:replies", routed.request_id), (keys.DEFAULT_REPLY_CHANNEL, marker.request_id)]


def test_retry_waiting_on_another_reply_channel_gets_the_outcome(client: Client, server: EmbeddedServer,
                                                                 source: str) -> None:
    first = client.request(source, session_id="c", request_id="moved-1", reply_to="team-a:replies")
    retry = client.request(source, session_id="c", request_id="moved-1", reply_to="team-b:replies")
    with ObservedRedis.watching(server) as (observed, checked), ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(make_client(observed).wait, retry, 3.0)
        assert checked.wait(TIMEOUT), "the waiter did not read the store"
        client.submit(first)
        reply = waiting.result(TIMEOUT)

    assert reply.ok is True


class ObservedRedis(Redis):
    """A client that signals ``checked`` after each HMGET: the waiter's read of the stored outcome."""

    checked: threading.Event

    @classmethod
    @contextmanager
    def watching(cls, server: EmbeddedServer) -> Iterator[tuple[ObservedRedis, threading.Event]]:
        observed = cls(host="127.0.0.1", port=server.port)
        observed.checked = threading.Event()
        try:
            yield observed, observed.checked
        finally:
            observed.close()

    def hmget(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().hmget(*args, **kwargs)
        finally:
            self.checked.set()
