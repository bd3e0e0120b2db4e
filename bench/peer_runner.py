"""One worker process of ``bench.peers``: ``python -m bench.peer_runner SYSTEM URL JOBS``.

Imports SYSTEM's modules and prints ``up``. On a ``prepare`` line on stdin it queues JOBS jobs on
the server at URL with no worker running and builds the worker, then prints ``ready``. On a ``go``
line it works the jobs off; the moment its framework reports the last one done (``Done``), it prints
``done SECONDS CPU_US COUNT``: the wall time from ``go``, this process's CPU over it (``getrusage``:
user and system, all threads) and the jobs reported done (fewer than JOBS when the drain ended
short: the harness's check then fails). A worker's own shutdown (RQ's ends its command
subscription, up to a second) is not measured. Then it idles until the harness ends it. Anything
else the frameworks print goes to stderr; stdout carries only these lines.

SYSTEM (``SYSTEMS``): ``sessionfork`` (the ``sessionfork worker --burst`` command, run in this
process, on fork requests of a 12-event source, with the default settings; a fork counts done when
the worker hands its outcome to its observer, after the record), ``sessionfork-1`` (the same with
``SESSIONFORK_BATCH=1``: one request at a time), ``rq`` (RQ's ``SimpleWorker``, burst; a job counts
done after RQ's success handling), ``dramatiq`` (its ``Worker``, ``THREADS`` threads, Redis broker;
after the ack), ``huey`` (its consumer, ``THREADS`` threads; at the ``complete`` signal).
"""

from __future__ import annotations

import importlib
import resource
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis import Redis

SYSTEMS = ("sessionfork", "sessionfork-1", "rq", "dramatiq", "huey")
THREADS = 8
"""Worker threads of the Dramatiq and Huey processes: Dramatiq's default, Huey's common setting."""
DRAIN_LIMIT = 600.0
"""Seconds a threaded peer's drain may take before the runner reports what it counted."""
_SESSIONFORK = ("bench.measure", "sessionfork.cli", "sessionfork.worker.request_worker", "sessionfork.ops.metrics",
                "sessionfork.worker.shard_check")
SETTINGS = {"sessionfork": {}, "sessionfork-1": {"SESSIONFORK_BATCH": "1"}}
"""The environment each sessionfork system's worker command reads (the runner's own is not read)."""
IMPORTS = {"sessionfork": _SESSIONFORK, "sessionfork-1": _SESSIONFORK,
           "rq": ("rq",), "dramatiq": ("dramatiq", "bench.peer_jobs"), "huey": ("huey", "bench.peer_jobs")}
"""What each system's runner imports before it says ``up`` (the harness may start them all at once)."""
SOURCE = "bench-src"
RQ_QUEUE = "peer"


def request_id(i: int) -> str:
    """The id of the ``i``-th fork request the sessionfork runner queues."""
    return f"pp-{i}"


