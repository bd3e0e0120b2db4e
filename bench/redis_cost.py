"""What a job costs the Redis server, worker side: its CPU (``INFO cpu`` deltas) and its round trips.

Measured in this process, on a throwaway server it is given (see ``bench``): a ``RequestWorker``
working off fork requests queued beforehand, beside RQ's ``SimpleWorker`` on as many no-op jobs
(``bench.measure.noop``); sessionfork's own steps with no RQ job around them; and what a waiting
scheduler adds. ``bench.main`` reports them, ``python -m bench.cpu`` runs them alone, and
``bench.shares`` splits a fork's CPU between the queue server and the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis import Redis
from redis.connection import AbstractConnection
from rq import Queue

from bench.measure import flushed, start_fork_workers, stop_processes, write_session
from sessionfork.clients.client import Client
from sessionfork.core import keys, records
from sessionfork.core.config import Settings
from sessionfork.core.registry import Registry
from sessionfork.embedded import EmbeddedServer, wait_until
from sessionfork.protocol import rq_layout


def redis_cpu_us(redis: Redis) -> float:
    """The server's own CPU so far (``INFO cpu``: used_cpu_sys + used_cpu_user), in µs."""
    info = redis.info("cpu")
    return (float(info["used_cpu_sys"]) + float(info["used_cpu_user"])) * 1e6


def redis_cpu_per_job(server: EmbeddedServer, jobs: int) -> tuple[float, float, float]:
    """Redis CPU (µs) per job, worker side: a ``RequestWorker`` fork job taken in batches (the
    default, ``Settings().batch``), the same taken one at a time (``batch=1``), and a
    ``SimpleWorker`` no-op; each a burst over ``jobs`` jobs enqueued beforehand (the enqueue's CPU
    is not counted).

    ``INFO cpu`` deltas of the one server (queue and registry together here).
    """
    redis = server.client()

    def cpu_per_job(burst: Callable[[], object]) -> float:
        before = redis_cpu_us(redis)
        burst()
        return (redis_cpu_us(redis) - before) / jobs

    noop_us = cpu_per_job(_noop_burst(server, jobs))
    batched_us = cpu_per_job(_fork_burst(server, jobs, Settings().batch))
    return batched_us, cpu_per_job(_fork_burst(server, jobs, 1)), noop_us


def steps_cpu_per_fork(server: EmbeddedServer, jobs: int) -> float:
    """Redis CPU (µs) per fork of sessionfork's own steps alone (claim and source step, child,
    record): ``RequestService.handle`` run in a loop on ``jobs`` requests built beforehand, no RQ job
    around it (no dequeue, no RQ start or finish bookkeeping). The same source and server as
    ``redis_cpu_per_job``: the difference between the two is RQ's per-job share."""
    from sessionfork.protocol import requests

    flushed(server)
    _, service = _fork_context(Settings(redis_url=server.url))
    built = [requests.build("bench-src", {"request_id": f"own-{i}", "session_id": f"c-{i}"}, str) for i in range(jobs)]
    payloads = [requests.prepare(request, str)[1] for request in built]
    redis = server.client()
    before = redis_cpu_us(redis)
    for i, payload in enumerate(payloads):
        service.handle(payload, f"own-{i}")
    return (redis_cpu_us(redis) - before) / jobs


