"""Composed forks on a Redis Cluster (3 primaries, 1 replica each): the guard, edits on a child
whose slot is on another node than its parent, variants, a worker with a cluster registry, and,
last, no CROSSSLOT on any node."""

from __future__ import annotations

import uuid

import pytest
from helpers import turn
from redis.cluster import RedisCluster

from sessionfork import Summary
from sessionfork.client import Client, Variant
from sessionfork.core import forks, keys, merges
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.factories import now_ms
from sessionfork.core.registry import Registry
from sessionfork.core.retention import run_pass
from sessionfork.core.wire import ForkResult, NewEvent
from sessionfork.embedded import EmbeddedCluster

TIMEOUT = 30.0
RETRY = [NewEvent("turn/start", {"turn": 3}), NewEvent("user/message", {"text": "again"})]


def node_of(client: RedisCluster, sid: str) -> str:
    return str(client.get_node_from_key(keys.session(sid)).name)  # type: ignore[no-untyped-call]


def test_guard_and_edits_across_nodes(cluster_registry: Registry, cluster_client: RedisCluster) -> None:
    cluster_registry.append(cluster_registry.create("root"), [*turn(1), *turn(2)])  # 8 events
    home = node_of(cluster_client, "root")
    kid_id = next(f"kid{i}" for i in range(100) if node_of(cluster_client, f"kid{i}") != home)  # another node
    with pytest.raises(ForkError) as info:
        forks.fork(cluster_registry, "root", kid_id, if_length=7, edits=RETRY)
    assert (info.value.code, info.value.message) == (ErrorCode.PRECONDITION_FAILED,
                                                     'session "root" has 8 events, not 7')
    assert not cluster_registry.exists(kid_id)
    kid = forks.fork(cluster_registry, "root", kid_id, if_length=8, boundary=3, edits=RETRY)
    assert kid.seed_length == 4 and cluster_registry.length(kid_id) == 6
    assert cluster_registry.events(kid_id)[:4] == cluster_registry.events("root", 0, 4)
    assert [e.seq for e in cluster_registry.events(kid_id)] == list(range(6))
    cluster_registry.append(kid_id, [NewEvent("turn/end", {"turn": 3})])
    assert cluster_registry.last_turn_end(kid_id) == 6
    grand = forks.fork(cluster_registry, kid_id, "grand", edits=RETRY[:1])
    assert grand.seed_length == 7 and [e.type for e in cluster_registry.events("grand")][4:] == [
        "turn/start", "user/message", "turn/end", "turn/start"]
    with pytest.raises(ForkError) as inside:
        forks.fork(cluster_registry, kid_id, "x", boundary=5)
    assert inside.value.message == f'cannot fork session "{kid_id}" at boundary 5: inside the turn opened at seq 4'
    result = forks.fork_many(cluster_registry, "root", ["v1", "v2", "v3"], if_length=8,
                             edits={"v1": RETRY, "v3": RETRY[:1]})
    assert [cluster_registry.length(v) for v in ("v1", "v2", "v3")] == [10, 8, 9] and not result.failed
    assert sorted(cluster_registry.children("root")) == sorted([kid_id, "v1", "v2", "v3"])


def test_a_worker_with_a_cluster_registry_runs_guarded_variants(cluster_registry: Registry,
                                                                queue_client: Client) -> None:
    cluster_registry.append(cluster_registry.create("src"), turn(1))
    rid = f"req-{uuid.uuid4().hex[:12]}"
    stale = queue_client.fork("src", if_length=1, variants=[Variant("a")], request_id=f"{rid}-s", timeout=TIMEOUT)
    assert not stale.ok and getattr(stale, "code", "") == "PRECONDITION_FAILED"
    reply = queue_client.fork("src", if_length=4, request_id=rid, timeout=TIMEOUT,
                              variants=[Variant("a", RETRY), Variant("b")])
    assert isinstance(reply, ForkResult) and reply.ok and [h.id for h in reply.sessions or []] == ["a", "b"]
    assert [e.type for e in cluster_registry.events("a")][4:] == ["turn/start", "user/message"]
    assert queue_client.fork("src", if_length=4, request_id=rid, timeout=TIMEOUT,
                             variants=[Variant("a", RETRY), Variant("b")]) == reply
    assert cluster_registry.length("a") == 6


