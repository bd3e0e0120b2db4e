"""Freeing a summary child's source while other processes read and fork its descendants: deleters
take summary children away one by one (each deletion frees more of the deleted source), readers
compare every descendant's log with what it was, forkers fork the children that stay. On one
server and on the 3-master cluster; the readers prove the race by seeing the source's freed prefix
grow while they read."""

from __future__ import annotations

from collections.abc import Callable
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any

from helpers import turn
from racing import report, run
from redis import Redis
from redis.cluster import RedisCluster
from waits import wait_until

import sessionfork
from sessionfork.core import forks, keys
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.registry import Registry
from sessionfork.embedded import EmbeddedCluster, EmbeddedServer

TIMEOUT = 60.0
READS = "race:{freeing}:reads"  # test keys (one slot), not sessionfork's
OVER = "race:{freeing}:over"
DOOMED = [(f"d{k}", k) for k in range(4, 64, 4)]  # summary children deleted during the race, by keepFrom
KEPT = [("s64", 64), ("s72", 72)]  # summary children that stay (the least need left: 64)


def _registry(url: str) -> Registry:
    if url.endswith("#cluster"):
        return Registry(RedisCluster.from_url(url.removesuffix("#cluster")))
    return Registry(Redis.from_url(url))


def _deleter(url: str, doomed: list[str], gate: Any, results: Any) -> None:
    def body() -> int:
        registry = _registry(url)
        gate.wait(TIMEOUT)
        for sid in doomed:
            registry.delete(f"{sid}.g")
            started = int(registry.redis.get(READS) or 0)
            registry.delete(sid)
            # lockstep: a whole read pass after each deletion, so the readers see every step
            wait_until(lambda s=started: int(registry.redis.get(READS) or 0) > s + 1, TIMEOUT, "a read pass")
        return len(doomed)

    report(results, "deleter", body)


def _reader(url: str, expected: dict[str, list[Any]], name: str, gate: Any, results: Any) -> None:
    def body() -> dict[str, Any]:
        registry = _registry(url)
        gate.wait(TIMEOUT)
        seen: set[int] = set()
        wrong: list[str] = []
        passes = 0
        while not registry.redis.exists(OVER):
            seen.add(int(registry.redis.hget(keys.session("src"), "freed") or 0))
            for sid, log in expected.items():
                try:
                    if Registry(registry.redis).events(sid) != log:
                        wrong.append(sid)
                except ForkError as exc:
                    if exc.code is not ErrorCode.SESSION_NOT_FOUND or not sid.startswith("d"):
                        raise
            passes += 1
            registry.redis.incr(READS)
        return {"seen": sorted(seen), "wrong": wrong, "passes": passes}

    report(results, name, body)


def _forker(url: str, gate: Any, results: Any) -> None:
    def body() -> int:
        registry = _registry(url)
        gate.wait(TIMEOUT)
        made = 0
        while not registry.redis.exists(OVER):
            for sid, _ in KEPT:
                log = registry.events(sid)
                kid = forks.fork(registry, sid, f"{sid}.f{made}", boundary=4).id
                again = sessionfork.Summary(keep_from=5, data="again")
                summary = forks.fork(registry, sid, f"{sid}.s{made}", summary=again).id
                assert registry.events(kid) == log[:5]
                assert [(e.type, e.data) for e in registry.events(summary)[1:]] == [(e.type, e.data) for e in log[5:]]
                made += 1
        return made

    report(results, "forker", body)


def _stopper(url: str, gate: Any, results: Any) -> None:
    def body() -> None:
        registry = _registry(url)
        gate.wait(TIMEOUT)
        wait_until(lambda: not registry.redis.smembers(keys.session_children("src")) - {b"s64", b"s72"}, TIMEOUT,
                   "the doomed children to go")
        started = int(registry.redis.get(READS) or 0)
        wait_until(lambda: int(registry.redis.get(READS) or 0) > started + 2, TIMEOUT, "a last read pass")
        registry.redis.set(OVER, 1)

    report(results, "stopper", body)


def race(ctx: SpawnContext, spawned: list[SpawnProcess], url: str, registry: Registry) -> None:
    registry.append(registry.create("src"), [e for n in range(20) for e in turn(n)])  # 80 events
    for sid, k in [*DOOMED, *KEPT]:
        forks.fork(registry, "src", sid, summary=sessionfork.Summary(keep_from=k, data=sid))
        registry.append(sid, turn(100))
        forks.fork(registry, sid, f"{sid}.g", boundary=4)
    expected = {sid: registry.events(sid) for s, _ in [*DOOMED, *KEPT] for sid in (s, f"{s}.g")}
    registry.delete("src")
    assert int(registry.redis.hget(keys.session("src"), "freed") or 0) == 4
    doomed = [sid for sid, _ in DOOMED]
    jobs: list[tuple[Callable[..., None], tuple[Any, ...]]] = [
        (_deleter, (url, doomed)), (_reader, (url, expected, "reader-1")), (_reader, (url, expected, "reader-2")),
        (_forker, (url,)), (_stopper, (url,))]
    results = run(ctx, spawned, jobs)
    assert results["deleter"] == ("ok", len(doomed))
    seen: set[int] = set()
    for name in ("reader-1", "reader-2"):
        status, found = results[name]
        assert status == "ok" and found["wrong"] == [], found
        assert len(found["seen"]) >= 2, found  # the race: the freed prefix grew while it read
        seen |= set(found["seen"])
    assert len(seen) >= 8, seen
    assert results["forker"][1] > 0
    assert int(registry.redis.hget(keys.session("src"), "freed") or 0) == 64  # the least need left
    fresh = Registry(registry.redis)
    for sid, _ in KEPT:
        assert fresh.events(sid) == expected[sid] and fresh.events(f"{sid}.g") == expected[f"{sid}.g"]


def test_freeing_races_reads_forks_and_deletions(ctx: SpawnContext, spawned: list[SpawnProcess],
                                                 server: EmbeddedServer, registry: Registry) -> None:
    race(ctx, spawned, server.url, registry)


def test_freeing_races_reads_forks_and_deletions_on_a_cluster(ctx: SpawnContext, spawned: list[SpawnProcess],
                                                              cluster: EmbeddedCluster,
                                                              cluster_registry: Registry) -> None:
    race(ctx, spawned, f"{cluster.url}#cluster", cluster_registry)
