"""Deletion: the id answers SESSION_NOT_FOUND everywhere and is never reused; not one byte of any
descendant's log changes; a deleted log is freed once no descendant is left. On one real server,
on a real cluster, and racing forks and appends in other processes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any

import pytest
from helpers import turn
from racing import report, run
from redis import Redis
from redis.cluster import RedisCluster
from waits import wait_until

from sessionfork.core import forks, keys
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.registry import DELETED, Registry
from sessionfork.core.wire import NewEvent
from sessionfork.embedded import EmbeddedCluster, EmbeddedServer
from sessionfork.ops.lineage import lineage

TIMEOUT = 60.0


def not_found(call: Callable[[], object]) -> None:
    with pytest.raises(ForkError) as info:
        call()
    assert info.value.code is ErrorCode.SESSION_NOT_FOUND


def family(registry: Registry) -> dict[str, list[Any]]:
    """root (2 turns) -> mid (+1 turn) -> leaf (+1 turn); root -> sib; mid -> leaf2 (no own events)."""
    root = registry.create("root", cwd="/w")
    registry.append(root, [*turn(1), *turn(2)])
    forks.fork(registry, "root", "mid")
    registry.append("mid", turn(3))
    forks.fork(registry, "mid", "leaf")
    registry.append("leaf", turn(4))
    forks.fork(registry, "root", "sib")
    forks.fork(registry, "mid", "leaf2")
    return {sid: registry.events(sid) for sid in ("root", "mid", "leaf", "sib", "leaf2")}


def raw_state(redis: Any, sid: str) -> tuple[Any, ...]:
    """Every byte of a session's record and own log."""
    return redis.hgetall(keys.session(sid)), redis.lrange(keys.session_log(sid), 0, -1)