def test_summary_forks_across_nodes(cluster_registry: Registry, cluster_client: RedisCluster,
                                    queue_client: Client) -> None:
    """A summary child, its own children and their boundary checks with the parent, the child and
    the grandchild on different nodes; the worker's summary fork; deleting the source and the
    summary child never changes the grandchild."""
    cluster_registry.append(cluster_registry.create("sroot"), [*turn(1), *turn(2), *turn(3)])  # 12 events
    home = node_of(cluster_client, "sroot")
    kid = next(f"skid{i}" for i in range(100) if node_of(cluster_client, f"skid{i}") != home)
    grand = next(f"sg{i}" for i in range(100) if node_of(cluster_client, f"sg{i}") not in (home, node_of(
        cluster_client, kid)))
    with pytest.raises(ForkError) as info:
        forks.fork(cluster_registry, "sroot", kid, summary=Summary(keep_from=5, data="x"))
    assert info.value.code == ErrorCode.INVALID_BOUNDARY and not cluster_registry.exists(kid)
    header = forks.fork(cluster_registry, "sroot", kid, summary=Summary(keep_from=4, data="two"), edits=RETRY)
    assert (header.seed_length, header.kept_from, cluster_registry.length(kid)) == (9, 4, 11)
    log = cluster_registry.events(kid)
    assert [e.type for e in log[1:9]] == [e.type for e in cluster_registry.events("sroot")[4:]]
    assert log[0].type == "session/summary" and [e.seq for e in log] == list(range(11))
    cluster_registry.append(kid, [NewEvent("turn/end", {"turn": 3})])
    assert forks.fork(cluster_registry, kid, grand, boundary=4).seed_length == 5  # checked on "sroot"
    with pytest.raises(ForkError, match="inside the turn opened at seq 5"):
        forks.fork(cluster_registry, kid, "x", boundary=6)
    assert cluster_registry.events(grand) == log[:5]
    cluster_registry.delete("sroot")
    cluster_registry.delete(kid)
    assert cluster_registry.events(grand) == log[:5]
    reply = queue_client.fork(grand, session_id="sq", summary=Summary(keep_from=1, data="w"), timeout=TIMEOUT)
    assert isinstance(reply, ForkResult) and reply.session is not None and reply.session.kept_from == 1
    assert cluster_registry.events("sq")[1:] == log[1:5]


def test_no_node_answered_crossslot_to_a_composed_fork(cluster: EmbeddedCluster, cluster_registry: Registry) -> None:
    cluster_registry.append(cluster_registry.create("a"), [*turn(1), *turn(2)])
    forks.fork(cluster_registry, "a", "b", boundary=3, edits=RETRY, if_length=8, request_id="r1")
    forks.fork(cluster_registry, "a", "b", boundary=3, edits=RETRY, if_length=8, request_id="r1")
    forks.fork_many(cluster_registry, "b", ["c", "d"], boundary=3, edits={"c": RETRY})
    forks.fork_many(cluster_registry, "a", ["s1", "s2"], summary=Summary(keep_from=4, data=1))
    forks.fork(cluster_registry, "s1", "s3", boundary=4, summary=Summary(keep_from=1, data=2))
    with pytest.raises(ForkError):
        forks.fork(cluster_registry, "a", "e", if_length=1)
    for node in cluster.nodes:
        with node.client() as c:
            errors = c.info("errorstats")
        assert "errorstat_CROSSSLOT" not in errors, (node.port, errors)


def test_ended_branches_are_disposed_then_freed_across_nodes_without_a_descendants_byte_changing(
        cluster_registry: Registry, cluster_client: RedisCluster) -> None:
    """Branches that end, on a cluster: the merged child, the select's loser and the parent in other slots."""
    reg = cluster_registry
    reg.append(reg.create("p"), turn(1))
    home = node_of(cluster_client, "p")
    won, lost = [n for n in (f"kid{i}" for i in range(100)) if node_of(cluster_client, n) != home][:2]
    for kid in (won, lost):
        forks.fork(reg, "p", kid)
        reg.append(kid, turn(2))
    forks.fork(reg, won, "grand")
    reg.append("grand", turn(3))
    merges.select(reg, "p", [won, lost], won, mode="events", request_id="pick")
    assert set(cluster_client.zrange(keys.ENDED_INDEX, 0, -1)) == {won.encode(), lost.encode()}
    raw = {sid: cluster_client.lrange(keys.session_log(sid), 0, -1) for sid in ("p", won, "grand")}
    events = {sid: reg.events(sid) for sid in ("p", "grand")}
    now = now_ms()
    first = run_pass(reg, now_ms=now + 2000, retention_ms=60_000, branch_ttl_ms=1000)
    assert first.swept == []  # disposed just now: past the retention only later
    assert sorted(e.id for e in first.ended) == sorted([won, lost])
    assert [reg.state_of(sid).state for sid in (won, lost, "grand")] == ["disposed", "disposed", "live"]
    second = run_pass(reg, now_ms=now_ms() + 120_000, retention_ms=60_000, branch_ttl_ms=1000)
    assert sorted((s.id, s.log_kept) for s in second.swept) == sorted([(won, True), (lost, False)])
    assert not reg.exists(won) and not reg.exists(lost) and not cluster_client.exists(keys.session_log(lost))
    assert {sid: cluster_client.lrange(keys.session_log(sid), 0, -1) for sid in ("p", won, "grand")} == raw
    assert {sid: Registry(cluster_client).events(sid) for sid in ("p", "grand")} == events
