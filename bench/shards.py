"""Forks/s with 1 and 2 queue shards on one machine: ``python -m bench.shards [--quick]`` alone,
or as part of ``bench.main``.

One registry server and two queue servers are started once. Each run flushes them, starts the same
number of ``sessionfork worker`` processes in every configuration (2 by default: both on the one
shard, or one per shard, so only the number of queue servers changes), and sends a fixed number of
single-fork requests at once through the public ``AsyncClient`` over the shard list (one event loop,
every request awaited); the figure is completed forks per second, first submit → last reply.

Beside the rate, each run reports how many CPU cores were busy: the workers' CPU (``/proc``), the
Redis servers' (``INFO cpu``) and this client's, over the wall time. On a 2-core machine that is ~2
in both configurations: a second queue server cannot add cores, so the ratio measures what the
split costs or saves, not what a second machine would add.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.measure import flushed, stop_processes, wait_workers_up, write_session
from bench.redis_cost import redis_cpu_us
from sessionfork.aio import AsyncClient
from sessionfork.core import keys
from sessionfork.core.config import Settings
from sessionfork.core.registry import Registry
from sessionfork.embedded import EmbeddedServer, wait_until
from sessionfork.protocol.shards import shard_of

MAX_CONNECTIONS = 4
"""Per shard: the client's connections, one of them its subscription (16 measured no faster)."""
Row = tuple[str, float, str, float | None, str]
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class ShardRun:
    """One run: completed forks/s, the CPU cores busy meanwhile (workers + Redis + client), and the
    outcomes each queue server recorded (warm-up included)."""

    def __init__(self, rate: float, cores: float, outcomes: list[int]) -> None:
        self.rate, self.cores, self.outcomes = rate, cores, outcomes


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far, from ``/proc`` (Linux; 0 elsewhere)."""
    stat = Path(f"/proc/{pid}/stat")
    if not stat.exists():
        return 0.0
    fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state is field 3
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime: fields 14 and 15


def _worker_env() -> dict[str, str]:
    """This environment without any sessionfork or Redis settings (the command line gives them)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("SESSIONFORK_", "REDIS_URL"))}


