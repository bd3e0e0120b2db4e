"""Fork semantics on a Redis Cluster (3 primaries, 1 replica each), in the library.

The error codes and messages, lineage reads, independence, idempotency (a replay after the source
opened a turn, a fan-out with one taken id), the spread of sessions over the primaries, WAIT on the
replay path, and, last, that no node of this module's cluster ever answered CROSSSLOT. The worker
path is in test_cluster_worker.py, races and lineage in test_cluster_races.py, failover in
test_cluster_failover.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from cluster_fixtures import assert_no_crossslot, completed_source, edges, session_ids
from fork_helpers import fork_error
from helpers import turn
from msgspec import UNSET
from redis.cluster import RedisCluster

from sessionfork.core import forks
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.lua import NotReplicated
from sessionfork.core.registry import Registry
from sessionfork.core.wire import Event, LiveHandle, NewEvent
from sessionfork.embedded import EmbeddedCluster
from sessionfork.ops import lineage

SPREAD_SESSIONS = 60


def shape(events: Sequence[Event]) -> list[tuple[int, str, Any]]:
    return [(e.seq, e.type, e.data) for e in events]


# -- fork semantics --------------------------------------------------------------------------------


def test_fork_of_a_never_created_session_is_session_not_found(cluster_registry: Registry) -> None:
    with fork_error(ErrorCode.SESSION_NOT_FOUND, 'session "ghost" not found'):
        forks.fork(cluster_registry, "ghost", "child")
    assert not cluster_registry.exists("child")


def test_fork_of_a_disposed_session_is_session_not_found(cluster_registry: Registry) -> None:
    cluster_registry.dispose(completed_source(cluster_registry, "gone"))
    with fork_error(ErrorCode.SESSION_NOT_FOUND, 'session "gone" not found'):
        forks.fork(cluster_registry, "gone", "child")
    assert not cluster_registry.exists("child")


def test_fork_by_a_stale_handle_is_session_not_live(cluster_registry: Registry) -> None:
    completed_source(cluster_registry, "src")
    with fork_error(ErrorCode.SESSION_NOT_LIVE,
                    'live handle of session "src" is stale: its instance is not the live one'):
        forks.fork(cluster_registry, LiveHandle("src", "stale-token"), "child")
    assert not cluster_registry.exists("child")


def test_fork_into_an_existing_session_is_session_already_exists(cluster_registry: Registry) -> None:
    completed_source(cluster_registry, "src")
    cluster_registry.create("taken")
    with fork_error(ErrorCode.SESSION_ALREADY_EXISTS, 'session "taken" already exists'):
        forks.fork(cluster_registry, "src", "taken")
    assert cluster_registry.header("taken").parent_session is UNSET


def test_fork_into_a_disposed_id_is_session_already_exists(cluster_registry: Registry) -> None:
    completed_source(cluster_registry, "src")
    cluster_registry.dispose(cluster_registry.create("gone"))
    with fork_error(ErrorCode.SESSION_ALREADY_EXISTS, 'session "gone" already exists'):
        forks.fork(cluster_registry, "src", "gone")


def test_duplicate_child_id_is_reported_before_open_turn_of_the_source(cluster_registry: Registry) -> None:
    handle = completed_source(cluster_registry, "src")
    cluster_registry.create("taken")
    cluster_registry.append(handle, [NewEvent("turn/start")])
    with fork_error(ErrorCode.SESSION_ALREADY_EXISTS, 'session "taken" already exists'):
        forks.fork(cluster_registry, handle, "taken")


@pytest.mark.parametrize("tail", [["turn/start"], ["turn/start", "user/message"],
                                  ["turn/start", "assistant/message", "tool/call"]],
                         ids=["turn-start", "user-message", "tool-call"])
def test_fork_inside_an_open_turn_is_open_turn_naming_the_last_event(
    cluster_registry: Registry, tail: list[str]
) -> None:
    handle = completed_source(cluster_registry, "src")
    cluster_registry.append(handle, [NewEvent(t) for t in tail])
    message = f'cannot fork session "src" inside an open turn (last event: {tail[-1]})'
    with fork_error(ErrorCode.OPEN_TURN, message):
        forks.fork(cluster_registry, "src", "child")
    assert not cluster_registry.exists("child")


def test_fork_of_a_fork_of_a_fork_reads_the_right_events_at_every_level(cluster_registry: Registry) -> None:
    expected: dict[str, list[tuple[int, str, Any]]] = {"A": []}

    def add(sid: str, n: int) -> None:
        events = turn(n)
        cluster_registry.append(sid, events)
        log = expected[sid]
        base = len(log)
        log.extend((base + i, e.type, e.data) for i, e in enumerate(events))

    def fork(parent: str, child: str) -> None:
        forks.fork(cluster_registry, parent, child)
        expected[child] = list(expected[parent])

    cluster_registry.create("A")
    add("A", 0)
    fork("A", "B")
    add("A", 1)  # after the fork: not in B
    add("B", 2)
    fork("B", "C")
    add("B", 3)
    add("C", 4)
    add("C", 5)
    fork("C", "D")
    add("C", 6)
    fork("D", "E")  # E has no own events: its seed is D's whole log
    add("D", 7)

    for sid, log in expected.items():
        assert shape(cluster_registry.events(sid)) == log, sid
        for start in range(0, len(log) + 1, 3):
            assert shape(cluster_registry.events(sid, start, start + 5)) == log[start:start + 5], (sid, start)
    assert [len(expected[s]) for s in "ABCDE"] == [8, 12, 20, 20, 16]
    assert [cluster_registry.header(s).seed_length for s in "BCDE"] == [4, 8, 16, 16]
    assert [cluster_registry.header(s).parent_session for s in "BCDE"] == ["A", "B", "C", "D"]


def test_append_to_the_source_after_a_fork_does_not_change_the_child(cluster_registry: Registry) -> None:
    completed_source(cluster_registry, "src")
    forks.fork(cluster_registry, "src", "child")
    before = cluster_registry.events("child")
    cluster_registry.append("src", turn(2))
    assert cluster_registry.events("child") == before
    assert cluster_registry.length("child") == 4
    assert cluster_registry.events("src")[:4] == before


def test_append_to_the_child_does_not_change_the_source(cluster_registry: Registry) -> None:
    completed_source(cluster_registry, "src")
    forks.fork(cluster_registry, "src", "child")
    source = cluster_registry.events("src")
    added = cluster_registry.append("child", turn(2))
    assert [e.seq for e in added] == [4, 5, 6, 7]
    assert cluster_registry.events("src") == source
    assert cluster_registry.events("child") == source + added


# -- idempotency -----------------------------------------------------------------------------------


def test_fork_retried_with_its_request_id_returns_the_same_child_after_the_source_opened_a_turn(
    cluster: EmbeddedCluster, cluster_registry: Registry
) -> None:
    handle = completed_source(cluster_registry, "src")
    first = forks.fork(cluster_registry, "src", "c", request_id="r")
    cluster_registry.append(handle, [NewEvent("turn/start")])
    again = forks.fork(cluster_registry, "src", "c", request_id="r")
    assert again == first
    assert cluster_registry.children("src") == ["c"]
    assert session_ids(cluster) == {"src", "c"}


def test_fan_out_with_one_existing_id_reports_it_failed_and_creates_the_rest(
    cluster: EmbeddedCluster, cluster_registry: Registry
) -> None:
    completed_source(cluster_registry, "src")
    cluster_registry.create("k2")
    ids = [f"k{i}" for i in range(6)]
    result = forks.fork_many(cluster_registry, "src", ids, request_id="fan")
    assert [h.id for h in result.created] == ["k0", "k1", "k3", "k4", "k5"]
    assert [(cid, e.code, e.message) for cid, e in result.failed] == [
        ("k2", ErrorCode.SESSION_ALREADY_EXISTS, 'session "k2" already exists')]
    assert cluster_registry.children("src") == ["k0", "k1", "k3", "k4", "k5"]
    assert {h.seed_length for h in result.created} == {4}
    assert cluster_registry.header("k2").parent_session is UNSET
    assert session_ids(cluster) == {"src", *ids}


# -- key spread ------------------------------------------------------------------------------------


def test_sixty_sessions_spread_over_every_master(cluster: EmbeddedCluster, cluster_registry: Registry) -> None:
    for i in range(SPREAD_SESSIONS):
        cluster_registry.create(f"s-{i}")
    per_master = []
    for node in cluster.masters:
        with node.client() as c:
            assert c.dbsize() > 0, node.port
            per_master.append(sum(1 for _ in c.scan_iter(match="sf:s:*", count=1000)))
    assert all(n > 0 for n in per_master), per_master
    assert sum(per_master) == SPREAD_SESSIONS


# -- WAIT and the replay path ----------------------------------------------------------------------


def test_a_fork_retried_after_not_replicated_waits_for_the_replicas_again(
    cluster_client: RedisCluster, cluster_registry: Registry
) -> None:
    completed_source(cluster_registry, "src")
    strict = Registry(cluster_client, wait_replicas=2, wait_timeout_ms=50)  # each primary has 1 replica
    with pytest.raises(NotReplicated):
        forks.fork(strict, "src", "child", request_id="r")
    with pytest.raises(NotReplicated):
        forks.fork(strict, "src", "child", request_id="r")


def test_a_child_replayed_after_an_interrupted_fork_is_indexed_under_its_parent(
    cluster_client: RedisCluster, cluster_registry: Registry
) -> None:
    completed_source(cluster_registry, "src")
    strict = Registry(cluster_client, wait_replicas=2, wait_timeout_ms=50)
    with pytest.raises(NotReplicated):
        forks.fork(strict, "src", "child", request_id="r")
    forks.fork(cluster_registry, "src", "child", request_id="r")
    assert cluster_registry.children("src") == ["child"]
    assert edges(lineage.lineage(cluster_registry, "src")) == [("src", "child")]


# -- last: no CROSSSLOT, ever ----------------------------------------------------------------------

def test_no_node_answered_crossslot_to_any_operation_of_the_module(
    cluster: EmbeddedCluster, cluster_registry: Registry
) -> None:
    # This module's operations ran on this cluster before; run each kind once more here, so the
    # check means something when this test runs alone.
    handle = completed_source(cluster_registry, "src")
    forks.fork(cluster_registry, "src", "a", request_id="x1")
    forks.fork(cluster_registry, "src", "a", request_id="x1")
    forks.fork_many(cluster_registry, "a", [f"f{i}" for i in range(8)], request_id="x2")
    forks.snapshot(cluster_registry, "f3")
    cluster_registry.append("f3", turn(2))
    lineage.lineage(cluster_registry, "f3")
    lineage.lineage(cluster_registry, "src")
    cluster_registry.events("f3", 2, 7)
    cluster_registry.flush("f3")
    cluster_registry.dispose(handle)
    with pytest.raises(ForkError):
        forks.fork(cluster_registry, "src", "b")

    assert_no_crossslot(cluster)
