"""The queue server's and the registry's shares of a fork's Redis CPU: ``python -m bench.shares``
alone, or as part of ``bench.main``.

The registry is started on a server of its own, apart from the queue server, so that each one's
``INFO cpu`` delta over a burst of ``jobs`` single-fork jobs (worker side: queued beforehand, one
``RequestWorker`` in this process works them off) is that server's own CPU per fork. What a sharded
deployment needs follows: the queue primaries a target rate needs (each at 100 % of a core, the
waiting schedulers' share included), and the registry cores (cluster masters) beside them.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from bench.measure import flushed
from bench.redis_cost import queued_fork_worker, redis_cpu_us
from sessionfork.core.config import Settings
from sessionfork.embedded import EmbeddedServer

TARGETS = (10_000, 100_000, 1_000_000)
"""Forks/s the capacity rows are given for."""
Row = tuple[str, float, str, float | None, str]


def split_cpu_per_fork(queue_server: EmbeddedServer, registry_server: EmbeddedServer, jobs: int) -> tuple[float, float]:
    """Redis CPU (µs) per fork job, worker side, on the queue server and on the registry: ``jobs``
    requests queued beforehand, then worked off by one ``RequestWorker`` in burst mode."""
    queue, registry = flushed(queue_server), flushed(registry_server)
    worker = queued_fork_worker(Settings(redis_url=registry_server.url, queue_url=queue_server.url), jobs)
    before = redis_cpu_us(queue), redis_cpu_us(registry)
    worker.work(burst=True, logging_level="ERROR")
    if (done := worker.queues[0].finished_job_registry.count) != jobs:
        raise RuntimeError(f"{done} of {jobs} fork jobs finished")
    return (redis_cpu_us(queue) - before[0]) / jobs, (redis_cpu_us(registry) - before[1]) / jobs


def share_rows(registry_server: EmbeddedServer, jobs: int, rounds: int, waiter_us: float) -> list[Row]:
    """The rows: µs per fork on each server (medians of ``rounds``), and the capacity they imply;
    ``waiter_us`` is what a waiting scheduler adds on the queue server (``redis_cost.waiter_cpu_us``)."""
    with EmbeddedServer() as queue_server:
        split = [split_cpu_per_fork(queue_server, registry_server, jobs) for _ in range(rounds)]
    queue_us = statistics.median(q for q, _ in split)
    registry_us = statistics.median(r for _, r in split)
    total = queue_us + registry_us
    per_queue_core = 1e6 / (queue_us + waiter_us)
    per_registry_core = 1e6 / registry_us
    rows: list[Row] = [
        ("Redis CPU µs per fork on the queue server, worker side (registry apart)", queue_us,
         "both servers' µs per fork", total, ""),
        ("Redis CPU µs per fork on the registry (its own server)", registry_us, "both servers' µs per fork", total, ""),
        ("forks/s one queue primary carries at 100 % of a core (waiting schedulers, registry apart)", per_queue_core,
         "forks/s one registry core carries", per_registry_core, ""),
    ]
    for target in TARGETS:
        rows.append((f"queue primaries (shards) for {target:,} forks/s, registry apart", target / per_queue_core,
                     "one primary", 1.0, ""))
        rows.append((f"registry cores (cluster masters) beside them for {target:,} forks/s",
                     target / per_registry_core, "one core", 1.0, ""))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.shares", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--waiter-us", type=float, default=0.0,
                        help="Redis CPU a waiting scheduler adds per fork (bench.cpu measures it)")
    args = parser.parse_args(argv)
    with EmbeddedServer() as registry_server:
        for row in share_rows(registry_server, args.jobs, args.rounds, args.waiter_us):
            print(f"{row[0]}: {row[1]:,.1f} ({row[2]}: {row[3]:,.1f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
