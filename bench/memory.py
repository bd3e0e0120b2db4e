"""Memory measurements of the benchmark: what a completed request retains, by key family.

``request_memory`` runs ``requests`` single-fork requests through a real ``sessionfork worker``
process on an emptied server, waits until the worker is idle and RQ's short-lived job state has
expired (``SESSIONFORK_JOB_TTL``), then compares ``INFO memory`` with the figure taken before, and
adds ``MEMORY USAGE`` per key family. What is left is what a request keeps for the whole
idempotency window (``SESSIONFORK_OUTCOME_TTL``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from redis import Redis

from bench.measure import dataset_bytes
from sessionfork.clients.client import Client
from sessionfork.core import forks, keys, records, retention
from sessionfork.core.config import Settings
from sessionfork.core.registry import Registry
from sessionfork.core.wire import NewEvent
from sessionfork.embedded import EmbeddedServer, wait_until

SOURCE = "mem-src"
WORKER_ENV: Mapping[str, str] = {"SESSIONFORK_JOB_TTL": "1", "SESSIONFORK_MAINTENANCE_INTERVAL": "1"}
"""The worker keeps RQ's job state 1 s (default 600 s), so the test need not wait that long."""


@dataclass(frozen=True)
class MemoryReport:
    """Bytes retained per completed request: ``total`` (INFO used_memory growth / requests) and
    its share per key family (``MEMORY USAGE`` growth / requests); ``other`` is the rest (Redis's
    main and expires dictionaries, allocator rounding)."""

    requests: int
    total: float
    families: dict[str, float] = field(default_factory=dict)

    @property
    def other(self) -> float:
        return self.total - sum(self.families.values())

    @property
    def capped(self) -> float:
        """Bytes per request in the capped streams: bounded by their MAXLEN, not by time."""
        return sum(v for k, v in self.families.items() if k in CAPPED)

    @property
    def retained(self) -> float:
        """Bytes per request kept for the whole idempotency window (the bar: ``BAR``)."""
        return self.total - self.capped

    def render(self) -> str:
        rows = [*sorted(self.families.items()), ("other (dictionaries, rounding)", self.other),
                ("total per request", self.total), ("  of which capped streams", self.capped),
                (f"retained per request (bar {BAR:,.0f})", self.retained)]
        return "\n".join(f"{label:<34}{value:>10,.1f}" for label, value in rows)


BAR = 1024.0
"""Bytes a completed single-fork request may retain, child included, at Redis's default settings."""
OUTCOME_ENTRY = "sf:outcomes entry (capped)"
LIFECYCLE_ENTRY = "sf:lifecycle entry (capped)"
CAPPED = (OUTCOME_ENTRY, LIFECYCLE_ENTRY)
RQ_JOBS = "rq:job, rq:results, rq:finished (RQ's job state)"


def _usage(redis: Redis, key: str) -> int:
    return int(redis.memory_usage(key, samples=0) or 0)


def _family_usage(redis: Redis, pattern: str) -> int:
    return sum(_usage(redis, k.decode()) for k in redis.scan_iter(match=pattern, count=1000))


def _families(redis: Redis) -> dict[str, int]:
    return {
        "sf:req:<id> (request record)": _family_usage(redis, keys.request("*")),
        "sf:s:{<child>} (child record)": _family_usage(redis, keys.session("session-*")),
        "children index entry": _usage(redis, keys.session_children(SOURCE)),
        OUTCOME_ENTRY: _usage(redis, keys.OUTCOME_STREAM),
        LIFECYCLE_ENTRY: _usage(redis, keys.LIFECYCLE_STREAM),
        RQ_JOBS: sum(_family_usage(redis, p) for p in ("rq:job:*", "rq:results:*", "rq:finished:*")),
    }


