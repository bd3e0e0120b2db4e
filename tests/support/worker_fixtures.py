"""The worker tests' fixtures and helpers: one real ``sessionfork worker`` process per test module
(on the session's server), a client of it, a source session, and pub/sub and job-status helpers.

The fixtures are registered under the names ``worker``, ``client`` and ``source``; the conftest.py of
the folders that use them imports them.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from helpers import live_client, registered_worker, turn
from redis import Redis
from redis.client import PubSub
from rq.job import Job, JobStatus
from waits import wait_until

from sessionfork.clients.client import Client
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkFailure, Reply
from sessionfork.embedded import EmbeddedServer

TIMEOUT = 10.0


@pytest.fixture(scope="module", name="worker")
def worker_fixture(server: EmbeddedServer) -> Iterator[subprocess.Popen[bytes]]:
    """One worker process for the module, on the session's server (which tests flush, not kill)."""
    with registered_worker(server, "module") as proc:
        yield proc


@pytest.fixture(name="client")
def client_fixture(redis: Redis, worker: subprocess.Popen[bytes]) -> Client:
    return live_client(redis, worker)


@pytest.fixture(name="source")
def source_fixture(registry: Registry) -> str:
    """Session "a": live, one finished turn (4 events), cwd /workspace."""
    registry.append(registry.create("a", cwd="/workspace"), turn(1))
    return "a"


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
    raise AssertionError(f"no message within {timeout}s")


def job_status(redis: Redis, job_id: str) -> JobStatus | None:
    return Job(job_id, connection=redis).get_status(refresh=True)


def wait_job_status(redis: Redis, job_id: str, status: JobStatus) -> None:
    wait_until(lambda: job_status(redis, job_id) == status, TIMEOUT, f"job {job_id} to be {status.value}")


def failure(reply: Reply) -> tuple[str, str]:
    assert isinstance(reply, ForkFailure), reply
    return reply.code, reply.message
