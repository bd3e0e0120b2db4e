"""SIGTERM to a worker: the fork in hand is finished and the rest left queued for the next worker;
an idle worker exits 0 at once."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
from fault_fixtures import (
    FAULT_ENV,
    add_sources,
    assert_consistent,
    missing_outcomes,
    stranded_jobs,
    stream,
    submit_all,
    wait_all_outcomes,
    wait_in_hand,
)
from helpers import SETTINGS, make_client, start_worker, stop, wait_registered, worker_name
from redis import Redis
from rq import SimpleWorker
from waits import exited

from sessionfork.core.config import Settings
from sessionfork.embedded import EmbeddedServer
from sessionfork.worker import jobs

pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.rq]  # serial: an idle stop's time bound

IDLE_STOP = 2.5  # seconds from SIGTERM to exit of an idle worker (a second, plus a loaded machine)


def current_job(redis: Redis, worker: str) -> str | None:
    """The job ``worker`` runs now, through RQ's API (RQ 2 keeps it in the worker's hash, RQ 3 in
    the worker's execution index)."""
    found = SimpleWorker.find_by_key(SimpleWorker.redis_worker_namespace_prefix + worker, connection=redis)
    return None if found is None else found.get_current_job_id()


# -- SIGTERM --------------------------------------------------------------------------------------


def test_sigterm_finishes_the_fork_in_hand_exits_0_and_leaves_the_rest_queued(
        own_server: EmbeddedServer, rds: Redis, procs: list[subprocess.Popen[bytes]]) -> None:
    sources = add_sources(rds, 3)
    client = make_client(rds)
    ids = submit_all(client, stream(client, sources, 90, big_at=30))
    name = worker_name("term")
    proc = start_worker(own_server.url, name, **FAULT_ENV)
    procs.append(proc)

    wait_in_hand(rds, [name], "big-30")
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(20)

    assert code == 0
    # The worker's first take held the queue's first SESSIONFORK_BATCH requests (all queued before
    # it started): their batch ran, then the fan-out among them alone, in hand at the SIGTERM.
    took = max(31, Settings().batch)
    taken, rest = ids[:took], ids[took:]
    assert missing_outcomes(rds, taken) == []
    assert missing_outcomes(rds, rest) == rest
    assert jobs.make_queue(rds, SETTINGS).job_ids == rest
    assert stranded_jobs(rds) == []
    assert current_job(rds, name) is None


def test_requests_left_queued_by_sigterm_are_answered_by_the_next_worker(
        own_server: EmbeddedServer, rds: Redis, procs: list[subprocess.Popen[bytes]]) -> None:
    sources = add_sources(rds, 3)
    client = make_client(rds)
    ids = submit_all(client, stream(client, sources, 90, big_at=30))
    first = worker_name("term")
    proc = start_worker(own_server.url, first, **FAULT_ENV)
    procs.append(proc)
    wait_in_hand(rds, [first], "big-30")
    proc.send_signal(signal.SIGTERM)
    assert exited(proc, 20) == 0

    procs.append(start_worker(own_server.url, worker_name("next"), **FAULT_ENV))
    wait_all_outcomes(rds, ids)

    assert_consistent(rds, ids, sources)


def test_idle_worker_exits_0_on_sigterm(own_server: EmbeddedServer, rds: Redis,
                                        procs: list[subprocess.Popen[bytes]]) -> None:
    name = worker_name("idle")
    proc = start_worker(own_server.url, name)
    procs.append(proc)
    wait_registered(rds, name)

    began = time.monotonic()
    assert stop(proc) == 0
    assert time.monotonic() - began < IDLE_STOP  # "an idle worker stops within a second"

    assert name not in [w.name for w in SimpleWorker.all(connection=rds)]
