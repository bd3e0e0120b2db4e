"""What a real worker refuses before any work: invalid requests (``INVALID_REQUEST``, answered on
the request's reply channel) and jobs that are not sessionfork requests (never run, never
unpickled); the worker keeps serving after them."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
import rq
from helpers import count_session_keys, outcome_entries
from redis import Redis
from rq.job import JobStatus
from waits import outcome_of
from worker_fixtures import TIMEOUT, failure, next_message, subscribed, wait_job_status

from sessionfork.clients.client import Client
from sessionfork.clients.waiting import wait_for_reply
from sessionfork.core import keys
from sessionfork.core.config import Settings
from sessionfork.core.registry import Registry
from sessionfork.core.wire import Reply
from sessionfork.worker import jobs
from sessionfork.worker.outcomes import Outcomes
from sessionfork.worker.service import RequestService

pytestmark = pytest.mark.rq  # runs again on RQ 2.12 (run.py test)

ID_RULE = "expected 1-128 characters from [A-Za-z0-9._:-]"


def submit_raw(redis: Redis, payload: bytes, request_id: str | None = None) -> tuple[str, Reply]:
    """Enqueue ``payload`` as a sessionfork job and wait for its outcome."""
    rid = request_id or f"raw-{uuid.uuid4().hex}"
    queue = jobs.make_queue(redis, Settings())
    assert jobs.enqueue(queue, payload, rid, Settings())
    reply = wait_for_reply(redis, rid, keys.DEFAULT_REPLY_CHANNEL, TIMEOUT)
    assert reply is not None, f"no outcome for {rid}"
    return rid, reply


# -- invalid requests -----------------------------------------------------------------------------

OVERSIZED = json.dumps({"source": "a", "sessionId": "x" * (64 * 1024)}).encode()
BIG_EDITS = [{"type": "user/message", "data": {"text": "x" * 1000}} for _ in range(54)]
"""54 KB of edits: under the 64 KiB request limit, 55 MB written by 1024 children."""

INVALID: list[Any] = [
    pytest.param({"source": "a", "bogus": 1},
                 "invalid request: Object contains unknown field `bogus`", "bogus", id="unknown-field"),
    pytest.param({"source": "a", "count": "5"},
                 "invalid request: Expected `int`, got `str` - at `$.count`", "count", id="wrong-type"),
    pytest.param({"source": "a", "sessionId": "not valid!"},
                 f"invalid sessionId 'not valid!': {ID_RULE}", "sessionId", id="bad-session-id"),
    pytest.param({"source": "bad id!", "sessionId": "c"},
                 f"invalid source 'bad id!': {ID_RULE}", "source", id="bad-source"),
    pytest.param({"source": {"id": "bad id!", "instance": "x"}},
                 f"invalid source 'bad id!': {ID_RULE}", "source", id="bad-live-handle-id"),
    pytest.param({"source": "a", "sessionIds": ["c1", "bad id!"]},
                 f"invalid sessionIds[1] 'bad id!': {ID_RULE}", "sessionIds[1]", id="bad-id-in-session-ids"),
    pytest.param(OVERSIZED, f"request is {len(OVERSIZED)} bytes, over the limit of 65536", "65536",
                 id="over-64-KiB"),
    pytest.param({"source": "a", "sessionId": "c", "count": 2},
                 "invalid request: sessionId and count are exclusive", "sessionId and count",
                 id="session-id-with-count"),
    pytest.param({"source": "a", "count": 1025}, "invalid count 1025: expected 1 to 1024", "count",
                 id="count-over-1024"),
    pytest.param(b'{"source": "a", ', "invalid request: not JSON", "JSON", id="not-json"),
    pytest.param({"source": "a", "count": 1024, "edits": BIG_EDITS},
                 "invalid request: count 1024 \u00d7 56268 bytes of edits is 57618432 bytes to write, over the "
                 "limit of 16777216 (SESSIONFORK_MAX_REQUEST_WRITE_BYTES)", "count", id="fan-out-writing-over-16-MiB"),
    pytest.param(b'{"source": "a", "edits": [{"type": "user/message", "data": {"text": "hi \\ud83d"}}]}',
                 "invalid request: edits[0].data.text holds a lone surrogate ('\\ud83d'): text must be valid UTF-8",
                 "edits[0].data.text", id="lone-surrogate-in-an-edit"),
]


@pytest.mark.parametrize(("payload", "message", "names"), INVALID)
def test_invalid_request_is_refused_before_any_work(redis: Redis, registry: Registry, client: Client, source: str,
                                                    payload: dict[str, Any] | bytes, message: str,
                                                    names: str) -> None:
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    before = count_session_keys(redis)

    rid, reply = submit_raw(redis, raw)

    code, text = failure(reply)
    assert code == "INVALID_REQUEST"
    assert text.startswith(message)
    assert names in text
    assert count_session_keys(redis) == before
    assert registry.children(source) == []
    assert [(e.request, e.code) for e in outcome_entries(redis)] == [(rid, "INVALID_REQUEST")]


@pytest.mark.parametrize("bad", [{"session_id": "not valid!"}, {"count": 0}, {"session_ids": ["a", "a"]}],
                         ids=["sessionId", "count", "sessionIds"])
def test_invalid_request_reply_is_published_on_its_reply_to_channel_not_the_default(
        redis: Redis, client: Client, source: str, bad: dict[str, Any]) -> None:
    request = client.request(source, reply_to="team-a:replies", **bad)
    with subscribed(redis, "team-a:replies", keys.DEFAULT_REPLY_CHANNEL) as pubsub:
        client.submit(request)
        marker = client.fork(source, session_id="marker", timeout=TIMEOUT)  # published after the refusal
        seen = []
        while not seen or seen[-1][1] != marker.request_id:
            channel, data = next_message(pubsub)
            seen.append((channel, json.loads(data)["requestId"], json.loads(data).get("code")))

    assert seen == [("team-a:replies", request.request_id, "INVALID_REQUEST"),
                    (keys.DEFAULT_REPLY_CHANNEL, marker.request_id, None)]


# -- jobs that are not sessionfork requests -------------------------------------------------------


def test_job_naming_another_callable_is_refused_and_never_run(redis: Redis, client: Client,
                                                              tmp_path: Path) -> None:
    marker = tmp_path / f"pwned-{uuid.uuid4().hex}"
    job_id = f"evil-{uuid.uuid4().hex}"
    queue = jobs.make_queue(redis, Settings())

    queue.enqueue_call("os.system", args=(f"touch {marker}",), job_id=job_id)
    reply = wait_for_reply(redis, job_id, keys.DEFAULT_REPLY_CHANNEL, TIMEOUT)

    assert reply is not None
    assert failure(reply) == (
        "INVALID_REQUEST", "job names 'os.system'; this worker runs only sessionfork.jobs.fork")
    wait_job_status(redis, job_id, JobStatus.FAILED)
    assert not marker.exists()


def test_job_with_extra_arguments_is_refused(redis: Redis, client: Client, source: str) -> None:
    job_id = f"extra-{uuid.uuid4().hex}"
    queue = jobs.make_queue(redis, Settings())

    queue.enqueue_call(jobs.JOB_FUNCTION, args=(json.dumps({"source": source}), "more"), job_id=job_id)
    reply = wait_for_reply(redis, job_id, keys.DEFAULT_REPLY_CHANNEL, TIMEOUT)

    assert reply is not None
    assert failure(reply) == (
        "INVALID_REQUEST", "sessionfork.jobs.fork takes exactly one argument: the request JSON as a string")
    wait_job_status(redis, job_id, JobStatus.FAILED)


class _Touch:
    """Unpickling this runs ``touch path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.path}",))


