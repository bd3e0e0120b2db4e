"""What a fork makes, against a real server: the child's header (parent, seed length, cwd, clock) in
the compact layout, its own live instance token, its next seq, its entry in the parent's children
index; forks of an empty source; and snapshots, which return the seed and create nothing."""

from __future__ import annotations

import json
from itertools import count

import pytest
from fork_helpers import completed_source, fork_error, not_live, state, turn
from msgspec import UNSET
from redis import Redis

from sessionfork.core import forks, keys, wire
from sessionfork.core.registry import Registry
from sessionfork.core.wire import Header, LiveHandle, NewEvent, SeedMeta

NOW = 1_700_000_000_000


@pytest.fixture
def clocked(redis: Redis) -> Registry:
    """A registry whose clock reads NOW, NOW + 1, ... and whose tokens are tok-1, tok-2, ..."""
    ticks = count(NOW)
    tokens = count(1)
    return Registry(redis, clock=lambda: next(ticks), new_token=lambda: f"tok-{next(tokens)}")


# -- the child's header and liveness ---------------------------------------------------------------


def test_child_header_records_parent_seed_length_cwd_and_clock(clocked: Registry, redis: Redis) -> None:
    completed_source(clocked, cwd="/work/dir")  # clock: create NOW, append NOW+1
    header = forks.fork(clocked, "src", "child")  # clock: NOW+2
    expected = Header(version=0, id="child", created_at=NOW + 2, cwd="/work/dir", parent_session="src",
                      seed_length=4)
    assert header == expected
    assert clocked.header("child") == expected
    # Stored in the compact layout (core/records.py): small fields, the id the key's.
    assert redis.hmget(keys.session("child"), ["header", "cwd", "parent"]) == [
        f"[0,{NOW + 2},4]".encode(), b"/work/dir", b"src"]


def test_child_header_has_no_cwd_key_when_the_source_has_none(registry: Registry, redis: Redis) -> None:
    completed_source(registry)
    forks.fork(registry, "src", "child")
    assert not redis.hexists(keys.session("child"), "cwd")
    assert registry.header("child").cwd is UNSET
    raw = wire.encode_header(registry.header("child"))
    assert b'"cwd"' not in raw
    assert b"null" not in raw
    assert set(json.loads(raw)) == {"version", "id", "createdAt", "parentSession", "seedLength"}


def test_root_header_has_no_lineage_keys(registry: Registry, redis: Redis) -> None:
    registry.create("root")
    assert not redis.hexists(keys.session("root"), "parent")
    assert len(json.loads(redis.hget(keys.session("root"), "header") or b"")) == 2  # [version, createdAt]
    assert set(json.loads(wire.encode_header(registry.header("root")))) == {"version", "id", "createdAt"}


def test_child_is_live_with_its_own_instance_token(clocked: Registry) -> None:
    source = completed_source(clocked)
    forks.fork(clocked, source, "child")
    assert source.instance == "tok-1"
    assert clocked.instance("child") == "tok-2"
    assert clocked.instance("src") == "tok-1"


def test_child_token_differs_from_parent_token_with_default_tokens(registry: Registry) -> None:
    source = completed_source(registry)
    forks.fork(registry, source, "child")
    child_token = registry.instance("child")
    assert child_token is not None
    assert child_token != source.instance


def test_child_is_appendable_and_disposable_by_its_own_token(registry: Registry) -> None:
    source = completed_source(registry)
    forks.fork(registry, source, "child")
    token = registry.instance("child")
    assert token is not None
    registry.append(LiveHandle("child", token), turn())
    with fork_error(*not_live("child")):
        registry.append(LiveHandle("child", source.instance), turn())
    registry.dispose(LiveHandle("child", token))
    assert registry.instance("child") is None
    assert registry.instance("src") == source.instance


def test_childs_next_event_seq_is_seed_length(registry: Registry) -> None:
    completed_source(registry)
    header = forks.fork(registry, "src", "child")
    appended = registry.append("child", [NewEvent("turn/start")])
    assert header.seed_length == 4
    assert appended[0].seq == 4
    assert [e.seq for e in registry.events("child")] == [0, 1, 2, 3, 4]
    assert registry.length("child") == 5


def test_fork_registers_the_child_in_the_parents_children_index(registry: Registry) -> None:
    completed_source(registry)
    forks.fork(registry, "src", "b")
    forks.fork(registry, "src", "a")
    assert registry.children("src") == ["a", "b"]
    assert registry.children("a") == []


# -- empty sources and snapshots -------------------------------------------------------------------


def test_fork_of_an_empty_source_has_an_empty_seed(registry: Registry, redis: Redis) -> None:
    registry.create("src")
    header = forks.fork(registry, "src", "child")
    assert header.seed_length == 0
    assert registry.events("child") == []
    assert registry.length("child") == 0
    assert json.loads(redis.hget(keys.session("child"), "header") or b"")[2] == 0  # [version, createdAt, seedLength]


def test_child_of_an_empty_source_starts_at_seq_zero_and_is_forkable(registry: Registry) -> None:
    registry.create("src")
    forks.fork(registry, "src", "child")
    assert forks.fork(registry, "child", "grandchild").seed_length == 0
    assert registry.append("child", [NewEvent("turn/start")])[0].seq == 0


def test_snapshot_of_an_empty_source(registry: Registry) -> None:
    registry.create("src", cwd="/w")
    assert forks.snapshot(registry, "src") == ([], SeedMeta(parent_session="src", seed_length=0, cwd="/w"))


def test_snapshot_returns_events_and_seed_meta(registry: Registry) -> None:
    handle = completed_source(registry)
    events, meta = forks.snapshot(registry, handle)
    assert events == registry.events("src")
    assert [e.type for e in events] == ["turn/start", "user/message", "assistant/message", "turn/end"]
    assert meta == SeedMeta(parent_session="src", seed_length=4)


def test_snapshot_does_not_create_anything(registry: Registry, redis: Redis) -> None:
    completed_source(registry)
    before = state(redis)
    forks.snapshot(registry, "src")
    assert state(redis) == before


def test_mutating_snapshot_events_does_not_change_the_source(registry: Registry) -> None:
    handle = registry.create("src")
    registry.append(handle, [NewEvent("turn/start", {"list": [1, 2], "nested": {"k": "v"}},
                                      {"sourceEventSeqs": [0]}), NewEvent("turn/end")])
    before = registry.events("src")
    events, _ = forks.snapshot(registry, handle)
    events[0].data["list"].append(3)
    events[0].data["nested"]["k"] = "changed"
    events[0].data["new"] = True
    events[0].extra["sourceEventSeqs"].append(9)
    events[0].extra["surfaceOp"] = "x"
    events[1].type = "mutated"
    events.pop()
    assert registry.events("src") == before
    assert forks.snapshot(registry, handle)[0] == before
