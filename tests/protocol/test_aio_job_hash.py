"""The asyncio client (``sessionfork.aio.AsyncClient``) writes RQ's own job hash, queue entry and
key names (pinned against RQ itself), and importing it imports no RQ."""

from __future__ import annotations

import subprocess
import sys

import pytest
from aio_helpers import client_for, run
from helpers import SETTINGS, make_client
from redis import Redis
from rq.job import Job

from sessionfork.core import wire
from sessionfork.embedded import EmbeddedServer
from sessionfork.protocol import rq_layout
from sessionfork.worker import jobs

pytestmark = pytest.mark.rq  # runs again on RQ 2.12 (run.py test)

# -- the job hash -------------------------------------------------------------------------------


def test_job_hash_is_field_by_field_what_rq_writes(server: EmbeddedServer, redis: Redis) -> None:
    payload_source = {"requestId": "hash-1", "source": "s" * 200}  # long: RQ truncates the description
    sync = make_client(redis)
    request = sync.request(payload_source["source"], request_id="hash-1", session_id="child-x")
    assert jobs.enqueue(jobs.make_queue(redis, SETTINGS), wire.encode(request), "hash-1", SETTINGS)  # RQ's own
    by_rq = redis.hgetall(rq_layout.job_key("hash-1"))
    queue_by_rq = redis.lrange(rq_layout.queue_key(SETTINGS.queue), 0, -1)
    queues_by_rq = redis.smembers(rq_layout.QUEUES)
    redis.flushall()

    async def main() -> None:
        async with client_for(server) as client:
            assert await client.submit(request) == "hash-1"
            assert await client.submit(request) == "hash-1"  # a second submit is a no-op

    run(main)
    ours = redis.hgetall(rq_layout.job_key("hash-1"))
    assert set(ours) == {*by_rq, b"sf_identity"}  # and the request's identity, for the enqueue script
    for name in by_rq:
        if name in (b"created_at", b"enqueued_at"):
            assert len(ours[name]) == len(by_rq[name]) and ours[name].endswith(b"Z")
        else:
            assert ours[name] == by_rq[name], name
    assert redis.lrange(rq_layout.queue_key(SETTINGS.queue), 0, -1) == queue_by_rq == [b"hash-1"]
    assert redis.smembers(rq_layout.QUEUES) == queues_by_rq
    redis.delete(rq_layout.job_key("hash-1"), rq_layout.queue_key(SETTINGS.queue))
    sync.submit(request)  # the sync client writes the same hash (one function: rq_layout.job_fields)
    assert {k: v for k, v in redis.hgetall(rq_layout.job_key("hash-1")).items()
            if k not in (b"created_at", b"enqueued_at")} == {k: v for k, v in ours.items()
                                                             if k not in (b"created_at", b"enqueued_at")}
    job = Job.fetch("hash-1", connection=redis, serializer=jobs.JSONSerializer)
    assert job.func_name == jobs.JOB_FUNCTION and job.get_status() == "queued"
    assert wire.decode_request(job.args[0]) == request


def test_rq_key_names_are_rqs_own(redis: Redis) -> None:
    queue = jobs.make_queue(redis, SETTINGS)
    patterns = rq_layout.key_patterns(queue.name)
    assert rq_layout.job_key("r-1") == wire.text(Job.key_for("r-1")) == patterns["jobs"][:-1] + "r-1"
    assert rq_layout.queue_key(queue.name) == queue.key == rq_layout.key_patterns(queue.name)["queue"]
    assert rq_layout.QUEUES == queue.redis_queues_keys == rq_layout.key_patterns(queue.name)["queues"]


def test_the_pause_key_is_rqs_suspension_key() -> None:
    from rq.suspension import WORKERS_SUSPENDED  # RQ's own name (rq suspend, rq resume)

    assert rq_layout.SUSPENDED == WORKERS_SUSPENDED


def test_importing_the_async_client_imports_no_rq() -> None:
    code = "import sys, sessionfork.aio; print(sorted(m for m in sys.modules if m.split('.')[0] == 'rq'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