def test_pickled_job_is_refused_and_never_unpickled(redis: Redis, client: Client, tmp_path: Path) -> None:
    marker = tmp_path / f"pwned-{uuid.uuid4().hex}"
    job_id = f"pickle-{uuid.uuid4().hex}"
    pickle_queue = rq.Queue(keys.DEFAULT_QUEUE, connection=redis)  # RQ's default serializer: pickle

    pickle_queue.enqueue_call(jobs.JOB_FUNCTION, args=(_Touch(marker),), job_id=job_id)
    reply = wait_for_reply(redis, job_id, keys.DEFAULT_REPLY_CHANNEL, TIMEOUT)

    assert reply is not None
    assert failure(reply) == (
        "INVALID_REQUEST", "job payload is not a JSON sessionfork job (DeserializationError)")
    wait_job_status(redis, job_id, JobStatus.FAILED)
    assert not marker.exists()


def test_worker_keeps_serving_after_refusing_jobs(redis: Redis, client: Client, source: str) -> None:
    queue = jobs.make_queue(redis, Settings())
    queue.enqueue_call("os.getcwd", job_id=f"evil-{uuid.uuid4().hex}")
    rq.Queue(keys.DEFAULT_QUEUE, connection=redis).enqueue_call(jobs.JOB_FUNCTION, args=(source,),
                                                                job_id=f"pickle-{uuid.uuid4().hex}")

    reply = client.fork(source, session_id="after", timeout=TIMEOUT)

    assert reply.ok is True


