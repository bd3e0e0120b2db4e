"""Boundary forks on a Redis Cluster (3 primaries, 1 replica each): the same rule and seeds when the
ancestor that holds a boundary lives on another node, and, last, no CROSSSLOT on any node."""

from __future__ import annotations

import pytest
from cluster_fixtures import assert_no_crossslot
from fork_helpers import fork_error
from helpers import turn
from redis.cluster import RedisCluster

from sessionfork.core import forks, keys
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.registry import Registry
from sessionfork.core.wire import NewEvent
from sessionfork.embedded import EmbeddedCluster
from sessionfork.ops import lineage

OPEN = [NewEvent("turn/start", {"turn": 9}), NewEvent("tool/call", {"id": "t1"})]


def inside(sid: str, boundary: int, start: int) -> tuple[ErrorCode, str]:
    return (ErrorCode.INVALID_BOUNDARY,
            f'cannot fork session "{sid}" at boundary {boundary}: inside the turn opened at seq {start}')


def node_of(client: RedisCluster, sid: str) -> str:
    return str(client.get_node_from_key(keys.session(sid)).name)  # type: ignore[no-untyped-call]


def test_boundary_forks_across_nodes_at_every_position(cluster_registry: Registry,
                                                       cluster_client: RedisCluster) -> None:
    lineage_ids = ["root", "kid", "grand", "great"]
    assert len({node_of(cluster_client, s) for s in lineage_ids}) > 1  # the lineage spans nodes
    cluster_registry.append(cluster_registry.create("root"), [*turn(1), *turn(2), *OPEN])  # 10 events
    forks.fork(cluster_registry, "root", "kid", boundary=7)
    cluster_registry.append("kid", [*turn(3), *OPEN])  # own 8..13, open from 12
    for name, boundary in (("grand", 3), ("border", 7), ("own", 11)):
        forks.fork(cluster_registry, "kid", name, boundary=boundary)
        assert cluster_registry.events(name) == cluster_registry.events("kid", 0, boundary + 1)
        assert cluster_registry.header(name).seed_length == boundary + 1
    for boundary, start in ((2, 0), (5, 4), (13, 12)):
        with fork_error(*inside("kid", boundary, start)):
            forks.fork(cluster_registry, "kid", "x", boundary=boundary)
    cluster_registry.append("own", turn(4))
    with fork_error(*inside("own", 1, 0)):  # held by root, two generations up, on its node
        forks.fork(cluster_registry, "own", "great", boundary=1)
    cluster_registry.append("root", [NewEvent("turn/end")])  # root goes on: never seen by its descendants
    forks.fork(cluster_registry, "own", "great", boundary=1 + 2)
    assert cluster_registry.events("great") == cluster_registry.events("root", 0, 4)
    assert cluster_registry.header("great").seed_length == 4
    assert not cluster_registry.exists("x")
    assert cluster_registry.last_turn_end("kid") == 11
    assert cluster_registry.last_turn_end("own") == 15
    tree = lineage.lineage(cluster_registry, "kid")
    assert sorted((n.id, n.seed_length) for n in tree.root.children) == [("border", 8), ("grand", 4), ("own", 12)]


def test_fan_out_and_running_session_on_a_cluster(cluster_registry: Registry) -> None:
    cluster_registry.append(cluster_registry.create("run"), [*turn(1), *OPEN])
    last = cluster_registry.last_turn_end("run")
    assert last == 3
    result = forks.fork_many(cluster_registry, "run", [f"f{i}" for i in range(6)], boundary=last)
    assert [h.seed_length for h in result.created] == [4] * 6 and not result.failed
    assert cluster_registry.children("run") == [f"f{i}" for i in range(6)]
    with fork_error(ErrorCode.SESSION_ALREADY_EXISTS, 'session "f0" already exists'):
        forks.fork(cluster_registry, "run", "f0", boundary=99)


def test_no_node_answered_crossslot_to_a_boundary_fork(cluster: EmbeddedCluster, cluster_registry: Registry) -> None:
    # Every boundary path once more, so the check means something when this test runs alone.
    cluster_registry.append(cluster_registry.create("a"), [*turn(1), *turn(2)])
    forks.fork(cluster_registry, "a", "b", boundary=7)
    cluster_registry.append("b", OPEN)
    forks.fork(cluster_registry, "b", "c", boundary=3)  # inside the seed: a read on a's node
    forks.fork(cluster_registry, "b", "d", boundary=7, request_id="r1")
    forks.fork(cluster_registry, "b", "d", boundary=7, request_id="r1")
    forks.snapshot(cluster_registry, "b", boundary=3)
    with pytest.raises(ForkError):
        forks.fork(cluster_registry, "b", "e", boundary=9)
    cluster_registry.last_turn_end("b")

    assert_no_crossslot(cluster)
