"""Retention and persist-before-evict under load, on a real server:

* a session the persistence backend has not written whole is refused ``UNPERSISTED`` for any mark
  short of its length, stays, and a ``session/flush`` is asked — once per interval, not per attempt;
* sessions waiting for the backend never block the sweep of those disposed after them (worker
  pass and ``gc``), and the lifecycle stream gets one flush per waiting session, not one per pass;
* one sweep deletes at most ``limit`` (1,000) sessions, the oldest;
* a sweep changes not one byte of any descendant's record or log (raw Redis bytes).
"""

from __future__ import annotations

import subprocess

import pytest
from helpers import clean_environ, cli_args, start_worker, stop, turn, wait_registered, worker_name
from redis import Redis
from test_deletion import family, raw_state
from waits import wait_until

from sessionfork.core import keys
from sessionfork.core.deletion import FLUSH_REASK_MS
from sessionfork.core.factories import now_ms
from sessionfork.core.registry import DELETED, UNPERSISTED, Registry
from sessionfork.core.retention import sweep
from sessionfork.embedded import EmbeddedServer

HOUR = 3_600_000
BACKLOG = 1_100


def flushes(redis: Redis, sid: str | None = None) -> list[dict[bytes, bytes]]:
    """The ``session/flush`` entries of the lifecycle stream (for ``sid`` only, when given)."""
    entries = [fields for _, fields in redis.xrange(keys.LIFECYCLE_STREAM)]
    return [f for f in entries if f[b"type"] == b"session/flush" and (sid is None or f[b"id"] == sid.encode())]


def _open_session(registry: Registry, sid: str) -> int:
    """A disposed session with an open turn (no ``turn/end``: appends ask no flush); its length."""
    handle = registry.create(sid)
    registry.append(handle, turn(1)[:3])
    registry.dispose(handle)
    return registry.length(sid)


@pytest.mark.parametrize("short_by", [1, 2, 3, None], ids=["len-1", "len-2", "zero", "no-mark"])
def test_a_mark_short_of_the_length_is_unpersisted_and_asks_a_flush(registry: Registry, short_by: int | None) -> None:
    redis = registry.redis
    length = _open_session(registry, "p")
    assert length == 3 and flushes(redis, "p") == []
    if short_by is not None:
        registry.mark_persisted("p", length - short_by)
    assert registry.delete("p", persisted_first=True) == UNPERSISTED
    assert registry.exists("p") and registry.events("p")  # still there, whole
    assert flushes(redis, "p") == [{b"type": b"session/flush", b"id": b"p", b"len": b"3"}]
    assert sweep(registry, now_ms=now_ms() + HOUR, older_than_ms=1, persisted_first=True) == []
    assert registry.exists("p")
    registry.mark_persisted("p", length)
    assert registry.delete("p", persisted_first=True) == DELETED


def test_a_waiting_deletion_asks_once_per_interval_not_per_attempt(registry: Registry) -> None:
    redis = registry.redis
    _open_session(registry, "p")
    for _ in range(5):
        assert registry.delete("p", persisted_first=True) == UNPERSISTED
    sweep(registry, now_ms=now_ms() + HOUR, older_than_ms=1, persisted_first=True)
    assert len(flushes(redis, "p")) == 1  # asked once
    ttl = redis.pttl(keys.session_flush_asked("p"))
    assert 0 < ttl <= FLUSH_REASK_MS
    redis.delete(keys.session_flush_asked("p"))  # the interval is over
    assert registry.delete("p", persisted_first=True) == UNPERSISTED
    assert len(flushes(redis, "p")) == 2  # asked again


