"""The benchmark's measurements, each on a throwaway server it is given (see ``bench``).

Peers (RQ's own workers on no-op jobs, PING) and sessionfork's figures are measured the same
way: real worker processes, the scheduler's side timing enqueue → completion. What a job costs
the Redis server itself (CPU, round trips) is measured in ``bench.redis_cost``.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from redis import Redis
from rq import Queue
from rq.registry import FinishedJobRegistry

from sessionfork.aio import AsyncClient
from sessionfork.clients.client import Client
from sessionfork.core import forks
from sessionfork.core.config import Settings
from sessionfork.core.registry import Registry
from sessionfork.core.wire import NewEvent
from sessionfork.embedded import EmbeddedServer, wait_until


def noop() -> None:
    """The peers' job: nothing at all."""


def _turn(n: int) -> list[NewEvent]:
    return [NewEvent("turn/start", {"turn": n}), NewEvent("user/message", {"text": "x" * 40}),
            NewEvent("assistant/message", {"text": "y" * 80}), NewEvent("turn/end", {"turn": n})]


def write_session(registry: Registry, sid: str, events: int) -> None:
    handle = registry.create(sid)
    batch: list[NewEvent] = []
    for n in range(events // 4):
        batch.extend(_turn(n))
        if len(batch) >= 4000:
            registry.append(handle, batch)
            batch = []
    if batch:
        registry.append(handle, batch)


_RQ_WORKER = """
import sys
from redis import Redis
from redis.connection import AbstractConnection
from rq import Queue, SimpleWorker, Worker
cls = {"worker": Worker, "simple": SimpleWorker}[sys.argv[2]]
r = Redis.from_url(sys.argv[1])
cls([Queue("peer", connection=r)], connection=r, name=sys.argv[3]).work(logging_level="ERROR")
"""


def _start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env)


def stop_processes(procs: list[subprocess.Popen[bytes]], grace: float = 20) -> None:
    """SIGTERM each, wait ``grace`` seconds, then SIGKILL and reap those still running."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(20)  # reaped: an unreaped child is a ResourceWarning (an error in the tests)


def wait_workers_up(redis: Redis, names: list[str]) -> bool:
    found = {(k.decode() if isinstance(k, bytes) else k).rsplit(":", 1)[-1] for k in redis.smembers("rq:workers")}
    return set(names) <= found


def flushed(server: EmbeddedServer) -> Redis:
    """A client on an emptied server (FLUSHALL SYNC: a lazy flush would skew memory figures)."""
    redis = server.client()
    redis.execute_command("FLUSHALL", "SYNC")  # type: ignore[no-untyped-call]
    return redis


def rq_peer(server: EmbeddedServer, kind: str, jobs: int) -> float:
    """No-op jobs per second drained by RQ's own ``Worker``/``SimpleWorker`` (enqueue → done)."""
    redis = flushed(server)
    proc = _start([sys.executable, "-c", _RQ_WORKER, server.url, kind, f"peer-{kind}"])
    try:
        wait_until(lambda: wait_workers_up(redis, [f"peer-{kind}"]), 30, f"rq {kind} worker")
        queue = Queue("peer", connection=redis)
        finished = FinishedJobRegistry("peer", connection=redis)
        began = time.perf_counter()
        for _ in range(jobs):
            queue.enqueue("bench.measure.noop")
        wait_until(lambda: finished.count >= jobs, 300, "rq peer jobs", interval=0.002)
        return jobs / (time.perf_counter() - began)
    finally:
        # Its stop is not measured: 2 s, then killed. With redis-py 8.2, RQ's own worker may wait
        # out its command listener's 60-second read when it stops (RQ unsubscribes the listener
        # before it stops it, and 8.2's ``stop()`` waits for it; ``SeamWorker.unsubscribe``).
        stop_processes([proc], grace=2)