def cpu_us() -> float:
    """This process's CPU so far (user + system, all its threads), in µs."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return (usage.ru_utime + usage.ru_stime) * 1e6


class Done:
    """The jobs a framework reported done since ``start``. At the ``expected``-th (or at ``close``,
    if the drain ended short) it keeps the wall time and this process's CPU since ``start``, sets
    ``reached`` and says ``done SECONDS CPU_US COUNT`` through ``say``, once."""

    def __init__(self, expected: int, say: Callable[[str], None] = lambda line: None) -> None:
        self.expected, self.count = expected, 0
        self.seconds = self.cpu_us = 0.0
        self.reached = threading.Event()
        self._say = say
        self._lock = threading.Lock()
        self._began = (time.perf_counter(), cpu_us())

    def start(self) -> None:
        self._began = (time.perf_counter(), cpu_us())

    def add(self) -> None:
        with self._lock:
            self.count += 1
            if self.count == self.expected:
                self._report()

    def close(self) -> None:
        with self._lock:
            if not self.reached.is_set():
                self._report()

    def _report(self) -> None:
        self.seconds, self.cpu_us = time.perf_counter() - self._began[0], cpu_us() - self._began[1]
        self.reached.set()
        self._say(f"done {self.seconds!r} {self.cpu_us!r} {self.count}")


@dataclass(frozen=True)
class Prepared:
    """A worker with its jobs queued: ``drain`` works them off (it returns once ``done`` has them
    all, or the worker stopped), each counted in ``done``."""

    drain: Callable[[], object]
    done: Done


def prepare(system: str, url: str, jobs: int, say: Callable[[str], None] = lambda line: None) -> Prepared:
    """Queue ``jobs`` jobs of ``system`` on the server at ``url`` and build its worker (not started);
    its ``Done`` reports through ``say``."""
    done = Done(jobs, say)
    if system in SETTINGS:
        return Prepared(_sessionfork(url, jobs, done, SETTINGS[system]), done)
    if system == "rq":
        return Prepared(_rq(url, jobs, done), done)
    if system == "dramatiq":
        return Prepared(_dramatiq(url, jobs, done), done)
    if system == "huey":
        return Prepared(_huey(url, jobs, done), done)
    raise ValueError(f"unknown system {system!r}: one of {', '.join(SYSTEMS)}")


def _sessionfork(url: str, jobs: int, done: Done, environ: dict[str, str]) -> Callable[[], object]:
    from bench.measure import write_session
    from sessionfork.cli import cli
    from sessionfork.clients.client import Client
    from sessionfork.core.config import Settings
    from sessionfork.core.registry import Registry
    from sessionfork.ops.metrics import Observer

    with Redis.from_url(url) as redis:
        write_session(Registry(redis), SOURCE, 12)
        client = Client(redis, Settings())
        for i in range(jobs):
            client.submit(client.request(SOURCE, request_id=request_id(i), session_id=f"pp-child-{i}"))
        client.close()
    if not _COUNTING:  # the worker command's observer, counting each outcome it is handed (patched once)
        observe = Observer.__call__

        def observed(self: Observer, *args: Any) -> None:
            observe(self, *args)
            _COUNTING[-1].add()

        Observer.__call__ = observed  # type: ignore[method-assign,assignment]
    _COUNTING[:] = [done]

    def drain() -> None:
        try:
            cli.main(["--redis-url", url, "worker", "--burst", "--log-level", "ERROR"], prog_name="sessionfork",
                     obj=dict(environ))
        except SystemExit as exit:  # the command line always exits; 0 once the queue is empty
            if exit.code:
                raise

    return drain


_COUNTING: list[Done] = []
"""The ``Done`` the sessionfork worker's outcomes count in (the last one prepared)."""


def _rq(url: str, jobs: int, done: Done) -> Callable[[], object]:
    from rq import Queue, SimpleWorker

    class CountingWorker(SimpleWorker):
        def handle_job_success(self, *args: Any, **kwargs: Any) -> None:
            super().handle_job_success(*args, **kwargs)
            done.add()

    redis = Redis.from_url(url)
    queue = Queue(RQ_QUEUE, connection=redis)
    for _ in range(jobs):
        queue.enqueue("bench.measure.noop")
    worker = CountingWorker([queue], connection=redis)
    return lambda: worker.work(burst=True, logging_level="ERROR")


def _dramatiq(url: str, jobs: int, done: Done) -> Callable[[], object]:
    import dramatiq

    from bench.peer_jobs import dramatiq_app

    broker, actor = dramatiq_app(url, done.add)
    for _ in range(jobs):
        actor.send()
    worker = dramatiq.Worker(broker, worker_threads=THREADS)

    def drain() -> None:
        worker.start()
        done.reached.wait(DRAIN_LIMIT)

    return drain


def _huey(url: str, jobs: int, done: Done) -> Callable[[], object]:
    from bench.peer_jobs import huey_app

    huey, task = huey_app(url, done.add)
    for _ in range(jobs):
        task()
    consumer = huey.create_consumer(workers=THREADS, worker_type="thread")

    def drain() -> None:
        consumer.start()
        done.reached.wait(DRAIN_LIMIT)

    return drain


def main(argv: list[str] | None = None) -> int:
    system, url, jobs = argv if argv is not None else sys.argv[1:]
    out, sys.stdout = sys.stdout, sys.stderr  # the frameworks' own prints must not mix with the protocol

    def say(line: str) -> None:
        print(line, file=out, flush=True)

    for module in IMPORTS[system]:
        importlib.import_module(module)
    say("up")
    if sys.stdin.readline().strip() != "prepare":
        return 1
    prepared = prepare(system, url, int(jobs), say)
    say("ready")
    if sys.stdin.readline().strip() != "go":
        return 1
    prepared.done.start()
    prepared.drain()
    prepared.done.close()  # a drain that ended short still reports what it counted
    sys.stdin.read()  # the harness ends this process once it has read the server's figures
    return 0


if __name__ == "__main__":
    sys.exit(main())