def _start_worker(url: str, name: str, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONFORK_") and k != "REDIS_URL"}
    return subprocess.Popen([sys.executable, "-m", "sessionfork", "--redis-url", url, "worker", "--name", name,
                             "--log-level", "ERROR"], env={**base, **env}, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL)


def _quiet(redis: Redis, worker: str, expect_jobs_gone: bool) -> bool:
    """The worker is idle and, when RQ's job state is short-lived, none of it is left."""
    if redis.hget(f"rq:worker:{worker}", "state") != b"idle":
        return False
    if not expect_jobs_gone:
        return True
    return not any(True for _ in redis.scan_iter(match="rq:job:*", count=1000)) and \
        not any(True for _ in redis.scan_iter(match="rq:results:*", count=1000)) and \
        not redis.zcard("rq:finished:sessionfork")


def _run(client: Client, redis: Redis, n: int) -> None:
    # Generated ids (req-<uuid4>, session-<uuid4>), as the public client makes them by default.
    ids = [client.submit(client.request(SOURCE)) for _ in range(n)]

    def settled() -> bool:
        pipe = redis.pipeline(transaction=False)
        for rid in ids:
            pipe.hmget(keys.request(rid), list(records.OUTCOME_MARKS))
        return all(any(done) for done in pipe.execute())

    wait_until(settled, 120, f"{n} requests to have outcomes", interval=0.05)


LISTPACK_VALUE = "hash-max-listpack-value"
"""The server setting that decides a hash's encoding: a hash with a value longer than it (default
64 bytes) is a hashtable, ~40 % larger than a listpack. Records are written in small fields
(``core.records``), so at the default both a request's record and its child's are listpacks."""


def request_memory(server: EmbeddedServer, requests: int, *, env: Mapping[str, str] = WORKER_ENV,
                   expect_jobs_gone: bool = True, warmup: int = 20) -> MemoryReport:
    """Bytes retained per completed single-fork request (see the module docstring), at the
    server's settings (the embedded server's are Redis's defaults)."""
    return _request_memory(server, server.client(), requests, env, expect_jobs_gone, warmup)


def bytes_held(per_request: float, rate: float, ttl_s: int) -> float:
    """What a steady ``rate`` of requests holds: bytes per request x rate x seconds kept."""
    return per_request * rate * ttl_s


def _request_memory(server: EmbeddedServer, redis: Redis, requests: int, env: Mapping[str, str],
                    expect_jobs_gone: bool, warmup: int) -> MemoryReport:
    redis.execute_command("FLUSHALL", "SYNC")  # type: ignore[no-untyped-call]  # lazy would skew the figures
    registry = Registry(redis)
    handle = registry.create(SOURCE, cwd="/workspace")
    registry.append(handle, [NewEvent("turn/start", {"turn": 1}), NewEvent("user/message", {"text": "hi"}),
                             NewEvent("turn/end", {"turn": 1})])
    name = f"mem-{time.monotonic_ns()}"
    proc = _start_worker(server.url, name, env)
    try:
        wait_until(lambda: redis.hget(f"rq:worker:{name}", "state") is not None, 30, "the worker")
        client = Client(redis, Settings())
        # Warm up: scripts loaded, connections made, the first key of each family (and its encoding) created.
        _run(client, redis, warmup)
        wait_until(lambda: _quiet(redis, name, expect_jobs_gone), 60, "the worker to be idle")
        before, families_before = dataset_bytes(redis), _families(redis)
        _run(client, redis, requests)
        wait_until(lambda: _quiet(redis, name, expect_jobs_gone), 60, "the worker to be idle, jobs expired")
        after, families_after = dataset_bytes(redis), _families(redis)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(20)
    families = {k: (families_after[k] - families_before[k]) / requests for k in families_after}
    return MemoryReport(requests, (after - before) / requests, families)


def child_bytes_at_depth(server: EmbeddedServer, depth: int, children: int = 1000) -> float:
    """Redis bytes per child forked from a session ``depth`` forks deep (each ancestor with a turn
    of its own, so each is a slice of the child's seed)."""
    redis = server.client()
    redis.execute_command("FLUSHALL", "SYNC")  # type: ignore[no-untyped-call]
    registry = Registry(redis)
    registry.append(registry.create("d0"), _turn(0))
    for d in range(1, depth):
        forks.fork(registry, f"d{d - 1}", f"d{d}")
        registry.append(f"d{d}", _turn(d))
    deepest = f"d{depth - 1}"
    for i in range(20):  # warm-up: scripts, the first growth of the keyspace
        forks.fork(registry, deepest, f"warm-{i}")
    before = dataset_bytes(redis)
    for i in range(children):
        forks.fork(registry, deepest, f"child-{i}")
    return (dataset_bytes(redis) - before) / children


def _turn(n: int, size: int = 100) -> list[NewEvent]:
    return [NewEvent("turn/start", {"turn": n}), NewEvent("user/message", {"text": "q" * size}),
            NewEvent("assistant/message", {"text": "a" * 2 * size}), NewEvent("turn/end", {"turn": n})]


@dataclass(frozen=True)
class Steady:
    """used_memory (client buffers excluded) at the half-way mark and at the end of the workload."""

    operations: int
    middle: int
    end: int
    tombstone: int  # MEMORY USAGE of one tombstone (kept forever: a deleted id is never reused)

    @property
    def growth(self) -> float:
        """Second half over first: end / middle (bar with retention on: <= 1.10)."""
        return self.end / self.middle


def steady_workload(server: EmbeddedServer, operations: int, *, retention_ops: int | None,
                    sweep_every: int = 50, lifecycle_cap: int | None = None) -> Steady:
    """A steady create -> append -> fork -> append -> dispose both workload, ``operations`` times.

    Time is the operation count (an injected clock: 1 ms per operation), so the figure does not
    depend on the machine's speed. With ``retention_ops``, a sweep every ``sweep_every`` operations
    deletes what was disposed more than ``retention_ops`` operations ago (as a worker's maintenance
    pass does with ``SESSIONFORK_RETENTION``).
    """
    redis = server.client()
    redis.execute_command("FLUSHALL", "SYNC")  # type: ignore[no-untyped-call]
    now = [T0]
    # The lifecycle stream is capped (MAXLEN ~, 1,000,000 by default): here at 1 entry per
    # operation (8 are written per operation), so that it is at its cap from the first quarter of
    # the run on, as it is in a long-running deployment.
    cap = lifecycle_cap if lifecycle_cap is not None else max(1000, operations)
    registry = Registry(redis, clock=lambda: now[0], lifecycle_maxlen=cap)
    middle = end = 0
    for op in range(operations):
        now[0] += 1
        parent, child = f"s{op}", f"s{op}.1"
        registry.append(registry.create(parent), [*_turn(1, 1000), *_turn(2, 1000)])
        forks.fork(registry, parent, child)
        registry.append(child, _turn(3, 1000))
        registry.dispose(parent)
        registry.dispose(child)
        if retention_ops is not None and (op % sweep_every == 0 or op in (operations // 2, operations - 1)):
            retention.sweep(registry, now_ms=now[0], older_than_ms=retention_ops)
        # Both figures right after a sweep: the same phase of the sweep cycle.
        if op == operations // 2 or op == operations - 1:
            middle, end = (dataset_bytes(redis), 0) if not middle else (middle, dataset_bytes(redis))
    return Steady(operations, middle, end, _usage(redis, keys.session("s0")))


T0 = 1_800_000_000_000


if __name__ == "__main__":
    with EmbeddedServer() as srv:
        if "--depth" in sys.argv:
            for d in (1, 100, 1000):
                print(f"depth {d}: {child_bytes_at_depth(srv, d):,.1f} bytes/child")
        elif "--steady" in sys.argv:
            for r in (None, 1000):
                st = steady_workload(srv, 4000, retention_ops=r)
                print(f"retention {r}: middle {st.middle:,} end {st.end:,} growth {st.growth:.3f} "
                      f"tombstone {st.tombstone}")
        else:
            jobs_gone = "--keep-jobs" not in sys.argv
            redis = srv.client()
            print(f"{LISTPACK_VALUE} {redis.config_get(LISTPACK_VALUE)[LISTPACK_VALUE]} (Redis's default: 64)")
            print(request_memory(srv, 1000, expect_jobs_gone=jobs_gone,
                                 env=WORKER_ENV if jobs_gone else {}).render())
