"""Paths the rest of the suite did not reach, each
through real worker processes: the outcome TTL, retries spent (a replica wait that never succeeds,
retried by RQ, then INTERNAL naming the child), ``SESSIONFORK_JOB_TIMEOUT`` exceeded, a waiter
whose connection drops, and the plain ``rq worker`` path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import SETTINGS, clean_environ, make_client, start_worker, stop, turn, wait_registered, worker_name
from redis import Redis
from rq.job import Job
from waits import wait_until

from sessionfork.core import keys
from sessionfork.core.config import Settings
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkFailure, ForkResult, Header
from sessionfork.embedded import EmbeddedServer
from sessionfork.worker import jobs
from sessionfork.worker.outcomes import Outcomes

pytestmark = pytest.mark.rq  # runs again on RQ 2.12 (run.py test)

TIMEOUT = 20.0
DAY = 24 * 3600


@pytest.fixture
def source(registry: Registry) -> str:
    registry.append(registry.create("src"), turn(1))
    return "src"


@pytest.fixture
def worker_env() -> dict[str, str]:
    return {}


@pytest.fixture
def worker(server: EmbeddedServer, redis: Redis, worker_env: dict[str, str]) -> Iterator[None]:
    name = worker_name("paths")
    proc = start_worker(server.url, name, **worker_env)
    wait_registered(redis, name)
    yield
    assert stop(proc) == 0


def test_an_outcome_is_kept_for_the_outcome_ttl_and_its_job_for_the_job_ttl(redis: Redis, source: str,
                                                                           worker: None) -> None:
    reply = make_client(redis).fork(source, session_id="kept", request_id="ttl-1", timeout=TIMEOUT)
    assert reply.ok
    assert DAY - 60 < redis.ttl(keys.request("ttl-1")) <= DAY  # SESSIONFORK_OUTCOME_TTL's default
    # the outcome is announced first, then RQ's finish gives the job hash its result TTL: the
    # shorter SESSIONFORK_JOB_TTL (the outcome itself lives in the request's record)
    wait_until(lambda: redis.hget("rq:job:ttl-1", "status") == b"finished", TIMEOUT, "RQ to finish the job")
    job_ttl = Settings().job_ttl
    assert job_ttl - 60 < redis.ttl("rq:job:ttl-1") <= job_ttl


@pytest.mark.parametrize("worker_env", [{"SESSIONFORK_WAIT_REPLICAS": "1", "SESSIONFORK_WAIT_TIMEOUT_MS": "20",
                                         "SESSIONFORK_RETRIES": "1"}])
def test_retries_spent_on_a_replica_wait_end_internal_naming_the_child(redis: Redis, registry: Registry,
                                                                       source: str, worker: None) -> None:
    # No replica exists: every attempt creates (or finds) the child, then WAIT fails; RQ retries once.
    client = make_client(redis, retries=1)
    reply = client.fork(source, session_id="unreplicated", request_id="spent-1", timeout=TIMEOUT)
    assert isinstance(reply, ForkFailure) and reply.code == "INTERNAL", reply
    assert "NotReplicated" in reply.message and "created before the failure: unreplicated" in reply.message
    job = Job.fetch("spent-1", connection=redis, serializer=jobs.JSONSerializer)
    assert job.retries_left == 0  # the first attempt was retried, the second was the last
    assert registry.header("unreplicated").parent_session == source


@pytest.mark.parametrize("worker_env", [{"SESSIONFORK_JOB_TIMEOUT": "1", "SESSIONFORK_RETRIES": "0",
                                         "SESSIONFORK_WAIT_REPLICAS": "1", "SESSIONFORK_WAIT_TIMEOUT_MS": "3000"}])
def test_a_job_over_its_timeout_ends_internal(redis: Redis, registry: Registry, source: str, worker: None) -> None:
    # WAIT blocks 3 s for a replica that does not exist: RQ's 1 s job timeout fires inside it.
    client = make_client(redis, retries=0, job_timeout=1)
    reply = client.fork(source, session_id="slow", request_id="timeout-1", timeout=TIMEOUT)
    assert isinstance(reply, ForkFailure) and reply.code == "INTERNAL", reply
    assert "JobTimeoutException" in reply.message and "created before the failure: slow" in reply.message
    # the outcome is recorded first, then RQ fails the job
    wait_until(lambda: redis.hget("rq:job:timeout-1", "status") == b"failed", TIMEOUT, "RQ to fail the job")


def test_a_waiter_whose_connection_drops_still_gets_its_reply(redis: Redis, source: str) -> None:
    client = make_client(redis)
    request = client.request(source, session_id="late-child", request_id="reconnect-1")
    client.submit(request)  # no worker: the reply is recorded below, once the waiter lost its link
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(client.wait(request, TIMEOUT)))
    waiter.start()
    try:
        wait_until(lambda: redis.pubsub_numsub(keys.DEFAULT_REPLY_CHANNEL)[0][1] == 1, TIMEOUT, "the waiter")
        assert redis.execute_command("CLIENT", "KILL", "TYPE", "pubsub") == 1
        reply = ForkResult(request_id="reconnect-1", session=Header(version=0, id="late-child", created_at=1))
        Outcomes(redis, ttl=60, stream_maxlen=10).record(reply, keys.DEFAULT_REPLY_CHANNEL)
    finally:
        waiter.join(TIMEOUT + 5)
    assert got == [reply]


def test_plain_rq_worker_runs_a_fork_job(server: EmbeddedServer, redis: Redis, registry: Registry,
                                         source: str) -> None:
    client = make_client(redis)
    request = client.request(source, session_id="plain-child", request_id="plain-1")
    client.submit(request)
    rq_cli = Path(sys.executable).parent / "rq"
    out = subprocess.run([str(rq_cli), "worker", "--burst", "--url", server.url, "-w", "rq.SimpleWorker",
                          "--serializer", "sessionfork.jobs.JSONSerializer", SETTINGS.queue],
                         env={**clean_environ(), "PYTHONPATH": os.pathsep.join(sys.path)}, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    reply = client.wait(request, 1)
    assert isinstance(reply, ForkResult) and reply.session is not None
    assert registry.header("plain-child").parent_session == source
    assert Job.fetch("plain-1", connection=redis, serializer=jobs.JSONSerializer).get_status() == "finished"
