"""The benchmark: ``python -m sessionfork.bench [--quick] [--out DIR]`` (``make bench``).

Runs on a throwaway server it starts, and measures in the same run the peers every figure is
compared with: RQ's default ``Worker`` and RQ's ``SimpleWorker`` draining no-op jobs, and a bare
Redis round trip (PING). Prints a markdown table; writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from redis import Redis
from rq import Queue
from rq.registry import FinishedJobRegistry

from . import forks
from .client import Client
from .config import Settings
from .embedded import EmbeddedServer, wait_until
from .registry import Registry
from .wire import NewEvent


def noop() -> None:
    """The peers' job: nothing at all."""


def _turn(n: int) -> list[NewEvent]:
    return [NewEvent("turn/start", {"turn": n}), NewEvent("user/message", {"text": "x" * 40}),
            NewEvent("assistant/message", {"text": "y" * 80}), NewEvent("turn/end", {"turn": n})]


def _session_with(registry: Registry, sid: str, events: int) -> None:
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
from rq import Queue, SimpleWorker, Worker
cls = {"worker": Worker, "simple": SimpleWorker}[sys.argv[2]]
r = Redis.from_url(sys.argv[1])
cls([Queue("peer", connection=r)], connection=r, name=sys.argv[3]).work(logging_level="ERROR")
"""


def _start(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()


def _workers_up(redis: Redis, names: list[str]) -> bool:
    found = {(k.decode() if isinstance(k, bytes) else k).rsplit(":", 1)[-1] for k in redis.smembers("rq:workers")}
    return set(names) <= found


def rq_peer(server: EmbeddedServer, kind: str, jobs: int) -> float:
    """No-op jobs per second drained by RQ's own ``Worker``/``SimpleWorker`` (enqueue → done)."""
    redis = server.client()
    redis.flushall()
    proc = _start([sys.executable, "-c", _RQ_WORKER, server.url, kind, f"peer-{kind}"])
    try:
        wait_until(lambda: _workers_up(redis, [f"peer-{kind}"]), 30, f"rq {kind} worker")
        queue = Queue("peer", connection=redis)
        finished = FinishedJobRegistry("peer", connection=redis)
        began = time.perf_counter()
        for _ in range(jobs):
            queue.enqueue("sessionfork.bench.noop")
        wait_until(lambda: finished.count >= jobs, 300, "rq peer jobs", interval=0.002)
        return jobs / (time.perf_counter() - began)
    finally:
        _stop([proc])


def _fork_workers(server: EmbeddedServer, n: int) -> tuple[list[subprocess.Popen[bytes]], Redis]:
    redis = server.client()
    names = [f"fork-{i}-{time.monotonic_ns()}" for i in range(n)]
    procs = [_start([sys.executable, "-m", "sessionfork", "--redis-url", server.url, "worker",
                     "--name", name, "--log-level", "ERROR"]) for name in names]
    wait_until(lambda: _workers_up(redis, names), 30, "sessionfork workers")
    return procs, redis


def fork_throughput(server: EmbeddedServer, requests: int, workers: int = 1, count: int | None = None) -> float:
    """Fork requests per second, enqueue → every reply read by the scheduler."""
    server.client().flushall()
    registry = Registry(server.client())
    _session_with(registry, "bench-src", 12)
    procs, redis = _fork_workers(server, workers)
    try:
        client = Client(redis, Settings())
        replies = 0
        done = threading.Event()
        pubsub = server.client().pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
        pubsub.subscribe(Settings().reply_channel)

        def listen() -> None:
            nonlocal replies
            while replies < requests:
                if pubsub.get_message(timeout=1.0):
                    replies += 1
            done.set()

        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        began = time.perf_counter()
        for i in range(requests):
            client.submit(client.request("bench-src", session_id=None if count else f"c-{i}", count=count))
        if not done.wait(300):
            raise TimeoutError("benchmark replies did not all arrive")
        elapsed = time.perf_counter() - began
        pubsub.close()
        return requests / elapsed
    finally:
        _stop(procs)


def latency(server: EmbeddedServer, samples: int) -> tuple[float, float]:
    """Enqueue → reply latency (ms) on an idle worker: p50, p99."""
    server.client().flushall()
    registry = Registry(server.client())
    _session_with(registry, "bench-src", 12)
    procs, redis = _fork_workers(server, 1)
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
        _stop(procs)


