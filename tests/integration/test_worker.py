"""The fork worker end to end: a real ``sessionfork worker`` process, real Redis, requests through RQ."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import rq
from helpers import (
    clean_environ,
    cli_args,
    count_session_keys,
    live_client,
    make_client,
    outcome_entries,
    registered_worker,
    start_worker,
    stop,
    stored_outcome,
    turn,
    wait_registered,
    worker_name,
)
from msgspec import UNSET
from redis import Redis
from redis.client import PubSub
from rq.job import Job, JobStatus

from sessionfork.core import keys, wire
from sessionfork.core.config import Settings
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ChildError, ForkFailure, ForkResult, LiveHandle, Reply
from sessionfork.embedded import EmbeddedServer, wait_until
from sessionfork.queue import jobs
from sessionfork.queue.client import Client
from sessionfork.queue.waiting import wait_for_reply

TIMEOUT = 10.0
ID_RULE = "expected 1-128 characters from [A-Za-z0-9._:-]"


# -- fixtures -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def worker(server: EmbeddedServer) -> Iterator[subprocess.Popen[bytes]]:
    """One worker process for the module, on the session's server (which tests flush, not kill)."""
    with registered_worker(server, "module") as proc:
        yield proc


@pytest.fixture
def client(redis: Redis, worker: subprocess.Popen[bytes]) -> Client:
    return live_client(redis, worker)


@pytest.fixture
def source(registry: Registry) -> str:
    """Session "a": live, one finished turn (4 events), cwd /workspace."""
    registry.append(registry.create("a", cwd="/workspace"), turn(1))
    return "a"


@pytest.fixture
def parked(redis: Redis) -> rq.Queue:
    """A JSON queue that no worker listens on: what is enqueued there stays queued."""
    return jobs.make_queue(redis, Settings(queue=f"parked-{uuid.uuid4().hex[:8]}"))


# -- helpers --------------------------------------------------------------------------------------


@contextmanager
def subscribed(redis: Redis, *channels: str) -> Iterator[PubSub]:
    """A pubsub subscribed to ``channels``, every subscription confirmed by the server."""
    pubsub = redis.pubsub()
    try:
        pubsub.subscribe(*channels)
        confirmed = 0
        deadline = time.monotonic() + TIMEOUT
        while confirmed < len(channels):
            assert time.monotonic() < deadline, "subscriptions not confirmed"
            message = pubsub.get_message(timeout=1.0)
            if message is not None and message["type"] == "subscribe":
                confirmed += 1
        yield pubsub
    finally:
        pubsub.close()


