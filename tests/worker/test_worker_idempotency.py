"""Idempotency through a real worker: a request id answers its first outcome and forks once (a retry,
a rerun job, a duplicate enqueue); reused for a different request, it is a conflict."""

from __future__ import annotations

import json
import uuid

import msgspec
import pytest
import rq
from helpers import outcome_entries, queue_of, stored_outcome, turn
from msgspec import UNSET
from redis import Redis
from rq.job import Job, JobStatus
from worker_fixtures import TIMEOUT, failure, subscribed, wait_job_status

from sessionfork.clients.client import Client
from sessionfork.core import keys, wire
from sessionfork.core.config import Settings
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkResult
from sessionfork.worker import jobs

pytestmark = pytest.mark.rq  # runs again on RQ 2.12 (run.py test)


@pytest.fixture
def parked(redis: Redis) -> rq.Queue:
    """A JSON queue that no worker listens on: what is enqueued there stays queued."""
    return jobs.make_queue(redis, Settings(queue=f"parked-{uuid.uuid4().hex[:8]}"))


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
    # More children than a batch takes (SESSIONFORK_BATCH_CHILDREN, 256): the rerun job runs as a
    # batch of its own, RQ's success bookkeeping of the replay in its (empty) records' transaction.
    first = client.fork(source, count=300, request_id="rerun-1", timeout=TIMEOUT)
    wait_job_status(redis, "rerun-1", JobStatus.FINISHED)
    Job.fetch("rerun-1", connection=redis, serializer=jobs.JSONSerializer).delete()  # RQ forgot the job
    registry.append(source, turn(2)[:2])

    request = client.request(source, count=300, request_id="rerun-1")
    client.submit(request)  # the enqueue script sees the kept request: nothing queued
    assert not redis.exists("rq:job:rerun-1")
    assert jobs.enqueue(queue_of(client), wire.encode(request), "rerun-1", client.settings)  # RQ's own enqueue does
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
        assert jobs.enqueue(queue_of(client), wire.encode(request), "dup-job", client.settings)
        wait_job_status(redis, "dup-job", JobStatus.FINISHED)  # the worker ran it...
        published = pubsub.get_message(timeout=0.5)

    assert published is None  # ...and announced nothing: "dup-job" has one outcome, the first
    assert redis.xlen(keys.OUTCOME_STREAM) == streamed
    assert failure(client.wait(request, TIMEOUT)) == (
        "IDEMPOTENCY_CONFLICT", 'request id "dup-job" was already used for a different request')
    assert not registry.exists("c2")
    assert stored_outcome(redis, "dup-job") == msgspec.json.encode(first)
