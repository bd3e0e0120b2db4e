"""Faults around real worker processes: SIGKILL, SIGTERM, a Redis restart, dropped connections.

Each test has its own server. Most faults are injected while a worker has a large fan-out in hand
(it shows as the worker's current job), so that they land inside a fork; the two tests at the end
inject them in the window between RQ's dequeue and the start of the job, deterministically.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator

import msgspec
import pytest
from helpers import (
    SETTINGS,
    clean_environ,
    kill,
    make_client,
    outcome_entries,
    session_keys,
    start_worker,
    stop,
    stored_outcome,
    turn,
    wait_registered,
    worker_name,
)
from redis import Redis
from rq import SimpleWorker
from rq.job import Job
from rq.registry import FailedJobRegistry, StartedJobRegistry

from sessionfork.core import keys, records
from sessionfork.core.config import Settings
from sessionfork.core.connections import queue_client
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkRequest, ForkResult, Header
from sessionfork.embedded import EmbeddedServer, wait_until
from sessionfork.queue import jobs
from sessionfork.queue.client import Client

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # serial: an idle stop's time bound, the storm

BIG = 4000
"""Children of the fan-out a fault is injected into (about 0.2 s of work for a worker)."""
FAULT_ENV = {"SESSIONFORK_MAX_FANOUT": str(BIG)}
STORM_ENV = {**FAULT_ENV, "SESSIONFORK_ABANDONED_AFTER": "8"}
"""For a test that counts retries: a job runs without heartbeats, so a ``BIG`` fan-out slower than the
tests' 2-second abandonment (a loaded machine) would count as abandoned once more than it was killed."""
RECOVERY = 60.0
IDLE_STOP = 2.5  # seconds from SIGTERM to exit of an idle worker (a second, plus a loaded machine)


# -- fixtures -------------------------------------------------------------------------------------


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts; any still running at teardown is SIGKILLed."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        kill(proc)


@pytest.fixture
def own_server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer() as srv:
        yield srv


@pytest.fixture
def durable_server() -> Iterator[EmbeddedServer]:
    """A server whose data survives SIGKILL + start() on the same port (AOF, fsync always)."""
    with EmbeddedServer(extra_args=["--appendonly", "yes", "--appendfsync", "always"]) as srv:
        yield srv


@pytest.fixture
def rds(own_server: EmbeddedServer) -> Iterator[Redis]:
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


def current_job(redis: Redis, worker: str) -> str | None:
    """The job ``worker`` runs now, through RQ's API (RQ 2 keeps it in the worker's hash, RQ 3 in
    the worker's execution index)."""
    found = SimpleWorker.find_by_key(SimpleWorker.redis_worker_namespace_prefix + worker, connection=redis)
    return None if found is None else found.get_current_job_id()


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
    taken, rest = ids[:31], ids[31:]
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
    assert proc.wait(20) == 0

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


# -- the dequeue window (src bug) -----------------------------------------------------------------

DIES_AFTER_DEQUEUE = """
import os, signal, sys
from sessionfork.core import config
from sessionfork.queue import jobs
from sessionfork.cli.app import Context
from sessionfork.queue.worker import ForkWorker

url, name, signame = sys.argv[1:4]


class DiesAfterDequeue(ForkWorker):
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

    assert proc.wait(20) == 0

    assert stored_outcome(rds, rid) is not None or jobs.make_queue(rds, SETTINGS).job_ids == [rid]


def test_job_of_a_worker_killed_right_after_dequeue_is_recovered_quickly(
        own_server: EmbeddedServer, rds: Redis, procs: list[subprocess.Popen[bytes]]) -> None:
    add_sources(rds, 1)
    client = make_client(rds)
    rid = client.submit(client.request("src-0", session_id="c"))
    proc = start_dying_worker(own_server.url, "SIGKILL")
    procs.append(proc)
    assert proc.wait(20) == -signal.SIGKILL

    # WORKER_TTL 16 makes RQ's idle dequeue time-out 1 s, so maintenance runs at least every ~1 s.
    procs.append(start_worker(own_server.url, worker_name("rescuer"), SESSIONFORK_WORKER_TTL=16))
    # Stranded between dequeue and start: first seen by one maintenance pass, requeued by a pass
    # at least abandoned_after later.
    bound = SETTINGS.abandoned_after + 2 * SETTINGS.maintenance_interval + 1
    wait_all_outcomes(rds, [rid], timeout=bound + 4)

    assert stored_outcome(rds, rid) is not None
