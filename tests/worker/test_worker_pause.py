"""A paused shard (``ops.pauses``: RQ's suspension on its queue server): its worker, idle when the
pause comes, takes no job until resumed; producers still enqueue; resuming restarts it."""

from __future__ import annotations

import time

import pytest
from helpers import SETTINGS, make_client, registered_worker, turn
from redis import Redis
from waits import wait_until
from worker_fixtures import TIMEOUT

from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkResult
from sessionfork.embedded import EmbeddedServer
from sessionfork.ops import pauses
from sessionfork.worker.jobs import make_queue, worker_rows

pytestmark = pytest.mark.rq  # runs again on RQ 2.12 (run.py test)


def _row(redis: Redis) -> tuple[str, int]:
    (row,) = worker_rows(redis, SETTINGS)
    return row.state, row.last_heartbeat


def test_an_idle_workers_shard_paused_takes_no_job_until_resumed(server: EmbeddedServer) -> None:
    with registered_worker(server, "pause") as proc, server.client() as redis:
        registry = Registry(redis)
        registry.append(registry.create("p", cwd="/w"), turn(1))
        client = make_client(redis)
        assert isinstance(client.fork("p", timeout=TIMEOUT), ForkResult)  # it serves

        pauses.pause(redis, "test")
        wait_until(lambda: _row(redis)[0] == "suspended", TIMEOUT, "the idle worker to see the pause")
        request = client.request("p", session_id="p-paused")
        client.submit(request)  # producers still enqueue
        queued_ms = time.time() * 1000
        # Suspended, the worker looks at the pause once a second and heart-beats each time: a beat
        # a second past the enqueue is a look taken with the job waiting.
        wait_until(lambda: _row(redis)[1] > queued_ms + 1000, TIMEOUT, "the paused worker to look again")
        assert make_queue(redis, SETTINGS).count == 1
        assert _row(redis)[0] == "suspended"

        pauses.resume(redis, "test")

        reply = client.wait(request, TIMEOUT)
        assert isinstance(reply, ForkResult) and reply.ok
        assert proc.poll() is None  # the worker still runs
