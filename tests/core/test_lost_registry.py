"""A registry that lost its data is detected, never silently served.

A fork is two steps: the source step reads the source, the child step creates the children with
references to the source's log. If the source's server restarts empty in between (or loses writes
in a failover), a child created from the snapshot would name a seed nobody can read, and a new
session taking the source's id later would become every orphan's seed. The child step checks that
the source is still the session snapshotted, at least as long: atomically in the child's script on
one server, right after on a cluster (the children are then deleted). The fork then fails as
``SESSION_NOT_FOUND``, and no child is left.
"""

from __future__ import annotations

import itertools

import pytest
from helpers import count_session_keys, turn
from redis import Redis
from redis.cluster import RedisCluster
from waits import outcome_of

from sessionfork.core import keys, records
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.forks import create, fork, fork_many, make_spec
from sessionfork.core.registry import Registry
from sessionfork.core.wire import NewEvent


def lost(call: object) -> None:
    with pytest.raises(ForkError) as info:
        call()  # type: ignore[operator]
    assert info.value.code is ErrorCode.SESSION_NOT_FOUND, info.value


def test_a_server_restarted_empty_between_the_steps_yields_no_child(redis: Redis, registry: Registry) -> None:
    registry.create("src")
    registry.append("src", turn(1))
    ids = [f"c{i}" for i in range(64)]
    plan = registry.prepare_fork("src", ids, request_id="r-1")  # the source step
    redis.flushall()  # the server restarts empty before the child step

    lost(lambda: create(registry, make_spec("src", ids, request_id="r-1"), plan))
    assert count_session_keys(redis) == 0
    assert redis.xlen(keys.LIFECYCLE_STREAM) == 0  # no session/created for a child that is not there


def test_a_new_session_under_the_lost_sources_id_never_becomes_a_seed(redis: Redis) -> None:
    clock = itertools.count(1_000)
    registry = Registry(redis, clock=lambda: next(clock))
    registry.create("src")
    registry.append("src", turn(1))
    snap = registry.take_snapshot("src")
    redis.flushall()
    registry.create("src")  # someone takes the id again, and writes more than the old log
    registry.append("src", turn(1) + turn(2))

    lost(lambda: registry.create_children(snap, ["orphan"]))
    assert not registry.exists("orphan")
    assert registry.children("src") == []


@pytest.mark.parametrize("cwd", ["/other", None])
def test_a_source_recreated_at_the_same_time_with_another_cwd_is_lost(redis: Redis, cwd: str | None) -> None:
    """The script compares the parent's stored fields first: its header field alone (the same
    version, createdAt and seedLength) must not pass a parent whose cwd changed."""
    registry = Registry(redis, clock=lambda: 1_000)
    registry.append(registry.create("src", cwd="/w"), turn(1))
    snap = registry.take_snapshot("src")
    redis.flushall()
    registry.append(registry.create("src", cwd=cwd), turn(1))
    assert redis.hget(keys.session("src"), "header") == records.compact_header(snap.source)  # only the cwd differs

    lost(lambda: registry.create_children(snap, ["orphan"]))
    assert not registry.exists("orphan")


def test_a_source_recreated_at_the_same_time_under_another_parent_is_lost(redis: Redis) -> None:
    registry = Registry(redis, clock=lambda: 1_000)
    for parent in ("p1", "p2"):
        registry.append(registry.create(parent), turn(1))
    fork(registry, "p1", "src")
    snap = registry.take_snapshot("src")
    redis.flushall()
    for parent in ("p1", "p2"):
        registry.append(registry.create(parent), turn(1))
    fork(registry, "p2", "src")  # the same header field and cwd, another parent
    assert redis.hget(keys.session("src"), "header") == records.compact_header(snap.source)

    lost(lambda: registry.create_children(snap, ["orphan"]))
    assert not registry.exists("orphan")


def test_a_source_whose_record_is_spelled_otherwise_still_passes_the_check(redis: Redis) -> None:
    """The old layout's one JSON header, and compact fields another writer spelled otherwise (the
    same array with spaces): compared decoded, the same session, so the fork succeeds."""
    old = Registry(redis, compact_records=False)
    old.append(old.create("a", cwd="/w"), turn(1))
    registry = Registry(redis)
    registry.append(registry.create("b", cwd="/w"), turn(1))
    raw = redis.hget(keys.session("b"), "header")
    assert raw is not None and b"," in raw
    redis.hset(keys.session("b"), "header", raw.replace(b",", b", "))
    for source in ("a", "b"):
        created = outcome_of(lambda s=source: fork_many(registry, s, [f"{s}-1", f"{s}-2"]).created)
        assert isinstance(created, list), created  # forked, not refused as lost
        assert [(h.id, h.parent_session, h.cwd) for h in created] == [(f"{source}-1", source, "/w"),
                                                                   (f"{source}-2", source, "/w")]


def test_a_source_that_shrank_is_lost_too(redis: Redis, registry: Registry) -> None:
    registry.create("src")
    registry.append("src", turn(1))
    snap = registry.take_snapshot("src")
    redis.hset(keys.session("src"), "len", 2)  # lost writes: a replica promoted before it had them

    lost(lambda: registry.create_children(snap, ["c"]))
    assert not registry.exists("c")


def test_a_healthy_fork_and_its_replay_still_pass_the_check(registry: Registry) -> None:
    registry.create("src", cwd="/w")
    registry.append("src", turn(1))
    first = fork_many(registry, "src", ["a", "b"], request_id="r-ok")
    registry.append("src", [NewEvent("turn/start"), NewEvent("turn/end")])  # the source moves on
    again = fork_many(registry, "src", ["a", "b"], request_id="r-ok")
    assert [h.id for h in first.created] == [h.id for h in again.created] == ["a", "b"]
    assert fork(registry, "src", "c").seed_length == 6


def test_on_a_cluster_children_of_a_lost_source_are_deleted(cluster_registry: Registry,
                                                            cluster_client: RedisCluster) -> None:
    cluster_registry.create("csrc")
    cluster_registry.append("csrc", turn(1))
    snap = cluster_registry.take_snapshot("csrc")
    cluster_client.delete(keys.session("csrc"), keys.session_log("csrc"))  # its node restarted empty
    ids = [f"cc{i}" for i in range(12)]  # spread over the three masters

    lost(lambda: cluster_registry.create_children(snap, ids))
    assert not set(ids) & session_keys_on(cluster_client)


def session_keys_on(client: RedisCluster) -> set[str]:
    return {k.decode()[len("sf:s:{"):-1] for k in client.scan_iter(match="sf:s:*", target_nodes=RedisCluster.ALL_NODES)
            if k.decode().endswith("}")}