def test_a_deleted_id_is_not_found_everywhere_and_never_reused(server: EmbeddedServer, registry: Registry) -> None:
    family(registry)
    other = Registry(registry.redis)
    other.events("leaf")  # another process that read it before: its cached lineage must not serve it
    assert registry.delete("leaf") == DELETED
    not_found(lambda: other.events("leaf"))
    not_found(lambda: registry.header("leaf"))
    not_found(lambda: registry.events("leaf"))
    not_found(lambda: registry.append("leaf", [NewEvent("x", {})]))
    not_found(lambda: forks.fork(registry, "leaf", "x1"))
    not_found(lambda: registry.dispose("leaf"))
    not_found(lambda: lineage(registry, "leaf"))
    not_found(lambda: registry.delete("leaf"))
    assert registry.instance("leaf") is None and not registry.exists("leaf")
    with pytest.raises(ForkError) as info:
        registry.create("leaf")
    assert info.value.code is ErrorCode.SESSION_ALREADY_EXISTS
    assert [n.id for n in lineage(registry, "mid").root.children] == ["leaf2"]
    out = subprocess.run([sys.executable, "-m", "sessionfork", "--redis-url", server.url, "tree", "leaf"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "SESSION_NOT_FOUND" in out.stderr


def test_the_cli_deletes(server: EmbeddedServer, registry: Registry) -> None:
    registry.create("gone")
    out = subprocess.run([sys.executable, "-m", "sessionfork", "--redis-url", server.url, "delete", "gone"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert not registry.exists("gone")
    again = subprocess.run([sys.executable, "-m", "sessionfork", "--redis-url", server.url, "delete", "gone"],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "SESSION_NOT_FOUND" in again.stderr


def check_descendants_survive(registry: Registry) -> None:
    redis = registry.redis
    logs = family(registry)
    before = {sid: raw_state(redis, sid) for sid in ("leaf", "sib", "leaf2")}
    registry.delete("root")
    registry.delete("mid")
    assert redis.exists(keys.session_log("root")) and redis.exists(keys.session_log("mid"))  # pinned
    fresh = Registry(redis)  # no cached lineage: reads as any other process would
    for sid in ("leaf", "sib", "leaf2"):
        assert raw_state(redis, sid) == before[sid]  # not one byte changed
        assert fresh.events(sid) == logs[sid] == registry.events(sid)
    forks.fork(fresh, "leaf", "leaf.1")  # a descendant still forks
    assert fresh.events("leaf.1") == logs["leaf"]
    for sid in ("leaf", "leaf2", "leaf.1"):
        registry.delete(sid)
    assert redis.exists(keys.session_log("root"))  # sib still reads root's log
    assert not redis.exists(keys.session_log("mid"))  # mid's last descendant went: freed
    assert fresh.events("sib") == logs["sib"]
    registry.delete("sib")
    left = {k.decode() if isinstance(k, bytes) else k for k in redis.scan_iter(match="sf:s:*")}
    assert left == {keys.session(s) for s in ("root", "mid", "leaf", "sib", "leaf2", "leaf.1")}  # tombstones
    assert all(set(redis.hkeys(k)) == {b"deleted"} for k in left)


def test_descendants_keep_every_byte_and_logs_are_freed_with_the_last(registry: Registry) -> None:
    check_descendants_survive(registry)


def test_deletion_on_a_cluster_touches_one_slot_per_step(cluster_registry: Registry) -> None:
    check_descendants_survive(cluster_registry)


# -- races (module-level bodies: spawned processes import them) ------------------------------------------


def _registry(url: str) -> Registry:
    """A registry on ``url``; a ``#cluster`` suffix means a cluster client."""
    if url.endswith("#cluster"):
        return Registry(RedisCluster.from_url(url.removesuffix("#cluster")))
    return Registry(Redis.from_url(url))


def _forker(url: str, source: str, worker: int, gate: Any, results: Any) -> None:
    def body() -> dict[str, list[str]]:
        registry = _registry(url)
        created, refused = [], []
        gate.wait(TIMEOUT)
        for i in range(200):
            child = f"c-{worker}-{i}"
            try:
                forks.fork(registry, source, child)
            except ForkError as exc:
                if exc.code is not ErrorCode.SESSION_NOT_FOUND:
                    raise
                refused.append(child)
                break  # the source is gone: every later fork fails the same way
            created.append(child)
        return {"created": created, "refused": refused}

    report(results, f"forker-{worker}", body)


def _deleter(url: str, source: str, gate: Any, results: Any) -> None:
    def body() -> str:
        registry = _registry(url)
        gate.wait(TIMEOUT)
        wait_until(lambda: len(registry.children(source)) >= 22, TIMEOUT, "some forks to land first",
                   interval=0.001)
        return registry.delete(source)

    report(results, "deleter", body)


def _appender(url: str, child: str, gate: Any, results: Any) -> None:
    def body() -> int:
        registry = _registry(url)
        gate.wait(TIMEOUT)
        for n in range(50):
            registry.append(child, turn(100 + n))
        return 50

    report(results, f"appender-{child}", body)


def race(ctx: SpawnContext, spawned: list[SpawnProcess], url: str, registry: Registry) -> None:
    src = registry.create("src")
    registry.append(src, [*turn(1), *turn(2)])
    expected = registry.events("src")
    forks.fork(registry, "src", "kid-a")
    forks.fork(registry, "src", "kid-b")
    jobs: list[tuple[Callable[..., None], tuple[Any, ...]]] = [(_forker, (url, "src", w)) for w in range(3)]
    jobs += [(_deleter, (url, "src")), (_appender, (url, "kid-a")), (_appender, (url, "kid-b"))]
    results = run(ctx, spawned, jobs)
    assert results["deleter"] == ("ok", DELETED)
    created = [c for w in range(3) for c in results[f"forker-{w}"][1]["created"]]
    assert len(created) >= 17  # the deleter waited for 22 in the index: kid-a, kid-b and <= 3 in flight
    refused = [c for w in range(3) for c in results[f"forker-{w}"][1]["refused"]]
    assert refused  # forks that came after the deletion failed SESSION_NOT_FOUND
    fresh = Registry(registry.redis)
    assert set(fresh.children("src")) == {*created, "kid-a", "kid-b"}  # the pins: no stale one
    for child in created:  # every fork that won has its whole seed
        assert fresh.events(child) == expected
    for kid in ("kid-a", "kid-b"):  # appends racing the deletion all landed after the seed
        events = fresh.events(kid)
        assert events[:len(expected)] == expected and len(events) == len(expected) + 200
    not_found(lambda: fresh.events("src"))


def test_deletion_racing_forks_and_appends(ctx: SpawnContext, spawned: list[SpawnProcess], server: EmbeddedServer,
                                           registry: Registry) -> None:
    race(ctx, spawned, server.url, registry)


def test_deletion_racing_forks_and_appends_on_a_cluster(ctx: SpawnContext, spawned: list[SpawnProcess],
                                                        cluster: EmbeddedCluster,
                                                        cluster_registry: Registry) -> None:
    race(ctx, spawned, cluster.url + "#cluster", cluster_registry)


def test_retention_sweeps_a_cluster(cluster_registry: Registry) -> None:
    from sessionfork.core.retention import sweep

    registry = cluster_registry
    family(registry)
    logs = registry.events("leaf")
    for sid in ("root", "mid", "sib"):
        registry.dispose(sid)
    swept = sweep(registry, now_ms=registry.state.clock() + 1000, older_than_ms=1)
    assert sorted(s.id for s in swept) == ["mid", "root", "sib"]
    assert Registry(registry.redis).events("leaf") == logs
    assert not registry.redis.zcard(keys.DISPOSED_INDEX)


def test_a_refused_fork_takes_its_pin_back_on_a_cluster(cluster_registry: Registry) -> None:
    registry = cluster_registry
    registry.append(registry.create("src"), turn(1))
    registry.create("taken")
    with pytest.raises(ForkError) as info:
        forks.fork(registry, "src", "taken")
    assert info.value.code is ErrorCode.SESSION_ALREADY_EXISTS
    result = forks.fork_many(registry, "src", ["taken", "fresh"])
    assert [h.id for h in result.created] == ["fresh"]
    assert registry.children("src") == ["fresh"]
    snap = registry.take_snapshot("src")
    registry.create("late")  # taken between the source step and the child step: pinned, then refused
    (refused,) = registry.create_children(snap, ["late"])
    assert isinstance(refused, ForkError) and refused.code is ErrorCode.SESSION_ALREADY_EXISTS
    assert registry.children("src") == ["fresh"]  # the pin was taken back: src's log is freed when it goes
    registry.delete("fresh")
    registry.delete("src")
    assert not registry.redis.exists(keys.session_log("src"))
