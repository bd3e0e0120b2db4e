"""Lean request records: what a completed request keeps, and that every promise still holds.

A real server and a real ``sessionfork worker`` process. The bound (docs/performance.md, Memory): at most
1,024 bytes of Redis memory retained per completed single-fork request, child included, for the
whole idempotency window, at Redis's default settings (``hash-max-listpack-value`` 64: both records
are listpacks, ``core.records``); RQ's own job state lives only ``SESSIONFORK_JOB_TTL`` seconds.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from bench.memory import BAR, LISTPACK_VALUE, RQ_JOBS, request_memory, steady_workload
from helpers import make_client, outcome_entries, queue_of, start_worker, stop, turn, wait_registered, worker_name
from redis import Redis
from rq.job import Job
from rq.registry import FinishedJobRegistry
from waits import wait_until

from sessionfork.clients.client import Client
from sessionfork.core import keys
from sessionfork.core.registry import Registry
from sessionfork.embedded import EmbeddedServer
from sessionfork.worker.jobs import JSONSerializer

pytestmark = pytest.mark.rq  # runs again on RQ 2.12 (run.py test)


def test_a_completed_request_retains_at_most_1024_bytes_at_redis_defaults(server: EmbeddedServer) -> None:
    assert int(server.client().config_get(LISTPACK_VALUE)[LISTPACK_VALUE]) == 64  # Redis's default
    report = request_memory(server, 1000)
    print(report.render())
    assert report.families[RQ_JOBS] == 0
    assert 0 < report.retained <= BAR, report.render()
    # Both records are listpacks (a hashtable would be ~40 % larger): ~300 bytes each.
    assert report.families["sf:req:<id> (request record)"] < 400, report.render()
    assert report.families["sf:s:{<child>} (child record)"] < 400, report.render()


@pytest.fixture
def short_jobs(server: EmbeddedServer, redis: Redis) -> Iterator[Client]:
    """A worker that keeps RQ's job state 1 s, and a source with one finished turn."""
    Registry(redis).append(Registry(redis).create("src"), turn(1))
    name = worker_name()
    proc = start_worker(server.url, name, SESSIONFORK_JOB_TTL=1)
    try:
        wait_registered(redis, name)
        yield make_client(redis)
    finally:
        stop(proc)


def _expired(redis: Redis, request_id: str) -> bool:
    return not redis.exists(Job.key_for(request_id), f"rq:results:{request_id}") \
        and not redis.zcard("rq:finished:sessionfork")


def test_every_promise_holds_once_rq_forgot_the_job(short_jobs: Client, redis: Redis) -> None:
    client = short_jobs
    request = client.request("src", session_id="c1", request_id="r-1")
    first = client.fork("src", session_id="c1", request_id="r-1", timeout=10)
    assert first.ok
    wait_until(lambda: _expired(redis, "r-1"), 20, "RQ's job state of r-1 to expire")
    assert redis.hget(keys.request("r-1"), "child") == b"c1"  # a one-child outcome: compact fields
    assert set(redis.hkeys(keys.request("r-1"))) == {b"digest", b"request", b"child", b"header", b"parent"}

    # A late waiter gets the stored outcome.
    assert client.wait(request, timeout=5) == first
    # The same request id again: enqueued anew (RQ forgot it), answered with the same reply, nothing forked.
    assert client.fork("src", session_id="c1", request_id="r-1", timeout=10) == first
    assert Registry(redis).children("src") == ["c1"]
    assert [e.request for e in outcome_entries(redis)].count("r-1") == 1  # announced once
    # Reused for another request: IDEMPOTENCY_CONFLICT.
    other = client.fork("src", session_id="c2", request_id="r-1", timeout=10)
    assert not other.ok and other.code == "IDEMPOTENCY_CONFLICT"
    assert not Registry(redis).exists("c2")


def test_rq_shows_a_finished_job_for_job_ttl(server: EmbeddedServer, redis: Redis) -> None:
    Registry(redis).append(Registry(redis).create("src"), turn(1))
    name = worker_name()
    proc = start_worker(server.url, name, SESSIONFORK_JOB_TTL=300)
    try:
        wait_registered(redis, name)
        client = make_client(redis)
        # A producer's hash may ask for a week (the any-language example did): the worker caps it.
        queue_of(client).enqueue_call("sessionfork.jobs.fork", args=('{"source":"src","sessionId":"c1"}',),
                                  job_id="r-1", result_ttl=604800)
        finished = FinishedJobRegistry("sessionfork", connection=redis)
        wait_until(lambda: "r-1" in finished.get_job_ids(), 20, "the job to finish")
        job = Job.fetch("r-1", connection=redis, serializer=JSONSerializer)
        assert job.get_status() == "finished"
        assert job.return_value() is not None  # rq-dashboard shows the result meanwhile
        assert 0 < redis.ttl(Job.key_for("r-1")) <= 300
        assert 0 < redis.ttl("rq:results:r-1") <= 300
        assert redis.ttl(keys.request("r-1")) > 300  # the outcome outlives RQ's copy
    finally:
        stop(proc)


def test_with_retention_memory_stays_flat_and_without_it_grows(server: EmbeddedServer) -> None:
    # A steady create -> fork -> dispose workload (time = operations, retention = 300 of them).
    kept = steady_workload(server, 1200, retention_ops=300)
    assert kept.growth <= 1.10, (kept.middle, kept.end)
    grown = steady_workload(server, 1200, retention_ops=None)
    assert grown.growth > 1.5, (grown.middle, grown.end)
