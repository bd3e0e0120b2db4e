"""One worker process of ``bench.peers``: ``python -m bench.peer_runner SYSTEM URL JOBS``.

Imports SYSTEM's modules and prints ``up``. On a ``prepare`` line on stdin it queues JOBS jobs on
the server at URL with no worker running and builds the worker, then prints ``ready``. On a ``go``
line it works the jobs off and prints ``done SECONDS CPU_US COUNT``: the drain's wall time, this
process's CPU over it (``getrusage``: user and system, all threads) and the jobs its framework
reported done (-1: counted in Redis by the harness). Then it waits for a ``stop`` line, stops the
worker and exits 0. Anything else the frameworks print goes to stderr; stdout carries only these lines.

SYSTEM (``SYSTEMS``): ``sessionfork`` (the ``sessionfork worker --burst`` command, run in this
process, on fork requests of a 12-event source), ``rq`` (RQ's ``SimpleWorker``, burst), ``dramatiq``
(its ``Worker``, ``THREADS`` threads, Redis broker), ``huey`` (its consumer, ``THREADS`` threads).
"""

from __future__ import annotations

import importlib
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from redis import Redis

SYSTEMS = ("sessionfork", "rq", "dramatiq", "huey")
THREADS = 8
"""Worker threads of the Dramatiq and Huey processes: Dramatiq's default, Huey's common setting."""
DRAIN_LIMIT = 600.0
"""Seconds a threaded peer's drain may take before the runner reports what it counted."""
IMPORTS = {"sessionfork": ("bench.measure", "sessionfork.cli", "sessionfork.worker.fork_worker",
                           "sessionfork.ops.metrics", "sessionfork.worker.shard_check"),
           "rq": ("rq",), "dramatiq": ("dramatiq", "bench.peer_jobs"), "huey": ("huey", "bench.peer_jobs")}
"""What each system's runner imports before it says ``up`` (the harness may start them all at once)."""
SOURCE = "bench-src"
RQ_QUEUE = "peer"


def request_id(i: int) -> str:
    """The id of the ``i``-th fork request the sessionfork runner queues."""
    return f"pp-{i}"


@dataclass(frozen=True)
class Prepared:
    """A worker with its jobs queued: ``drain`` works them off and returns how many its framework
    reported done (-1: not counted in the process); ``stop`` ends a worker that does not end by itself."""

    drain: Callable[[], int]
    stop: Callable[[], None] = lambda: None


def prepare(system: str, url: str, jobs: int) -> Prepared:
    """Queue ``jobs`` jobs of ``system`` on the server at ``url`` and build its worker (not started)."""
    if system == "sessionfork":
        return _sessionfork(url, jobs)
    if system == "rq":
        return _rq(url, jobs)
    if system == "dramatiq":
        return _dramatiq(url, jobs)
    if system == "huey":
        return _huey(url, jobs)
    raise ValueError(f"unknown system {system!r}: one of {', '.join(SYSTEMS)}")


def _sessionfork(url: str, jobs: int) -> Prepared:
    from bench.measure import write_session
    from sessionfork.cli import cli
    from sessionfork.clients.client import Client
    from sessionfork.core.config import Settings
    from sessionfork.core.registry import Registry

    with Redis.from_url(url) as redis:
        write_session(Registry(redis), SOURCE, 12)
        client = Client(redis, Settings())
        for i in range(jobs):
            client.submit(client.request(SOURCE, request_id=request_id(i), session_id=f"pp-child-{i}"))
        client.close()

    def drain() -> int:
        try:
            cli.main(["--redis-url", url, "worker", "--burst", "--log-level", "ERROR"], prog_name="sessionfork",
                     obj={})
        except SystemExit as exit:  # the command line always exits; 0 once the queue is empty
            if exit.code:
                raise
        return -1

    return Prepared(drain)


def _rq(url: str, jobs: int) -> Prepared:
    from rq import Queue, SimpleWorker

    redis = Redis.from_url(url)
    queue = Queue(RQ_QUEUE, connection=redis)
    for _ in range(jobs):
        queue.enqueue("bench.measure.noop")
    worker = SimpleWorker([queue], connection=redis)

    def drain() -> int:
        worker.work(burst=True, logging_level="ERROR")
        return -1  # RQ keeps its count in Redis: the harness reads the finished and failed registries

    return Prepared(drain)


def _dramatiq(url: str, jobs: int) -> Prepared:
    import dramatiq

    from bench.peer_jobs import Done, dramatiq_app

    done = Done(jobs)
    broker, actor = dramatiq_app(url, done)
    for _ in range(jobs):
        actor.send()
    worker = dramatiq.Worker(broker, worker_threads=THREADS)

    def drain() -> int:
        worker.start()
        done.reached.wait(DRAIN_LIMIT)
        return done.count

    return Prepared(drain, worker.stop)


def _huey(url: str, jobs: int) -> Prepared:
    from bench.peer_jobs import Done, huey_app

    done = Done(jobs)
    huey, task = huey_app(url, done)
    for _ in range(jobs):
        task()
    consumer = huey.create_consumer(workers=THREADS, worker_type="thread")

    def drain() -> int:
        consumer.start()
        done.reached.wait(DRAIN_LIMIT)
        return done.count

    return Prepared(drain, lambda: consumer.stop(graceful=True))


def cpu_us() -> float:
    """This process's CPU so far (user + system, all its threads), in µs."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return (usage.ru_utime + usage.ru_stime) * 1e6


def main(argv: list[str] | None = None) -> int:
    system, url, jobs = argv if argv is not None else sys.argv[1:]
    out, sys.stdout = sys.stdout, sys.stderr  # the frameworks' own prints must not mix with the protocol
    for module in IMPORTS[system]:
        importlib.import_module(module)
    print("up", file=out, flush=True)
    if sys.stdin.readline().strip() != "prepare":
        return 1
    prepared = prepare(system, url, int(jobs))
    print("ready", file=out, flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1
    cpu, began = cpu_us(), time.perf_counter()
    count = prepared.drain()
    seconds, cpu = time.perf_counter() - began, cpu_us() - cpu
    print(f"done {seconds!r} {cpu!r} {count}", file=out, flush=True)
    sys.stdin.readline()  # stop (or the harness closed stdin)
    prepared.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
