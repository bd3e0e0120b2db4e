"""Fixtures and helpers of the fault tests (``test_faults_*.py``): faults around real worker processes.

Each test has its own server. Most faults are injected while a worker has a large fan-out in hand
(it shows as the worker's current job), so that they land inside a fork; the dequeue-window tests
inject them between RQ's dequeue and the start of the job, deterministically.

The fixtures are registered under the names ``procs``, ``own_server`` and ``rds``; the conftest.py of
the folders that use them imports them.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import Iterator

import msgspec
import pytest
from helpers import SETTINGS, kill, outcome_entries, session_keys, stored_outcome, turn
from redis import Redis
from rq.registry import StartedJobRegistry
from waits import wait_until

from sessionfork.clients.client import Client
from sessionfork.core import keys, records
from sessionfork.core.config import Settings
from sessionfork.core.connections import queue_client
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkRequest, ForkResult, Header
from sessionfork.embedded import EmbeddedServer
from sessionfork.worker import jobs

BIG = 8000
"""Children of the fan-out a fault is injected into (about 0.4 s of work for a worker): a kill
aimed between its first child and its outcome must land there on a loaded machine (with 4,000, the
serial phases side by side once saw the fan-out done before the kill landed)."""
FAULT_ENV = {"SESSIONFORK_MAX_FANOUT": str(BIG)}
"""The fault tests' workers: the defaults of ``sessionfork worker`` (batches of ``SESSIONFORK_BATCH``;
the fan-out of ``BIG`` children runs alone, after its take's batch), and fan-outs of ``BIG``."""
RECOVERY = 60.0


# -- fixtures -------------------------------------------------------------------------------------


@pytest.fixture(name="procs")
def procs_fixture() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts; any still running at teardown is SIGKILLed."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        kill(proc)


@pytest.fixture(name="own_server")
def own_server_fixture() -> Iterator[EmbeddedServer]:
    with EmbeddedServer() as srv:
        yield srv


@pytest.fixture(name="rds")
def rds_fixture(own_server: EmbeddedServer) -> Iterator[Redis]:
    client = queue_client(Settings(), own_server.url)
    yield client
    client.close()


# -- helpers --------------------------------------------------------------------------------------


def add_sources(redis: Redis, n: int) -> list[str]:
    """Sources src-0 .. src-(n-1); src-i has i + 1 finished turns."""
    registry = Registry(redis)
    names = []
    for i in range(n):
        handle = registry.create(f"src-{i}", cwd=f"/work/{i}")
        registry.append(handle, [e for t in range(i + 1) for e in turn(t)])
        names.append(handle.id)
    return names


def stream(client: Client, sources: list[str], n: int, *, big_at: int) -> list[ForkRequest]:
    """``n`` requests: forks into distinct ids, some generated ids, small fan-outs, and one fan-out of
    ``BIG`` children at position ``big_at``."""
    requests = []
    for i in range(n):
        src = sources[i % len(sources)]
        if i == big_at:
            requests.append(client.request(sources[0], count=BIG, request_id=f"big-{i}"))
        elif i % 10 == 3:
            requests.append(client.request(src, request_id=f"gen-{i}"))
        elif i % 25 == 7:
            requests.append(client.request(src, count=3, request_id=f"fan-{i}"))
        else:
            requests.append(client.request(src, session_id=f"child-{i}", request_id=f"one-{i}"))
    return requests


def submit_all(client: Client, requests: list[ForkRequest]) -> list[str]:
    return [client.submit(r) for r in requests]


def holder(redis: Redis, job_id: str) -> str | None:
    """The worker running ``job_id`` (RQ 2 and 3 both write it in the job hash when it starts)."""
    status, worker = redis.hmget(f"rq:job:{job_id}", ["status", "worker_name"])
    return worker.decode() if status == b"started" and worker else None


def wait_in_hand(redis: Redis, workers: list[str], job_id: str) -> str:
    """Wait until one of ``workers`` runs ``job_id`` (its current job, in RQ's started registry)."""
    started = StartedJobRegistry(queue=jobs.make_queue(redis, SETTINGS))
    found: list[str] = []

    def check() -> bool:
        who = holder(redis, job_id)
        if who is not None and who in workers and job_id in started.get_job_ids(cleanup=False):
            found.append(who)
        return bool(found)

    wait_until(check, 30, f"a worker to take {job_id}", interval=0.002)
    return found[0]


def missing_outcomes(redis: Redis, request_ids: list[str]) -> list[str]:
    pipe = redis.pipeline(transaction=False)
    for rid in request_ids:
        pipe.hmget(keys.request(rid), list(records.OUTCOME_MARKS))
    return [rid for rid, done in zip(request_ids, pipe.execute(), strict=True) if not any(done)]


def wait_all_outcomes(redis: Redis, request_ids: list[str], timeout: float = RECOVERY) -> None:
    wait_until(lambda: not missing_outcomes(redis, request_ids), timeout,
               f"an outcome for each of {len(request_ids)} requests", interval=0.05)


def children_of(reply: ForkResult) -> list[Header]:
    if reply.session is not msgspec.UNSET:
        return [reply.session]
    return [] if reply.sessions is msgspec.UNSET else list(reply.sessions)


def assert_consistent(redis: Redis, request_ids: list[str], sources: list[str]) -> None:
    """One outcome per request, none INTERNAL; every reported child exists as reported; no other session."""
    entries = outcome_entries(redis)
    per_request = Counter(e.request for e in entries)
    assert {rid: per_request[rid] for rid in request_ids} == dict.fromkeys(request_ids, 1)
    assert set(per_request) == set(request_ids)
    assert not [e.request for e in entries if e.code == "INTERNAL"]
    assert {e.code for e in entries} == {"OK"}, Counter(e.code for e in entries)

    reported: list[Header] = []
    for entry in entries:
        assert entry.raw == stored_outcome(redis, entry.request)
        assert isinstance(entry.reply, ForkResult) and entry.reply.failed is msgspec.UNSET
        reported.extend(children_of(entry.reply))
    pipe = redis.pipeline(transaction=False)
    for header in reported:
        pipe.hmget(keys.session(header.id), list(records.HEADER_FIELDS))
    stored = pipe.execute()
    mismatched = [h.id for h, raw in zip(reported, stored, strict=True)
                  if raw[0] is None or records.decode_header(h.id, *raw) != h]
    assert mismatched == []
    assert len({h.id for h in reported}) == len(reported)
    orphans = session_keys(redis) - set(sources) - {h.id for h in reported}
    assert orphans == set()


def stranded_jobs(redis: Redis) -> list[str]:
    """Jobs taken from the queue and not finished: in RQ's intermediate queue or started registry."""
    queue = jobs.make_queue(redis, SETTINGS)
    intermediate = [raw.decode() for raw in redis.lrange(queue.intermediate_queue_key, 0, -1)]
    return intermediate + StartedJobRegistry(queue=queue).get_job_ids(cleanup=False)
