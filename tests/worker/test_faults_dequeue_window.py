"""Faults in the window between RQ's dequeue and the start of the job, injected deterministically: a
SIGTERM there leaves the job queued or done; the job of a worker SIGKILLed there is recovered quickly."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from fault_fixtures import add_sources, wait_all_outcomes
from helpers import SETTINGS, clean_environ, make_client, start_worker, stored_outcome, worker_name
from redis import Redis
from waits import exited

from sessionfork.embedded import EmbeddedServer
from sessionfork.worker import jobs

pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.rq]  # serial: as every fault test (test_faults_*.py)


# -- the dequeue window (src bug) -----------------------------------------------------------------

DIES_AFTER_DEQUEUE = """
import os, signal, sys
from sessionfork.core import config
from sessionfork.worker import jobs
from sessionfork.cli.app import Context
from sessionfork.worker.request_worker import RequestWorker

url, name, signame = sys.argv[1:4]


class DiesAfterDequeue(RequestWorker):
    # Gets signal `signame` right after RQ's dequeue returned a job, before the job starts: the
    # moment a signal or a crash can hit any worker busy with a stream of requests.
    def dequeue_job_and_maintain_ttl(self, timeout, max_idle_time=None):
        result = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        if result is not None:
            os.kill(os.getpid(), getattr(signal, signame))
        return result


settings = config.from_environ(os.environ, redis_url=url)
service = Context(settings).service()
redis = service.outcomes.redis
DiesAfterDequeue([jobs.make_queue(redis, settings)], service=service, connection=redis,
                 abandoned_after=settings.abandoned_after, maintenance_interval=settings.maintenance_interval,
                 worker_ttl=settings.worker_ttl, name=name).work(logging_level="WARNING")
"""


def start_dying_worker(url: str, signame: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", DIES_AFTER_DEQUEUE, url, worker_name("dying"), signame],
                            env=clean_environ(), stdin=subprocess.DEVNULL)


def test_sigterm_right_after_dequeue_leaves_the_job_queued_or_done(
        own_server: EmbeddedServer, rds: Redis, procs: list[subprocess.Popen[bytes]]) -> None:
    add_sources(rds, 1)
    client = make_client(rds)
    rid = client.submit(client.request("src-0", session_id="c"))
    proc = start_dying_worker(own_server.url, "SIGTERM")
    procs.append(proc)

    assert exited(proc, 20) == 0

    assert stored_outcome(rds, rid) is not None or jobs.make_queue(rds, SETTINGS).job_ids == [rid]


def test_job_of_a_worker_killed_right_after_dequeue_is_recovered_quickly(
        own_server: EmbeddedServer, rds: Redis, procs: list[subprocess.Popen[bytes]]) -> None:
    add_sources(rds, 1)
    client = make_client(rds)
    rid = client.submit(client.request("src-0", session_id="c"))
    proc = start_dying_worker(own_server.url, "SIGKILL")
    procs.append(proc)
    assert exited(proc, 20) == -signal.SIGKILL

    # WORKER_TTL 16 makes RQ's idle dequeue time-out 1 s, so maintenance runs at least every ~1 s.
    procs.append(start_worker(own_server.url, worker_name("rescuer"), SESSIONFORK_WORKER_TTL=16))
    # Stranded between dequeue and start: first seen by one maintenance pass, requeued by a pass
    # at least abandoned_after later.
    bound = SETTINGS.abandoned_after + 2 * SETTINGS.maintenance_interval + 1
    wait_all_outcomes(rds, [rid], timeout=bound + 4)

    assert stored_outcome(rds, rid) is not None