def fork_cost(server: EmbeddedServer, events: int, children: int) -> tuple[float, float]:
    """Median µs per fork (registry only) and Redis bytes per child, for a parent of ``events``."""
    redis = server.client()
    redis.flushall()
    registry = Registry(redis)
    _session_with(registry, "parent", events)
    before = int(redis.info("memory")["used_memory"])
    times = []
    for i in range(children):
        t = time.perf_counter()
        forks.fork(registry, "parent", f"child-{i}")
        times.append((time.perf_counter() - t) * 1e6)
    per_child = (int(redis.info("memory")["used_memory"]) - before) / children
    return statistics.median(times), per_child


def ping(server: EmbeddedServer, n: int) -> float:
    redis = server.client()
    t = time.perf_counter()
    for _ in range(n):
        redis.ping()
    return n / (time.perf_counter() - t)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sessionfork.bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks that it runs, not speed")
    parser.add_argument("--out", default="bench-results", help="directory for bench.json")
    args = parser.parse_args(argv)
    q = args.quick
    n, n_fork_peer, lat, kids = (30, 10, 20, 20) if q else (2000, 300, 400, 300)
    sizes = (10, 1_000, 2_000) if q else (10, 1_000, 100_000)
    rows: list[tuple[str, float, str, float | None, str]] = []
    with EmbeddedServer() as server:
        def step(label: str, fn: Callable[[], Any]) -> Any:
            print(f"… {label}", file=sys.stderr, flush=True)
            return fn()

        pings = step("PING round trips", lambda: ping(server, n * 5))
        simple = step("RQ SimpleWorker no-op", lambda: rq_peer(server, "simple", n))
        forking = step("RQ Worker no-op", lambda: rq_peer(server, "worker", n_fork_peer))
        single = step("sessionfork single forks", lambda: fork_throughput(server, n))
        rows.append(("single-fork requests/s (1 worker)", single, "RQ SimpleWorker no-op jobs/s", simple, "≥ 0.9"))
        rows.append(("single-fork requests/s (1 worker)", single, "RQ Worker no-op jobs/s", forking, "≥ 4"))
        p50, p99 = step("latency", lambda: latency(server, lat))
        rows.append(("enqueue→reply p50 ms (idle)", p50, "PING ms", 1000 / pings, ""))
        rows.append(("enqueue→reply p99 ms (idle)", p99, "PING ms", 1000 / pings, "< 5 ms"))
        costs = {size: step(f"fork cost, {size}-event parent", lambda s=size: fork_cost(server, s, kids))  # type: ignore[misc]
                 for size in sizes}
        base_us, _ = costs[sizes[0]]
        for size, (us, mem) in costs.items():
            rows.append((f"fork µs, {size}-event parent", us, f"fork µs, {sizes[0]}-event parent", base_us,
                         "≤ 1.5" if size == sizes[-1] else ""))
            rows.append((f"Redis bytes/child, {size}-event parent", mem, "limit bytes", 2048.0, "≤ 1"))
        fan_requests = 5 if q else 100
        fan = step("fan-out 64", lambda: fork_throughput(server, fan_requests, count=64)) * 64
        rows.append(("fan-out children/s (64 per request)", fan, "target children/s", 10_000.0, "≥ 1"))
        for w in (1, 2, 4):
            rate = step(f"{w} worker(s)", lambda w=w: fork_throughput(server, n, workers=w))  # type: ignore[misc]
            rows.append((f"single-fork requests/s, {w} worker process(es)", rate, "RQ SimpleWorker no-op jobs/s",
                         simple, ""))
    print("| figure | sessionfork | baseline | baseline value | ratio | bar |")
    print("|---|---:|---|---:|---:|---|")
    for label, value, base_label, base, bar in rows:
        ratio = f"{value / base:.2f}" if base else ""
        print(f"| {label} | {value:,.1f} | {base_label} | {base:,.1f} | {ratio} | {bar} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    figures = [{"figure": r[0], "value": r[1], "baseline": r[2], "baselineValue": r[3],
                "ratio": (r[1] / r[3]) if r[3] else None, "bar": r[4]} for r in rows]
    (out / "bench.json").write_text(json.dumps({"quick": q, "figures": figures, "ping_per_s": pings}, indent=2))
    print(f"\nfigures written to {out / 'bench.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