def start_fork_workers(server: EmbeddedServer, n: int, batch: int | None = None
                       ) -> tuple[list[subprocess.Popen[bytes]], Redis]:
    """``n`` ``sessionfork worker`` processes on ``server``, up once they are registered;
    ``batch``: their ``SESSIONFORK_BATCH`` (else the default)."""
    redis = server.client()
    names = [f"fork-{i}-{time.monotonic_ns()}" for i in range(n)]
    env = None if batch is None else {**os.environ, "SESSIONFORK_BATCH": str(batch)}
    procs = [_start([sys.executable, "-m", "sessionfork", "--redis-url", server.url, "worker",
                     "--name", name, "--log-level", "ERROR"], env) for name in names]
    wait_until(lambda: wait_workers_up(redis, names), 30, "sessionfork workers")
    return procs, redis


def fork_throughput(server: EmbeddedServer, requests: int, workers: int = 1, count: int | None = None,
                    variants: int | None = None) -> float:
    """Fork requests per second, enqueue → every reply read by the scheduler. ``variants``: each
    request is a variant fan-out of that many children, one edit each."""
    flushed(server)
    registry = Registry(server.client())
    write_session(registry, "bench-src", 12)
    procs, redis = start_fork_workers(server, workers)
    try:
        client = Client(redis, Settings())

        def submit() -> None:
            for i in range(requests):
                if variants:
                    # Imported here: bench.ab runs this function against older trees, which lack it.
                    from sessionfork.protocol.requests import Variant

                    client.submit(client.request("bench-src", variants=[
                        Variant(edits=[NewEvent("user/message", {"text": f"variant {v}"})]) for v in range(variants)]))
                    continue
                client.submit(client.request("bench-src", session_id=None if count else f"c-{i}", count=count))

        elapsed = replies_timed(server.client(), Settings().reply_channel, requests, submit)
        return requests / elapsed
    finally:
        stop_processes(procs)


def replies_timed(redis: Redis, channel: str, expected: int, submit: Callable[[], None]) -> float:
    """Seconds from ``submit()``'s start (it sends the requests) to the ``expected``-th message on the
    reply ``channel``, subscribed (and the subscription confirmed) first; ``TimeoutError`` when they
    do not all arrive within 300 s."""
    pubsub = redis.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(channel)
    wait_until(lambda: pubsub.get_message(timeout=0.01) is None and pubsub.subscribed
               and int(redis.pubsub_numsub(channel)[0][1]) >= 1, 10, "the reply subscription")
    replies, done = 0, threading.Event()

    def listen() -> None:
        nonlocal replies
        while replies < expected:
            if pubsub.get_message(timeout=1.0):
                replies += 1
        done.set()

    threading.Thread(target=listen, daemon=True).start()
    began = time.perf_counter()
    submit()
    if not done.wait(300):
        raise TimeoutError("benchmark replies did not all arrive")
    elapsed = time.perf_counter() - began
    pubsub.close()
    return elapsed


def latency(server: EmbeddedServer, samples: int) -> tuple[float, float]:
    """Enqueue → reply latency (ms) on an idle worker: p50, p99."""
    flushed(server)
    registry = Registry(server.client())
    write_session(registry, "bench-src", 12)
    procs, redis = start_fork_workers(server, 1)
    try:
        client = Client(redis, Settings())
        times = []
        for _ in range(samples):
            t = time.perf_counter()
            reply = client.fork("bench-src", timeout=10)
            times.append((time.perf_counter() - t) * 1000)
            assert reply.ok, reply
        q = statistics.quantiles(times, n=100)
        return statistics.median(times), q[98]
    finally:
        stop_processes(procs)