def waiter_cpu_us(server: EmbeddedServer, requests: int, chunks: int = 10) -> float:
    """Redis CPU (µs) a sync scheduler that waits on each request (``Client.fork``) adds per request
    over one that only submits (``Client.submit``): both with one worker process draining, which
    takes one request at a time (``SESSIONFORK_BATCH=1``). A waiting scheduler's requests reach the
    worker one by one whatever its batch; with batches, the submitter's backlog would be taken in
    batches, and the difference would count what batches save the worker as the waiter's cost.

    The two alternate in ``chunks`` chunks each (``requests`` requests per mode in all), so that a
    change of the machine's load during the round weighs on both alike. The waiting client closes
    its kept reply subscription after each of its chunks: nobody listens while the other submits.
    """
    flushed(server)
    write_session(Registry(server.client()), "bench-src", 12)
    procs, redis = start_fork_workers(server, 1, batch=1)
    try:
        submitter, waiter = Client(redis, Settings()), Client(redis, Settings())
        spent = {False: 0.0, True: 0.0}
        per_chunk = max(1, requests // chunks)
        for c in range(chunks):
            for wait in (False, True):
                tag = f"{'w' if wait else 's'}{c}"
                before = redis_cpu_us(redis)
                ids = []
                for i in range(per_chunk):
                    if wait:
                        waiter.fork("bench-src", session_id=f"{tag}-{i}", timeout=30)
                    else:
                        ids.append(submitter.submit(submitter.request("bench-src", session_id=f"{tag}-{i}")))
                waiter.close()
                last = ids[-1:]
                wait_until(lambda last=last: all(any(redis.hmget(keys.request(r), list(records.OUTCOME_MARKS)))
                                                 for r in last),
                           120, "the submitted requests to complete", interval=0.01)
                queue_key = rq_layout.queue_key(submitter.settings.queue)
                wait_until(lambda queue_key=queue_key: redis.llen(queue_key) == 0, 120, "the queue to drain",
                           interval=0.01)
                spent[wait] += redis_cpu_us(redis) - before
        return (spent[True] - spent[False]) / (per_chunk * chunks)
    finally:
        stop_processes(procs)


def round_trips(server: EmbeddedServer, jobs: int) -> tuple[float, float, float]:
    """Redis round trips per job, worker side: a ``RequestWorker`` fork job in batches (the default), the
    same one at a time (``batch=1``), a ``SimpleWorker`` no-op.

    Counted in-process, as commands (or pipelines) written to a socket during a burst.
    """
    sent = {"n": 0}
    original = AbstractConnection.send_packed_command

    def counting(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
        sent["n"] += 1
        original(self, command, check_health)  # type: ignore[no-untyped-call]

    def per_job(run: Callable[[], Any]) -> float:
        sent["n"] = 0
        AbstractConnection.send_packed_command = counting  # type: ignore[method-assign]
        try:
            run()
        finally:
            AbstractConnection.send_packed_command = original  # type: ignore[method-assign]
        return sent["n"] / jobs

    simple_rt = per_job(_noop_burst(server, jobs))
    batched_rt = per_job(_fork_burst(server, jobs, Settings().batch))
    return batched_rt, per_job(_fork_burst(server, jobs, 1)), simple_rt


def _fork_context(settings: Settings) -> tuple[Any, Any]:
    """The command line's ``Context`` on the servers ``settings`` names and its ``RequestService``,
    with the 12-event source ``bench-src`` that the CPU bursts fork."""
    from sessionfork.cli.app import Context

    context = Context(settings)
    write_session(context.registry(), "bench-src", 12)
    return context, context.service()


def queued_fork_worker(settings: Settings, jobs: int, batch: int = 1) -> Any:
    """A ``RequestWorker`` in this process, on the servers ``settings`` names (flushed by the caller),
    with ``jobs`` single-fork requests of a 12-event source queued before it starts, taking up to
    ``batch`` of them at once (``sessionfork worker`` takes ``settings.batch``)."""
    from sessionfork.worker.jobs import make_queue
    from sessionfork.worker.request_worker import RequestWorker

    context, service = _fork_context(settings)
    client = Client(context.queue_redis(), settings)
    for i in range(jobs):
        client.submit(client.request("bench-src", session_id=f"c-{i}"))
    return RequestWorker([make_queue(client.redis, client.settings)], service=service,
                      connection=service.outcomes.redis, abandoned_after=30, batch=batch)


def _noop_burst(server: EmbeddedServer, jobs: int) -> Callable[[], object]:
    """On a flushed ``server``: ``jobs`` RQ no-op jobs queued; returns the burst that works them off
    (a ``SimpleWorker``), to run once."""
    from rq import SimpleWorker

    redis = flushed(server)
    queue = Queue("peer", connection=redis)
    for _ in range(jobs):
        queue.enqueue("bench.measure.noop")
    simple = SimpleWorker([queue], connection=redis)
    return lambda: simple.work(burst=True, logging_level="ERROR")


def _fork_burst(server: EmbeddedServer, jobs: int, batch: int) -> Callable[[], object]:
    """On a flushed ``server``: ``jobs`` single-fork requests queued; returns the burst that works them
    off (a ``RequestWorker`` taking up to ``batch`` at once), to run once."""
    flushed(server)
    worker = queued_fork_worker(Settings(redis_url=server.url), jobs, batch)
    return lambda: worker.work(burst=True, logging_level="ERROR")