def _backlog(redis: Redis) -> None:
    """BACKLOG sessions disposed an hour ago with an event the backend never wrote (an open turn:
    no flush asked by the appends), then one disposed after them and persisted whole ("done")."""
    old = Registry(redis, clock=lambda: now_ms() - HOUR)
    for i in range(BACKLOG):
        handle = old.create(f"w{i}")
        old.append(handle, turn(1)[:1])
        old.dispose(handle)
    _persisted(redis, "done", now_ms() - HOUR // 2)


def _persisted(redis: Redis, sid: str, disposed_at: int) -> None:
    registry = Registry(redis, clock=lambda: disposed_at)
    registry.append(registry.create(sid), turn(1))
    registry.dispose(sid)
    registry.mark_persisted(sid, 4)


def test_the_workers_pass_sweeps_past_sessions_waiting_for_the_backend(server: EmbeddedServer,
                                                                       redis: Redis) -> None:
    registry = Registry(redis)
    _backlog(redis)
    first = {m.decode() for m in redis.zrange(keys.DISPOSED_INDEX, 0, 999)}
    assert len(first) == 1000 and "done" not in first  # a full pass's worth of waiting sessions ahead of it
    assert len(flushes(redis)) == 1  # done's turn/end
    name = worker_name("ret")
    proc = start_worker(server.url, name, SESSIONFORK_RETENTION=60, SESSIONFORK_DELETE_AFTER_PERSIST=1)
    try:
        wait_registered(redis, name)
        wait_until(lambda: not registry.exists("done"), 30, "a pass to sweep the persisted session")
        asked = len(flushes(redis)) - 1
        for n in range(3):  # three more passes, each seen to run (it sweeps one more persisted session)
            _persisted(redis, f"done-{n}", now_ms() - HOUR // 2)
            wait_until(lambda n=n: not registry.exists(f"done-{n}"), 30, f"a pass to sweep done-{n}")
    finally:
        assert stop(proc) == 0
    assert asked == BACKLOG  # one flush per waiting session...
    assert len(flushes(redis)) == 1 + BACKLOG + 3  # ...and none again in later passes (3: done-n's turn/end)
    assert redis.zcard(keys.DISPOSED_INDEX) == BACKLOG
    assert all(registry.exists(f"w{i}") for i in range(0, BACKLOG, 97))  # never deleted unpersisted


def test_gc_sweeps_past_sessions_waiting_for_the_backend(server: EmbeddedServer, redis: Redis) -> None:
    _backlog(redis)
    out = subprocess.run(cli_args(server.url, "gc", "--older-than", "60"), capture_output=True, text=True,
                         env=clean_environ(SESSIONFORK_DELETE_AFTER_PERSIST=1), timeout=120)
    assert out.returncode == 0, out.stderr
    assert "1 session(s) deleted" in out.stdout
    assert not Registry(redis).exists("done")
    assert len(flushes(redis)) == 1 + BACKLOG  # done's turn/end; one per waiting session


def test_one_sweep_deletes_at_most_1000_the_oldest(redis: Redis) -> None:
    for i in range(1_500):
        registry = Registry(redis, clock=lambda i=i: 1_000_000 + i)  # type: ignore[misc]
        registry.dispose(registry.create(f"s{i}"))
    registry = Registry(redis)
    swept = sweep(registry, now_ms=now_ms(), older_than_ms=1)
    assert [s.id for s in swept] == [f"s{i}" for i in range(1_000)]
    assert redis.zcard(keys.DISPOSED_INDEX) == 500
    assert [s.id for s in sweep(registry, now_ms=now_ms(), older_than_ms=1)] == [f"s{i}" for i in range(1_000, 1_500)]


def test_a_workers_maintenance_pass_deletes_at_most_1000(server: EmbeddedServer, redis: Redis) -> None:
    old = Registry(redis, clock=lambda: now_ms() - HOUR)
    for i in range(1_500):
        old.dispose(old.create(f"s{i}"))
    name = worker_name("ret")
    proc = start_worker(server.url, name, SESSIONFORK_RETENTION=60)
    try:
        # The first pass stops at 1,000 (the index holds 500 until the next pass, a second later)...
        wait_until(lambda: redis.zcard(keys.DISPOSED_INDEX) == 500, 30, "a pass to delete 1,000", interval=0.005)
        # ...which deletes the rest.
        wait_until(lambda: redis.zcard(keys.DISPOSED_INDEX) == 0, 30, "the next pass to delete the rest")
    finally:
        assert stop(proc) == 0


@pytest.mark.parametrize("persisted_first", [False, True], ids=["plain", "persisted-first"])
def test_a_sweep_changes_not_one_byte_of_any_descendant(registry: Registry, persisted_first: bool) -> None:
    redis = registry.redis
    logs = family(registry)  # root -> mid -> leaf, root -> sib, mid -> leaf2
    survivors = ("leaf", "sib", "leaf2")
    before = {sid: raw_state(redis, sid) for sid in survivors}
    pinned = {sid: redis.lrange(keys.session_log(sid), 0, -1) for sid in ("root", "mid")}
    for sid in ("root", "mid"):
        registry.dispose(sid)
        if persisted_first:
            registry.mark_persisted(sid, registry.length(sid))
    swept = sweep(registry, now_ms=now_ms() + HOUR, older_than_ms=1, persisted_first=persisted_first)
    assert sorted(s.id for s in swept) == ["mid", "root"] and all(s.log_kept for s in swept)
    fresh = Registry(redis)
    for sid in survivors:
        assert raw_state(redis, sid) == before[sid]  # exact Redis bytes
        assert fresh.events(sid) == logs[sid]
    for sid, raw in pinned.items():  # the logs the descendants read, byte for byte
        assert redis.lrange(keys.session_log(sid), 0, -1) == raw


def test_on_a_cluster_a_waiting_sweep_asks_once_and_passes_over(cluster_registry: Registry) -> None:
    registry = cluster_registry
    old = Registry(registry.redis, clock=lambda: now_ms() - HOUR)
    for i in range(5):
        old.append(old.create(f"cw{i}"), turn(1)[:1])
        old.dispose(f"cw{i}")
    _persisted(registry.redis, "cdone", now_ms() - HOUR // 2)
    for _ in range(3):
        swept = sweep(registry, now_ms=now_ms(), older_than_ms=60_000, limit=3, persisted_first=True)
        if swept:
            assert [s.id for s in swept] == ["cdone"]
    assert not registry.exists("cdone") and all(registry.exists(f"cw{i}") for i in range(5))
    assert sorted(f[b"id"] for f in flushes(registry.redis) if f[b"id"].startswith(b"cw")) == [
        f"cw{i}".encode() for i in range(5)]  # once each, however many passes