def _start_workers(registry: EmbeddedServer, queues: Sequence[EmbeddedServer],
                   workers: int) -> list[subprocess.Popen[bytes]]:
    """``workers`` worker processes, worker ``i`` serving shard ``i mod len(queues)``; returns once
    each has registered on its shard's server."""
    urls = ",".join(q.url for q in queues)
    stamp = time.monotonic_ns()
    placed = [(i % len(queues), f"shard-{i % len(queues)}-{i}-{stamp}") for i in range(workers)]
    procs = [subprocess.Popen([sys.executable, "-m", "sessionfork", "--redis-url", registry.url, "--queue-urls", urls,
                               "worker", "--shard", str(shard), "--name", name, "--log-level", "ERROR"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=_worker_env()) for shard, name in placed]
    try:
        for index, queue in enumerate(queues):
            names = [name for shard, name in placed if shard == index]
            with queue.client() as redis:
                wait_until(lambda r=redis, n=names: wait_workers_up(r, n), 30, f"the workers of shard {index}")
    except BaseException:
        stop_processes(procs)
        raise
    return procs


def _warm_ids(shards: int, per_shard: int = 2) -> list[str]:
    """Request ids that put ``per_shard`` warm-up requests on each shard (scripts loaded, connections open)."""
    ids: list[str] = []
    for shard in range(shards):
        ids += [rid for rid in (f"warm-{shard}-{i}" for i in range(1000)) if shard_of(rid, shards) == shard][:per_shard]
    return ids


def sharded_forks(registry: EmbeddedServer, queues: Sequence[EmbeddedServer], requests: int,
                  workers: int = 2) -> ShardRun:
    """Completed single forks/s with the queue on ``queues`` (one shard each) and ``workers`` worker
    processes spread over them: ``requests`` ``AsyncClient.fork`` calls at once, then every reply."""
    for server in (registry, *queues):
        flushed(server)
    write_session(Registry(registry.client()), "bench-src", 12)
    procs = _start_workers(registry, queues, workers)
    servers = [s.client() for s in (registry, *queues)]
    try:
        async def run() -> tuple[float, float]:
            urls = [q.url for q in queues]
            async with AsyncClient.from_urls(urls, Settings(), max_connections=MAX_CONNECTIONS) as client:
                warm = await asyncio.gather(*(client.fork("bench-src", request_id=rid, timeout=60)
                                              for rid in _warm_ids(len(queues))))
                assert all(r.ok for r in warm), warm
                began, cpu = time.perf_counter(), cpu_s()
                replies = await asyncio.gather(*(client.fork("bench-src", timeout=300) for _ in range(requests)))
                elapsed, used = time.perf_counter() - began, cpu_s() - cpu
            assert all(r.ok for r in replies), [r for r in replies if not r.ok][:3]
            return elapsed, used

        def cpu_s() -> float:
            return (time.process_time() + sum(process_cpu_s(p.pid) for p in procs)
                    + sum(redis_cpu_us(s) for s in servers) / 1e6)

        elapsed, used = asyncio.run(run())
        return ShardRun(requests / elapsed, used / elapsed, [int(s.xlen(keys.OUTCOME_STREAM)) for s in servers[1:]])
    finally:
        stop_processes(procs)
        for s in servers:
            s.close()


def shard_rows(registry: EmbeddedServer, requests: int, rounds: int, workers: int = 2,
               step: Callable[[str, Callable[[], Any]], Any] = lambda _, fn: fn()) -> list[Row]:
    """The bench rows: forks/s with 2 queue shards against 1, and the cores busy in each, as medians of
    ``rounds`` alternating rounds (1 shard, 2 shards, 1, 2, ...) with ``registry`` as the registry."""
    with ExitStack() as stack:
        queues = [stack.enter_context(EmbeddedServer()) for _ in range(2)]
        runs: dict[int, list[ShardRun]] = {1: [], 2: []}
        for r in range(rounds):
            for n in (1, 2):
                runs[n].append(step(f"{requests} forks, {n} queue shard(s), {workers} workers, round {r + 1}",
                                    lambda n=n: sharded_forks(registry, queues[:n], requests, workers)))  # type: ignore[misc]
    rate = {n: statistics.median(run.rate for run in runs[n]) for n in runs}
    cores = {n: statistics.median(run.cores for run in runs[n]) for n in runs}
    machine = float(os.cpu_count() or 1)
    return [
        (f"forks/s, 2 queue shards ({workers} worker processes in all, median of rounds)", rate[2],
         f"forks/s, 1 queue shard ({workers} worker processes)", rate[1], ""),
        ("CPU cores busy, 1 queue shard (workers + Redis servers + client)", cores[1], "cores on this machine",
         machine, ""),
        ("CPU cores busy, 2 queue shards (workers + Redis servers + client)", cores[2], "cores on this machine",
         machine, ""),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.shards", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks that it runs, not speed")
    parser.add_argument("--requests", type=int, help="requests per run (default 2,000; --quick: 40)")
    parser.add_argument("--rounds", type=int, help="alternating rounds (default 3; --quick: 1)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes in all, spread over the shards")
    args = parser.parse_args(argv)
    requests = args.requests or (40 if args.quick else 2000)
    rounds = args.rounds or (1 if args.quick else 3)

    def step(label: str, fn: Callable[[], Any]) -> Any:
        print(f"… {label}", file=sys.stderr, flush=True)
        return fn()

    with EmbeddedServer() as registry:
        for row in shard_rows(registry, requests, rounds, args.workers, step):
            print(f"{row[0]}: {row[1]:,.1f} | {row[2]}: {row[3]:,.1f} | ratio {row[1] / (row[3] or 1):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
