"""SIGKILLed workers: a storm of kills mid-fan-out leaves one outcome per request and no orphan; a job
killed on its last attempt still gets its one outcome."""

from __future__ import annotations

import signal
import subprocess
import threading

import msgspec
import pytest
from fault_fixtures import (
    BIG,
    FAULT_ENV,
    add_sources,
    assert_consistent,
    children_of,
    stranded_jobs,
    stream,
    submit_all,
    wait_all_outcomes,
    wait_in_hand,
)
from helpers import SETTINGS, kill, make_client, start_worker, stored_outcome, turn, worker_name
from redis import Redis
from rq.job import Job
from rq.registry import FailedJobRegistry
from waits import wait_until

from sessionfork.core import keys
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkResult
from sessionfork.embedded import EmbeddedServer
from sessionfork.worker import jobs

pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.rq]  # serial: the storm

STORM_ENV = {**FAULT_ENV, "SESSIONFORK_ABANDONED_AFTER": "8"}
"""For a test that counts retries: a job runs without heartbeats, so a ``BIG`` fan-out slower than the
tests' 2-second abandonment (a loaded machine) would count as abandoned once more than it was killed."""


# -- SIGKILL --------------------------------------------------------------------------------------


def test_sigkill_storm_leaves_one_outcome_per_request_and_no_orphan(
        own_server: EmbeddedServer, rds: Redis, procs: list[subprocess.Popen[bytes]]) -> None:
    sources = add_sources(rds, 4)
    client = make_client(rds)
    requests = stream(client, sources, 200, big_at=60)
    ids = submit_all(client, requests)
    names = [worker_name("storm"), worker_name("storm")]
    workers = {name: start_worker(own_server.url, name, **STORM_ENV) for name in names}
    procs.extend(workers.values())

    appending, appender_redis = threading.Event(), own_server.client()
    appender = threading.Thread(target=append_turns, args=(Registry(appender_redis), "src-0", appending))
    appender.start()  # whole turns, one batch each: src-0 stays forkable while it grows
    try:
        wait_until(lambda: rds.xlen(keys.OUTCOME_STREAM) >= 40, 30, "40 outcomes")
        victim = wait_in_hand(rds, names, "big-60")
        # Land the kill between the children and the outcome: once the first planned child exists.
        wait_until(lambda: rds.hget(keys.request("big-60"), "children") is not None, 30, "big-60's plan")
        first = msgspec.json.decode(rds.hget(keys.request("big-60"), "children") or b"", type=list[str])[0]
        wait_until(lambda: rds.exists(keys.session(first)), 30, "big-60's first child", interval=0.001)
        kill(workers[victim])
        assert rds.hget(keys.session(first), "req") == b"big-60"
        assert stored_outcome(rds, "big-60") is None  # killed after some children, before the outcome
        replacement = worker_name("replacement")
        procs.append(start_worker(own_server.url, replacement, **STORM_ENV))
        wait_all_outcomes(rds, ids)
    finally:
        appending.set()
        appender.join(30)
        appender_redis.close()

    assert workers[victim].returncode == -signal.SIGKILL
    assert_consistent(rds, ids, sources)
    wait_until(lambda: not stranded_jobs(rds), 10, "RQ to settle every job")
    assert Job.fetch("big-60", connection=rds, serializer=jobs.JSONSerializer).retries_left == 2  # killed once
    big = msgspec.json.decode(stored_outcome(rds, "big-60") or b"", type=ForkResult)
    assert len(children_of(big)) == BIG
    seeds = {(h.parent_session, h.seed_length) for h in children_of(big)}
    assert len(seeds) == 1, seeds  # one snapshot for every child, before and after the crash
    (parent, seed), = seeds
    registry = Registry(rds)
    assert parent == "src-0" and isinstance(seed, int) and seed >= 4
    assert registry.events(children_of(big)[-1].id) == registry.events("src-0")[:seed]
    survivor = next(p for n, p in workers.items() if n != victim)
    assert survivor.poll() is None



def test_a_job_killed_on_its_last_attempt_still_gets_its_one_outcome(
        own_server: EmbeddedServer, rds: Redis, procs: list[subprocess.Popen[bytes]]) -> None:
    """No retry left: RQ fails the abandoned job (``AbandonedJobError``), and the worker that finds
    it runs its request once more, so the request still gets its one outcome."""
    add_sources(rds, 1)
    client = make_client(rds, retries=0)
    rid = client.submit(client.request("src-0", count=BIG, request_id="last-big"))
    victim = start_worker(own_server.url, worker_name("last"), **FAULT_ENV)
    procs.append(victim)
    wait_until(lambda: rds.hget(keys.request(rid), "children") is not None, 30, "the request's plan")
    first = msgspec.json.decode(rds.hget(keys.request(rid), "children") or b"", type=list[str])[0]
    wait_until(lambda: rds.exists(keys.session(first)), 30, "its first child", interval=0.001)
    kill(victim)
    assert stored_outcome(rds, rid) is None  # the kill landed mid-job: some children, no outcome
    assert not Job.fetch(rid, connection=rds, serializer=jobs.JSONSerializer).retries_left  # its last attempt

    procs.append(start_worker(own_server.url, worker_name("finisher"), **FAULT_ENV))
    wait_all_outcomes(rds, [rid], timeout=20)  # abandoned after 2 s, a pass a second
    reply = msgspec.json.decode(stored_outcome(rds, rid) or b"", type=ForkResult)
    assert len(children_of(reply)) == BIG and children_of(reply)[0].id == first  # finished, same children
    assert len({h.seed_length for h in children_of(reply)}) == 1
    wait_until(lambda: rid in FailedJobRegistry(queue=jobs.make_queue(rds, SETTINGS)).get_job_ids(cleanup=False),
               10, "RQ to fail the abandoned job")  # the outcome came by the abandoned-job path

def append_turns(registry: Registry, source: str, stop_: threading.Event) -> None:
    """Append whole turns to ``source`` (one batch each) until ``stop_`` is set."""
    n = 100
    while not stop_.is_set():
        registry.append(source, turn(n))
        n += 1
