"""How the JSONL persistence backend consumes the lifecycle stream: at least once with exactly one
line per event, pending entries reclaimed and failed writes retried, bad or trimmed entries acked
without writing, a vanished group created again; and its run loop's bounds."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from persist_fixtures import (
    GROUP,
    Factory,
    drain,
    expected_lines,
    file_lines,
    file_of,
    fork,
    pending,
    session_with_turns,
)
from redis import Redis
from waits import wait_until

from sessionfork.core import keys
from sessionfork.core.registry import Registry

# -- at least once, exactly one line per event ---------------------------------------------------


def test_repeated_flush_entries_write_no_duplicate_lines(registry: Registry, root: Path,
                                                         make_backend: Factory) -> None:
    sid = session_with_turns(registry, 2)
    backend = make_backend()
    drain(backend)
    for _ in range(3):
        registry.flush(sid)
    assert drain(backend) == 3
    assert file_lines(file_of(registry, root, sid)) == expected_lines(registry, sid)


def test_redelivered_entry_after_restart_writes_no_duplicate_lines(registry: Registry, redis: Redis, root: Path,
                                                                   make_backend: Factory) -> None:
    sid = session_with_turns(registry, 2)
    redis.xgroup_create(keys.LIFECYCLE_STREAM, GROUP, id="0")
    delivered = redis.xreadgroup(GROUP, "dead", {keys.LIFECYCLE_STREAM: ">"}, count=100)[0][1]
    make_backend(consumer="dead").sync(sid)  # written, then the consumer died before its ack
    redis.xclaim(keys.LIFECYCLE_STREAM, GROUP, "c1", 0, [entry_id for entry_id, _ in delivered])
    assert drain(make_backend()) == 3
    assert file_lines(file_of(registry, root, sid)) == expected_lines(registry, sid)
    assert pending(redis) == 0


def test_second_group_replaying_whole_stream_writes_no_duplicates(registry: Registry, root: Path,
                                                                  make_backend: Factory) -> None:
    parent = session_with_turns(registry, 2)
    child = fork(registry, parent)
    drain(make_backend())
    assert drain(make_backend(group="replay", consumer="r1")) == 4
    for sid in (parent, child):
        assert file_lines(file_of(registry, root, sid)) == expected_lines(registry, sid)


# -- reclaiming ----------------------------------------------------------------------------------


def test_dead_consumer_pending_entries_are_reclaimed(registry: Registry, redis: Redis, root: Path,
                                                     make_backend: Factory) -> None:
    sid = session_with_turns(registry, 2)
    redis.xgroup_create(keys.LIFECYCLE_STREAM, GROUP, id="0")
    assert len(redis.xreadgroup(GROUP, "dead", {keys.LIFECYCLE_STREAM: ">"}, count=100)[0][1]) == 3
    backend = make_backend(consumer="live", claim_idle_ms=50)
    path = file_of(registry, root, sid)
    wait_until(lambda: backend.step() >= 0 and path.exists() and pending(redis) == 0, 10, "entries reclaimed")
    assert file_lines(path) == expected_lines(registry, sid)


def test_own_pending_entries_are_read_again_after_restart(registry: Registry, redis: Redis, root: Path,
                                                          make_backend: Factory) -> None:
    sid = session_with_turns(registry, 2)
    redis.xgroup_create(keys.LIFECYCLE_STREAM, GROUP, id="0")
    redis.xreadgroup(GROUP, "c1", {keys.LIFECYCLE_STREAM: ">"}, count=100)  # read, then "crashed"
    assert drain(make_backend(claim_idle_ms=60_000)) == 3
    assert file_lines(file_of(registry, root, sid)) == expected_lines(registry, sid)
    assert pending(redis) == 0


def test_failed_write_leaves_entry_pending(registry: Registry, redis: Redis, root: Path,
                                           make_backend: Factory) -> None:
    registry.create()
    root.write_bytes(b"not a directory")
    assert make_backend().step() == 0
    assert pending(redis) == 1


def test_failed_write_is_retried_once_idle(registry: Registry, redis: Redis, root: Path,
                                           make_backend: Factory) -> None:
    sid = registry.create().id
    root.write_bytes(b"not a directory")
    backend = make_backend(claim_idle_ms=50)
    backend.step()
    root.unlink()
    wait_until(lambda: backend.step() >= 0 and pending(redis) == 0, 10, "the failed entry retried")
    assert file_lines(file_of(registry, root, sid)) == expected_lines(registry, sid)


# -- bad entries ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fields", [
    {"type": "session/renamed", "id": "s1", "len": 0},
    {"type": "session/flush", "id": "a/b", "len": 0},
    {"type": "session/flush", "id": "never-created", "len": 0},
    {"kind": "nothing we know"},
], ids=["unknown-type", "invalid-id", "missing-session", "no-fields-we-know"])
def test_bad_entry_is_acked_without_writing(registry: Registry, redis: Redis, root: Path, make_backend: Factory,
                                            fields: dict[str, Any]) -> None:
    registry.create("s1")
    redis.xadd(keys.LIFECYCLE_STREAM, fields)
    assert drain(make_backend()) == 2
    assert pending(redis) == 0
    assert [p.name for p in root.rglob("*.jsonl")] == ["s1.jsonl"]


def test_pending_entry_trimmed_from_stream_is_dropped(registry: Registry, redis: Redis,
                                                      make_backend: Factory) -> None:
    registry.create()
    redis.xgroup_create(keys.LIFECYCLE_STREAM, GROUP, id="0")
    ((_, [(entry_id, _)]),) = redis.xreadgroup(GROUP, "c1", {keys.LIFECYCLE_STREAM: ">"}, count=100)
    redis.xdel(keys.LIFECYCLE_STREAM, entry_id)
    assert drain(make_backend(claim_idle_ms=60_000)) == 0
    assert pending(redis) == 0


def test_group_is_created_again_when_stream_vanishes(registry: Registry, redis: Redis, root: Path,
                                                     make_backend: Factory) -> None:
    backend = make_backend()
    drain(backend)
    redis.delete(keys.LIFECYCLE_STREAM)
    sid = registry.create().id
    redis.delete(keys.LIFECYCLE_STREAM)  # the server lost the stream and its group after this
    registry.flush(sid)
    wait_until(lambda: backend.step() >= 0 and file_of(registry, root, sid).exists(), 10, "group recreated")
    assert file_lines(file_of(registry, root, sid)) == expected_lines(registry, sid)


# -- the loop ------------------------------------------------------------------------------------


def test_run_returns_after_max_entries(registry: Registry, make_backend: Factory) -> None:
    session_with_turns(registry, 2)
    assert make_backend().run(max_entries=3) == 3


def test_run_returns_at_once_when_stop_is_set(registry: Registry, make_backend: Factory) -> None:
    registry.create()
    stop_now = threading.Event()
    stop_now.set()
    assert make_backend().run(stop=stop_now) == 0