def async_vs_sync(server: EmbeddedServer, concurrent: int, sequential: int, workers: int = 4) -> tuple[float, float]:
    """Forks/s against ``workers`` worker processes: ``concurrent`` ``AsyncClient.fork`` calls at
    once from one event loop (4 connections), and ``sequential`` sync ``Client.fork`` calls."""
    flushed(server)
    registry = Registry(server.client())
    write_session(registry, "bench-src", 12)
    procs, redis = start_fork_workers(server, workers)
    try:
        async def many() -> float:
            async with AsyncClient.from_url(server.url, Settings(), max_connections=4) as client:
                began = time.perf_counter()
                replies = await asyncio.gather(*(client.fork("bench-src", timeout=300) for _ in range(concurrent)))
                elapsed = time.perf_counter() - began
            assert all(r.ok for r in replies)
            return concurrent / elapsed

        async_rate = asyncio.run(many())
        client = Client(redis, Settings())
        began = time.perf_counter()
        for _ in range(sequential):
            assert client.fork("bench-src", timeout=10).ok
        return async_rate, sequential / (time.perf_counter() - began)
    finally:
        stop_processes(procs)


def fork_cost(server: EmbeddedServer, events: int, children: int) -> tuple[float, float]:
    """Median µs per fork (registry only) and Redis bytes per child (``measured_forks``), for a
    parent of ``events``."""
    redis = flushed(server)
    registry = Registry(redis)
    write_session(registry, "parent", events)
    for i in range(50):  # warm up: script cache, connection, the keyspace's first growth
        forks.fork(registry, "parent", f"warm-{i}")
    return measured_forks(redis, children, lambda i: forks.fork(registry, "parent", f"child-{i}"))


def measured_forks(redis: Redis, children: int, fork_one: Callable[[int], object]) -> tuple[float, float]:
    """Median µs of ``fork_one(i)`` over its first ``children`` calls, and Redis bytes per child over
    at least ``MEMORY_CHILDREN`` calls (over a few, the keyspace's growth and rehashing swing the
    delta, even below 0)."""
    before = dataset_bytes(redis)
    times = []
    measured = max(children, MEMORY_CHILDREN)
    for i in range(measured):
        t = time.perf_counter()
        fork_one(i)
        if i < children:
            times.append((time.perf_counter() - t) * 1e6)
    return statistics.median(times), (dataset_bytes(redis) - before) / measured


MEMORY_CHILDREN = 1000
"""The fewest children ``measured_forks`` measures Redis bytes per child over."""


def boundary_fork_costs(server: EmbeddedServer, events: int, children: int,
                        fractions: tuple[float, ...]) -> dict[float, tuple[float, float]]:
    """For each fraction, median µs per boundary fork (registry only) and Redis bytes per child.

    The parent has ``events`` events in whole turns, then a running turn (so it forks only at a
    boundary); each fork takes the newest ``turn/end`` within the first ``fraction`` of its log.
    """
    redis = flushed(server)
    registry = Registry(redis)
    write_session(registry, "parent", events)
    registry.append("parent", [NewEvent("turn/start", {"turn": -1}), NewEvent("tool/call", {"id": "t"})])
    for i in range(50):  # warm up, as in fork_cost
        forks.fork(registry, "parent", f"warm-{i}", boundary=3)
    out: dict[float, tuple[float, float]] = {}
    for fraction in fractions:
        boundary = max(3, int(events * fraction) // 4 * 4 - 1)  # turns are 4 events: seq 4k + 3 ends one
        out[fraction] = measured_forks(redis, children, lambda i, f=fraction, b=boundary: forks.fork(  # type: ignore[misc]
            registry, "parent", f"child-{f}-{i}", boundary=b))
    return out


def dataset_bytes(redis: Redis) -> int:
    """``used_memory`` less client buffers (which come and go with each reply, not with children)."""
    info = redis.info("memory")
    return int(info["used_memory"]) - int(info.get("mem_clients_normal", 0))


def ping(server: EmbeddedServer, n: int) -> float:
    redis = server.client()
    t = time.perf_counter()
    for _ in range(n):
        redis.ping()
    return n / (time.perf_counter() - t)