def next_message(pubsub: PubSub, timeout: float = TIMEOUT) -> tuple[str, bytes]:
    """The next published message on ``pubsub``: (channel, data)."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        message = pubsub.get_message(ignore_subscribe_messages=True, timeout=min(left, 1.0))
        if message is not None:
            return message["channel"].decode(), message["data"]
    raise TimeoutError(f"no message within {timeout}s")


def submit_raw(redis: Redis, payload: bytes, request_id: str | None = None) -> tuple[str, Reply]:
    """Enqueue ``payload`` as a sessionfork job and wait for its outcome."""
    rid = request_id or f"raw-{uuid.uuid4().hex}"
    queue = jobs.make_queue(redis, Settings())
    assert jobs.enqueue(queue, payload, rid, Settings())
    reply = wait_for_reply(redis, rid, keys.DEFAULT_REPLY_CHANNEL, TIMEOUT)
    assert reply is not None, f"no outcome for {rid}"
    return rid, reply


def job_status(redis: Redis, job_id: str) -> JobStatus | None:
    return Job(job_id, connection=redis).get_status(refresh=True)


def wait_job_status(redis: Redis, job_id: str, status: JobStatus) -> None:
    wait_until(lambda: job_status(redis, job_id) == status, TIMEOUT, f"job {job_id} to be {status.value}")


def run_cli(*args: str, url: str | None, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_args(url, *args), env=clean_environ(), capture_output=True, text=True,
                          timeout=timeout, check=False)


def failure(reply: Reply) -> tuple[str, str]:
    assert isinstance(reply, ForkFailure), reply
    return reply.code, reply.message


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

    assert failure(reply) == ("SESSION_NOT_LIVE", 'session "a" is not the live store instance')
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


# -- invalid requests -----------------------------------------------------------------------------

OVERSIZED = json.dumps({"source": "a", "sessionId": "x" * (64 * 1024)}).encode()

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


# -- idempotency ----------------------------------------------------------------------------------


def test_same_request_id_after_its_outcome_answers_the_same_reply_and_forks_once(
        redis: Redis, registry: Registry, client: Client, source: str) -> None:
    first = client.fork(source, request_id="retry-1", timeout=TIMEOUT)
    registry.append(source, turn(2)[:2])  # the source is now inside an open turn

    again = client.fork(source, request_id="retry-1", timeout=TIMEOUT)

    assert isinstance(first, ForkResult) and first.session is not UNSET
    assert again == first
    assert registry.children(source) == [first.session.id]
    assert [e.request for e in outcome_entries(redis)] == ["retry-1"]


def test_rerun_job_of_a_finished_request_answers_its_first_outcome_and_creates_nothing(
        redis: Redis, registry: Registry, client: Client, source: str) -> None:
    first = client.fork(source, count=2, request_id="rerun-1", timeout=TIMEOUT)
    wait_job_status(redis, "rerun-1", JobStatus.FINISHED)
    Job.fetch("rerun-1", connection=redis, serializer=jobs.JSONSerializer).delete()  # RQ forgot the job
    registry.append(source, turn(2)[:2])

    request = client.request(source, count=2, request_id="rerun-1")
    client.submit(request)  # the enqueue script sees the kept request: nothing queued
    assert not redis.exists("rq:job:rerun-1")
    assert jobs.enqueue(client.queue, wire.encode(request), "rerun-1", client.settings)  # RQ's own enqueue does
    wait_job_status(redis, "rerun-1", JobStatus.FINISHED)  # the worker ran the new job
    again = client.wait(request, TIMEOUT)

    assert again == first
    rerun = Job.fetch("rerun-1", connection=redis, serializer=jobs.JSONSerializer)
    assert rerun.return_value() == msgspec.to_builtins(first)
    assert isinstance(first, ForkResult) and first.sessions is not UNSET
    assert registry.children(source) == sorted(h.id for h in first.sessions)
    assert [e.request for e in outcome_entries(redis)] == ["rerun-1"]


def test_duplicate_enqueue_while_queued_makes_one_rq_job(parked: rq.Queue) -> None:
    payload = json.dumps({"source": "a", "requestId": "queued-1"}).encode()

    assert jobs.enqueue(parked, payload, "queued-1", Settings()) is True
    assert jobs.enqueue(parked, payload, "queued-1", Settings()) is False

    assert parked.count == 1
    assert parked.job_ids == ["queued-1"]


def test_request_id_reused_for_a_different_request_is_an_idempotency_conflict(
        registry: Registry, client: Client, source: str) -> None:
    first = client.fork(source, session_id="c1", request_id="dup-id", timeout=TIMEOUT)

    reply = client.fork(source, session_id="c2", request_id="dup-id", timeout=TIMEOUT)

    assert first.ok is True
    assert failure(reply) == (
        "IDEMPOTENCY_CONFLICT", 'request id "dup-id" was already used for a different request')
    assert not registry.exists("c2")
    assert registry.children(source) == ["c1"]
    # The second submission never reached a worker (RQ's unique enqueue kept the first job): the
    # conflict is the client's, from the digest stored with the first request's outcome. The
    # worker's side is test_worker_ends_a_reused_request_id_as_a_conflict_and_announces_nothing.
    job = Job.fetch("dup-id", connection=registry.redis, serializer=jobs.JSONSerializer)
    assert json.loads(job.args[0])["sessionId"] == "c1"


def test_worker_ends_a_reused_request_id_as_a_conflict_and_announces_nothing(
        redis: Redis, registry: Registry, client: Client, source: str) -> None:
    first = client.fork(source, session_id="c1", request_id="dup-job", timeout=TIMEOUT)
    wait_job_status(redis, "dup-job", JobStatus.FINISHED)
    Job.fetch("dup-job", connection=redis, serializer=jobs.JSONSerializer).delete()
    streamed = redis.xlen(keys.OUTCOME_STREAM)

    with subscribed(redis, keys.DEFAULT_REPLY_CHANNEL) as pubsub:
        request = client.request(source, session_id="c2", request_id="dup-job")
        # RQ's own enqueue (the clients' enqueue script would refuse it: -1, nothing queued)
        assert jobs.enqueue(client.queue, wire.encode(request), "dup-job", client.settings)
        wait_job_status(redis, "dup-job", JobStatus.FINISHED)  # the worker ran it...
        published = pubsub.get_message(timeout=0.5)

    assert published is None  # ...and announced nothing: "dup-job" has one outcome, the first
    assert redis.xlen(keys.OUTCOME_STREAM) == streamed
    assert failure(client.wait(request, TIMEOUT)) == (
        "IDEMPOTENCY_CONFLICT", 'request id "dup-job" was already used for a different request')
    assert not registry.exists("c2")
    assert stored_outcome(redis, "dup-job") == msgspec.json.encode(first)


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
        assert entry.fields == {"request", "code", "us", "lat", "reply"}
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