def test_text_that_is_not_utf8_is_refused_naming_the_field(redis: Redis, registry: Registry, source: str) -> None:
    """Bytes that are not UTF-8 (a payload handed to the service as bytes) and a lone surrogate
    escape: ``INVALID_REQUEST`` naming the field and saying what is wrong, never a
    ``UnicodeDecodeError`` nor msgspec's "not JSON (Input data was truncated)"."""
    service = RequestService(registry, Outcomes(redis, ttl=60, stream_maxlen=100), reply_channel="sf:replies")
    cases = {
        b'{"source": "a", "replyTo": "r", "edits": [{"type": "t", "data": ["ok", "caf\xe9"]}]}':
            "invalid request: edits[0].data[1] holds bytes that are not valid UTF-8 (0xe9): text must be valid UTF-8",
        b'{"source": "a", "variants": [{}, {"edits": [{"type": "t", "x": {"k\\udc00": 1}}]}]}':
            "invalid request: variants[1].edits[0].x (an object key) holds a lone surrogate ('\\udc00'): text "
            "must be valid UTF-8 (a \\ud800-\\udbff escape needs its \\udc00-\\udfff pair)",
        b'{"source": "a", "replyTo": "\xff"}':
            "invalid request: replyTo holds bytes that are not valid UTF-8 (0xff): text must be valid UTF-8",
    }
    for i, (payload, message) in enumerate(cases.items()):
        reply = outcome_of(lambda p=payload, i=i: service.handle(p, f"utf8-{i}"))
        assert not isinstance(reply, str), reply  # an outcome, never an exception out of the parser
        assert failure(reply) == ("INVALID_REQUEST", message)
    assert registry.children(source) == []


def test_a_lone_surrogate_in_a_merges_summary_is_refused_naming_the_summary(redis: Redis, registry: Registry) -> None:
    """A merge (and a select) whose summary holds a lone surrogate escape: ``INVALID_REQUEST``
    naming ``summary``'s path, as a fork's edits are named, never the ``op`` field."""
    service = RequestService(registry, Outcomes(redis, ttl=60, stream_maxlen=100), reply_channel="sf:replies")
    cases = {
        b'{"op": "merge", "parent": "p", "child": "c", "mode": "summary", "summary": {"text": "hi \\ud83d"}}':
            "invalid request: summary.text holds a lone surrogate ('\\ud83d'): text must be valid UTF-8",
        b'{"op": "select", "parent": "p", "candidates": ["a"], "winner": "a", "mode": "summary", '
        b'"summary": ["ok", "\\udc00"]}':
            "invalid request: summary[1] holds a lone surrogate ('\\udc00'): text must be valid UTF-8",
    }
    for i, (payload, message) in enumerate(cases.items()):
        reply = outcome_of(lambda p=payload, i=i: service.handle(p, f"surrogate-{i}"))
        assert not isinstance(reply, str), reply
        assert (getattr(reply, "code", None), getattr(reply, "message", "")[:len(message)]) == (
            "INVALID_REQUEST", message), reply
    assert count_session_keys(redis) == 0
