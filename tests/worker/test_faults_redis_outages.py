"""A worker rides out a Redis restart and dropped connections mid-fan-out: no outcome lost or
doubled, the job in hand neither failed nor retried."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from fault_fixtures import (
    FAULT_ENV,
    add_sources,
    assert_consistent,
    stream,
    submit_all,
    wait_all_outcomes,
    wait_in_hand,
)
from helpers import SETTINGS, make_client, start_worker, stop, worker_name
from redis import Redis
from rq.job import Job
from rq.registry import FailedJobRegistry
from waits import wait_until

from sessionfork.core import keys
from sessionfork.core.config import Settings
from sessionfork.core.connections import queue_client
from sessionfork.embedded import EmbeddedServer
from sessionfork.worker import jobs

pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.rq]  # serial: as every fault test (test_faults_*.py)


@pytest.fixture
def durable_server() -> Iterator[EmbeddedServer]:
    """A server whose data survives SIGKILL + start() on the same port (AOF, fsync always)."""
    with EmbeddedServer(extra_args=["--appendonly", "yes", "--appendfsync", "always"]) as srv:
        yield srv


# -- Redis restart and dropped connections --------------------------------------------------------


def test_worker_rides_out_a_redis_restart(durable_server: EmbeddedServer,
                                          procs: list[subprocess.Popen[bytes]]) -> None:
    redis = queue_client(Settings(), durable_server.url)
    try:
        sources = add_sources(redis, 3)
        client = make_client(redis)
        ids = submit_all(client, stream(client, sources, 50, big_at=20))
        name = worker_name("restart")
        proc = start_worker(durable_server.url, name, **FAULT_ENV)
        procs.append(proc)
        wait_until(lambda: redis.xlen(keys.OUTCOME_STREAM) >= 10, 30, "10 outcomes")
        wait_in_hand(redis, [name], "big-20")

        durable_server.kill()
        durable_server.start()
        wait_all_outcomes(redis, ids)

        assert proc.poll() is None
        assert_consistent(redis, ids, sources)
        assert_not_failed(redis, "big-20")
        assert stop(proc) == 0
    finally:
        redis.close()


def test_worker_rides_out_dropped_connections(own_server: EmbeddedServer, rds: Redis,
                                              procs: list[subprocess.Popen[bytes]]) -> None:
    sources = add_sources(rds, 3)
    client = make_client(rds)
    ids = submit_all(client, stream(client, sources, 50, big_at=20))
    name = worker_name("drop")
    proc = start_worker(own_server.url, name, **FAULT_ENV)
    procs.append(proc)
    wait_in_hand(rds, [name], "big-20")

    killed = rds.execute_command("CLIENT", "KILL", "TYPE", "normal")
    wait_all_outcomes(rds, ids)

    assert killed >= 1
    assert proc.poll() is None
    assert_consistent(rds, ids, sources)
    assert_not_failed(rds, "big-20")
    assert stop(proc) == 0


def assert_not_failed(redis: Redis, in_hand: str) -> None:
    """The job in hand during the outage was not failed and retried: the worker waited for Redis."""
    assert Job.fetch(in_hand, connection=redis, serializer=jobs.JSONSerializer).retries_left == SETTINGS.retries
    assert FailedJobRegistry(queue=jobs.make_queue(redis, SETTINGS)).get_job_ids(cleanup=False) == []
