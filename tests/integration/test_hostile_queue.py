"""Hostile queue entries against real worker processes (issue 10, #1, #2, #4, #9).

* #1 a job whose ``data`` has a bad argument shape is refused (``INVALID_REQUEST``), never raised:
  the worker lives on and serves the next request (property test over shapes);
* #2 a non-UTF-8 queue entry is refused at dequeue, and one in RQ's intermediate queue is purged
  by maintenance, which goes on recovering stranded jobs;
* #4 a worker registers again after its server restarted empty (``health`` sees it);
* #9 refused queue entries leave no job hash behind.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from helpers import SETTINGS, clean_environ, cli_args, start_worker, stop, turn, wait_registered, worker_name
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis import Redis

from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkFailure, ForkResult
from sessionfork.embedded import EmbeddedServer, wait_until
from sessionfork.queue import jobs
from sessionfork.queue.client import Client
from sessionfork.queue.jobs import fresh_workers
from sessionfork.queue.outcomes import wait_for_reply

QUEUE = f"rq:queue:{SETTINGS.queue}"
INTERMEDIATE = f"{QUEUE}:intermediate"
BOUND = 10.0


@dataclass(frozen=True)
class Live:
    server: EmbeddedServer
    redis: Redis
    proc: subprocess.Popen[bytes]
    name: str

    def assert_serving(self) -> None:
        """The worker is alive and answers a valid request."""
        assert self.proc.poll() is None, f"the worker exited with {self.proc.returncode}"
        reply = Client(self.redis, SETTINGS).fork("src", timeout=BOUND)
        assert isinstance(reply, ForkResult), reply


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    with EmbeddedServer() as server:
        redis = server.client()
        Registry(redis).append(Registry(redis).create("src"), turn(1))
        name = worker_name("hostile-q")
        proc = start_worker(server.url, name)
        try:
            wait_registered(redis, name)
            yield Live(server, redis, proc, name)
        finally:
            assert stop(proc) == 0
            redis.close()


def raw_job(redis: Redis, job_id: str, data: bytes) -> None:
    """A job hash and queue entry written by hand, as a raw producer (or the scheduler user) can."""
    redis.hset(f"rq:job:{job_id}", mapping={"data": data, "origin": SETTINGS.queue, "status": "queued"})
    redis.rpush(QUEUE, job_id)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=2),
    max_leaves=6)
_SHAPES = st.one_of(
    st.tuples(st.just(jobs.JOB_FUNCTION), _JSON, _JSON.filter(lambda a: not (isinstance(a, list) and len(a) == 1
                                                                             and isinstance(a[0], str))), _JSON),
    st.tuples(st.just(jobs.JOB_FUNCTION), st.none(), st.just(['{"source":"src"}']),
              st.dictionaries(st.text(min_size=1, max_size=3), _JSON, min_size=1, max_size=2)),
    st.tuples(_JSON.filter(lambda n: n != jobs.JOB_FUNCTION), st.none(), st.just(['{"source":"src"}']), st.just({})),
).map(list) | _JSON


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.sampled_from([[jobs.JOB_FUNCTION, None, None, {}], [jobs.JOB_FUNCTION, None, 5, {}],
                              [jobs.JOB_FUNCTION, None, {"a": 1}, {}], [jobs.JOB_FUNCTION, None, [], {}],
                              [jobs.JOB_FUNCTION, None, [1], {}], [jobs.JOB_FUNCTION, None, ["{}"], 7],
                              [None, None, ["{}"], {}], [jobs.JOB_FUNCTION], "a string", 42]) | _SHAPES)
def test_bad_argument_shapes_are_refused_and_the_worker_lives_on(live: Live, shape: Any) -> None:
    job_id = f"shape-{uuid.uuid4().hex[:12]}"
    raw_job(live.redis, job_id, json.dumps(shape).encode())
    reply = wait_for_reply(live.redis, job_id, SETTINGS.reply_channel, BOUND)
    assert isinstance(reply, ForkFailure) and reply.code == "INVALID_REQUEST", (shape, reply)
    assert live.proc.poll() is None, f"the worker exited with {live.proc.returncode} on {shape!r}"


def test_the_worker_still_serves_after_the_shapes(live: Live) -> None:
    live.assert_serving()


def test_a_non_utf8_queue_entry_is_refused_at_dequeue(live: Live) -> None:
    live.redis.rpush(QUEUE, b"p\xffq")
    wait_until(lambda: live.redis.llen(QUEUE) == 0 and live.redis.llen(INTERMEDIATE) == 0, BOUND,
               "the entry to be taken and refused")
    live.assert_serving()


def test_maintenance_purges_a_non_utf8_entry_and_still_recovers_stranded_jobs(live: Live) -> None:
    client = Client(live.redis, SETTINGS)
    request = client.request("src", request_id=f"stranded-{uuid.uuid4().hex[:8]}")
    # A job a killed worker left between dequeue and start: its hash, its id in the intermediate queue.
    payload = json.dumps({"requestId": request.request_id, "source": "src"})
    live.redis.hset(f"rq:job:{request.request_id}", mapping={
        "data": json.dumps([jobs.JOB_FUNCTION, None, [payload], {}]), "origin": SETTINGS.queue,
        "status": "queued"})
    live.redis.rpush(INTERMEDIATE, b"p\xffq", str(request.request_id))
    reply = wait_for_reply(live.redis, str(request.request_id), SETTINGS.reply_channel,
                           SETTINGS.abandoned_after + 3 * SETTINGS.maintenance_interval + BOUND)
    assert isinstance(reply, ForkResult), reply
    wait_until(lambda: b"p\xffq" not in live.redis.lrange(INTERMEDIATE, 0, -1), BOUND, "the purge")
    live.assert_serving()


def test_refused_queue_entries_leave_no_job_hash(live: Live) -> None:
    ids = [f"bad.{i}" for i in range(20)]  # "." is outside RQ's job id rule: RQ cannot load them
    for job_id in ids:
        raw_job(live.redis, job_id, json.dumps([jobs.JOB_FUNCTION, None, ['{"source":"src"}'], {}]).encode())
    wait_until(lambda: live.redis.llen(QUEUE) == 0 and live.redis.llen(INTERMEDIATE) == 0, BOUND, "the refusals")
    assert [k for k in live.redis.scan_iter(match="rq:job:bad.*")] == []
    live.assert_serving()


def test_a_worker_registers_again_after_its_server_restarted_empty() -> None:
    with EmbeddedServer() as server:
        redis = server.client()
        name = worker_name("reborn")
        proc = start_worker(server.url, name)
        try:
            wait_registered(redis, name)
            server.kill()
            server.start()  # same port, no data: the worker's registration is gone
            wait_until(lambda: name in fresh_workers(redis, SETTINGS), 30, "the worker to register again")
            health = subprocess.run(cli_args(server.url, "health"), env=clean_environ(), capture_output=True,
                                    text=True, timeout=60)
            assert health.returncode == 0 and name in health.stdout, health.stderr
        finally:
            assert stop(proc) == 0
            redis.close()
