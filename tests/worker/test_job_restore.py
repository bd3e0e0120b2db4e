"""``rq_seam.entries.ForkJob.restore``: a worker loads a job hash into the same job as RQ's own
``Job.restore`` (its timestamps as RQ writes them read without ``strptime``; any other left to RQ),
whoever wrote the hash: sessionfork's client, RQ's ``Queue.enqueue``, RQ's worker after a run."""

from __future__ import annotations

from datetime import UTC
from typing import Any

import pytest
from redis import Redis
from rq import Queue, SimpleWorker
from rq.job import Job

from sessionfork.clients.client import Client
from sessionfork.core.config import Settings
from sessionfork.worker import jobs
from sessionfork.worker.rq_seam.entries import DequeuedJob, ForkJob, MalformedJob

pytestmark = pytest.mark.rq  # RQ's layout: on RQ 2.12 too

DATES = ("created_at", "enqueued_at", "started_at", "ended_at", "last_heartbeat")


def loaded_both(redis: Redis, job_id: str, hash_: dict[bytes, bytes]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The attributes of ``hash_`` loaded by the worker (``DequeuedJob.loaded``) and by RQ's own
    ``Job.restore``, with the worker's serializer; callbacks and webhooks aside (a fork job drops them)."""
    ours = DequeuedJob.loaded(job_id, hash_, redis, jobs.JSONSerializer)
    theirs = Job(job_id, connection=redis, serializer=jobs.JSONSerializer)
    theirs.restore(hash_)
    aside = {"webhooks", "_success_callback_name", "_failure_callback_name", "_stopped_callback_name"}
    return ({k: v for k, v in vars(ours).items() if k not in aside},
            {k: v for k, v in vars(theirs).items() if k not in aside})


def submitted(redis: Redis, request_id: str) -> dict[bytes, bytes]:
    """The job hash of a request ``request_id`` a scheduler's client queued."""
    client = Client(redis, Settings(queue="restore"))
    client.submit(client.request("src", request_id=request_id))
    return redis.hgetall(Job.key_for(request_id))  # type: ignore[no-any-return]


def test_a_hash_from_sessionforks_enqueue_loads_as_rq_loads_it(redis: Redis) -> None:
    hash_ = submitted(redis, "restore-1")
    ours, theirs = loaded_both(redis, "restore-1", hash_)
    assert ours == theirs
    assert ours["enqueued_at"] is not None and ours["enqueued_at"].tzinfo is UTC


class QuietWorker(SimpleWorker):
    """RQ's ``SimpleWorker`` without its command listener (``subscribe``): the job hash it writes is
    the same, and its stop does not wait out the listener's 60-second read (RQ with redis-py 8.2:
    ``workers.md``)."""

    def subscribe(self) -> None:
        pass

    def unsubscribe(self) -> None:
        pass


def test_a_hash_rqs_worker_ran_loads_as_rq_loads_it_every_timestamp_included(redis: Redis) -> None:
    queue = Queue("restore-rq", connection=redis)
    queue.enqueue("bench.measure.noop", job_id="restore-2", result_ttl=600, description="d", meta={"a": 1})
    QuietWorker([queue], connection=redis).work(burst=True)
    hash_ = redis.hgetall(Job.key_for("restore-2"))
    assert all(hash_.get(field.encode()) for field in DATES)  # each of the five parsed here
    ours, theirs = loaded_both(redis, "restore-2", hash_)
    assert ours == theirs
    assert [ours[field] for field in DATES] == [theirs[field] for field in DATES]


@pytest.mark.parametrize("stamp", [b"2026-12-03T16:21:20Z", b"2026-1-3T1:2:3.5Z", b"2026-12-03T16:21:20.123Z"])
def test_a_timestamp_in_another_form_rq_reads_is_left_to_rq(redis: Redis, stamp: bytes) -> None:
    """RQ's old format, unpadded fields, three fraction digits: RQ's ``strptime`` reads them, so
    the worker reads them as it does."""
    hash_ = {**submitted(redis, f"restore-3-{len(stamp)}"), b"enqueued_at": stamp, b"started_at": stamp}
    ours, theirs = loaded_both(redis, f"restore-3-{len(stamp)}", hash_)
    assert ours == theirs


@pytest.mark.parametrize("stamp", [b"2026-12-03 16:21:20.123456Z", b"2026-12-03T16:21:20.123456+00:00", b"soon"])
def test_a_timestamp_rq_refuses_is_refused_as_rq_refuses_it(redis: Redis, stamp: bytes) -> None:
    """``fromisoformat`` would read the first two; RQ refuses them, and so does the worker."""
    hash_ = {**submitted(redis, "restore-4"), b"enqueued_at": stamp}
    with pytest.raises(ValueError):
        Job("restore-4", connection=redis, serializer=jobs.JSONSerializer).restore(hash_)
    with pytest.raises(ValueError) as refused:
        DequeuedJob.loaded("restore-4", hash_, redis, jobs.JSONSerializer)
    assert not isinstance(refused.value, MalformedJob)  # RQ's own error, as before


def test_a_hash_without_data_is_still_malformed(redis: Redis) -> None:
    with pytest.raises(MalformedJob):
        ForkJob("restore-5", connection=redis).restore({b"created_at": b"2026-12-03T16:21:20.123456Z"})
