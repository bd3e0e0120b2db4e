"""Merge and select on a Redis Cluster (3 primaries, 1 replica each), in the library: the
parent and its children in different slots, on different nodes; the merge's three steps (the
child's read, the parent's write, the marks) each on one slot. A merge, a select, a replay by
request id, ``ALREADY_MERGED``, ``NOT_DESCENDANT``, a process that died between the parent's step
and the marks (its retry marks), and, last, that no node answered CROSSSLOT."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from cluster_fixtures import assert_no_crossslot
from helpers import died_before_the_marks, turn
from helpers import family_forked_singly as family
from redis.cluster import RedisCluster
from waits import outcome_of

from sessionfork.core import forks, keys, merges, wire
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.merge_steps import Merged, MergeSteps, merge_key
from sessionfork.core.registry import Registry
from sessionfork.core.state import RegistryState
from sessionfork.core.wire import MergedInto
from sessionfork.embedded import EmbeddedCluster


def node_of(client: RedisCluster, sid: str) -> str:
    return str(client.get_node_from_key(keys.session(sid)).name)  # type: ignore[no-untyped-call]


def elsewhere(client: RedisCluster, parent: str, prefix: str, n: int) -> list[str]:
    """``n`` ids ``<prefix><i>`` whose sessions live on other nodes than ``parent``'s (so in other slots)."""
    home = node_of(client, parent)
    found = [f"{prefix}{i}" for i in range(200) if node_of(client, f"{prefix}{i}") != home][:n]
    assert len(found) == n
    slots = {client.keyslot(keys.session(sid)) for sid in [parent, *found]}  # type: ignore[no-untyped-call]
    assert len(slots) == n + 1  # each in a slot of its own
    return found


def code_of(call: Callable[[], object]) -> tuple[ErrorCode, str]:
    with pytest.raises(ForkError) as info:
        call()
    return info.value.code, info.value.message


def test_merge_across_slots_replays_and_refuses_as_on_one_server(cluster_registry: Registry,
                                                                  cluster_client: RedisCluster) -> None:
    (child,) = elsewhere(cluster_client, "p", "kid", 1)
    family(cluster_registry, "p", [child])
    done = merges.merge(cluster_registry, "p", child, mode="events", request_id="cm-1")
    assert (done.first, done.length, done.from_seq, done.to_seq) == (4, 11, 4, 7)
    log = cluster_registry.events("p")
    assert [e.type for e in log[4:]] == ["turn/start", "session/merge", "turn/start", "user/message",
                                         "assistant/message", "turn/end", "turn/end"]
    assert [e.extra["source"] for e in log[6:10]] == [{"session": child, "seq": s} for s in range(4, 8)]
    assert [e.data for e in log[6:10]] == [e.data for e in cluster_registry.events(child)[4:8]]
    state = cluster_registry.state_of(child)
    assert state.state == "merged" and isinstance(state.merged_into, MergedInto) and state.merged_into.seq == 4
    assert cluster_client.zscore(keys.ENDED_INDEX, child) is not None

    assert outcome_of(lambda: merges.merge(cluster_registry, "p", child, mode="events", request_id="cm-1")) == done
    assert cluster_registry.length("p") == 11
    code, message = code_of(lambda: merges.merge(cluster_registry, "p", child, mode="events", request_id="cm-2"))
    assert code is ErrorCode.ALREADY_MERGED and 'by request "cm-1" (at seq 4)' in message
    code, message = code_of(lambda: merges.merge(cluster_registry, child, "p", mode="events"))
    assert code is ErrorCode.NOT_DESCENDANT and f'session "p" does not descend from session "{child}"' in message
    (stranger,) = elsewhere(cluster_client, "p", "stranger", 1)
    family(cluster_registry, stranger, [])
    code, _ = code_of(lambda: merges.merge(cluster_registry, "p", stranger, mode="summary", summary=1))
    assert code is ErrorCode.NOT_DESCENDANT
    assert cluster_registry.length("p") == 11


def test_select_across_slots_merges_the_winner_and_abandons_the_rest(cluster_registry: Registry,
                                                                     cluster_client: RedisCluster) -> None:
    kids = elsewhere(cluster_client, "sp", "t", 3)
    family(cluster_registry, "sp", kids)
    done = merges.select(cluster_registry, "sp", kids, kids[1], mode="summary", summary={"best": 1},
                         request_id="cs-1")
    assert (done.child, done.abandoned, done.first, done.length) == (kids[1], (kids[0], kids[2]), 4, 8)
    assert [cluster_registry.state_of(k).state for k in kids] == ["abandoned", "merged", "abandoned"]
    assert cluster_registry.state_of(kids[0]).abandoned_by == "cs-1"
    assert outcome_of(lambda: merges.select(cluster_registry, "sp", kids, kids[1], mode="summary",
                                            summary={"best": 1}, request_id="cs-1")) == done
    code, _ = code_of(lambda: merges.select(cluster_registry, "sp", kids, kids[2], mode="summary", summary=2,
                                            request_id="cs-2"))
    assert code is ErrorCode.ALREADY_MERGED
    assert cluster_registry.length("sp") == 8


def test_a_select_over_a_candidate_merged_before_is_stale(cluster_registry: Registry,
                                                          cluster_client: RedisCluster) -> None:
    kids = elsewhere(cluster_client, "st", "stk", 2)
    family(cluster_registry, "st", kids)
    merges.merge(cluster_registry, "st", kids[0], mode="summary", summary=0, request_id="st-m")
    code, message = code_of(lambda: merges.select(cluster_registry, "st", kids, kids[1], mode="events"))
    assert code is ErrorCode.ALREADY_MERGED and f'session "{kids[0]}" was already merged' in message
    assert cluster_registry.length("st") == 8 and cluster_registry.state_of(kids[1]).state == "live"


def test_a_merge_that_died_between_the_parent_step_and_the_marks_is_marked_by_its_retry(
        cluster_registry: Registry, cluster_client: RedisCluster) -> None:
    (child,) = elsewhere(cluster_client, "dp", "dk", 1)
    family(cluster_registry, "dp", [child])
    spec = merges.merge_spec("dp", child, {"mode": "events", "request_id": "died-1"})
    steps = cluster_registry.merges
    first = died_before_the_marks(steps, spec)
    assert cluster_registry.length("dp") == 11 and cluster_registry.state_of(child).state == "live"

    again = outcome_of(lambda: merges.merge(cluster_registry, "dp", child, mode="events", request_id="died-1"))
    assert again == first and cluster_registry.length("dp") == 11
    assert [e.seq for e in cluster_registry.events("dp") if e.data == {"trigger": "merge"}] == [4]
    index = cluster_client.hgetall(keys.session_merges("dp"))
    assert {wire.text(k): wire.text(v) for k, v in index.items() if k.startswith(b'["m"')} == {
        merge_key(child, 4, 7): "died-1 4 11"}
    assert json.loads(cluster_client.hget(keys.session(child), "mergedinto") or "") == ["dp", 4, "died-1"]
    assert cluster_client.zscore(keys.ENDED_INDEX, child) is not None


def test_a_merge_that_died_before_its_flush_is_flushed_by_its_retry(
        cluster_registry: Registry, cluster_client: RedisCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a cluster the parent's ``session/flush`` follows its step (the lifecycle stream is in
    another slot): a run that died in between leaves it to the retry, which finds its merge done
    (a replay) and asks the flush."""
    (child,) = elsewhere(cluster_client, "fp", "fk", 1)
    family(cluster_registry, "fp", [child])

    class Dies(Exception):
        pass

    def dies(*args: object) -> None:
        raise Dies

    monkeypatch.setattr(RegistryState, "emit", dies)
    with pytest.raises(Dies):
        merges.merge(cluster_registry, "fp", child, mode="events", request_id="died-f")
    monkeypatch.undo()
    assert cluster_registry.length("fp") == 11  # the parent's step ran; then the process died

    def flushes() -> list[dict[bytes, bytes]]:
        return [f for _, f in cluster_client.xrange(keys.LIFECYCLE_STREAM)
                if f[b"type"] == b"session/flush" and f[b"id"] == b"fp" and f[b"len"] == b"11"]

    assert flushes() == []
    again = merges.merge(cluster_registry, "fp", child, mode="events", request_id="died-f")
    assert (again.first, again.length) == (4, 11) and len(flushes()) == 1


def test_a_select_that_died_between_the_parent_step_and_the_marks_is_marked_by_its_retry(
        cluster_registry: Registry, cluster_client: RedisCluster) -> None:
    kids = elsewhere(cluster_client, "ds", "dsk", 3)
    family(cluster_registry, "ds", kids)
    spec = merges.select_spec("ds", kids, kids[0], {"mode": "events", "request_id": "died-2"})
    steps = cluster_registry.merges
    died_before_the_marks(steps, spec)
    assert [cluster_registry.state_of(k).state for k in kids] == ["live"] * 3

    again = outcome_of(lambda: merges.select(cluster_registry, "ds", kids, kids[0], mode="events", request_id="died-2"))
    assert isinstance(again, Merged) and again.abandoned == (kids[1], kids[2]) and cluster_registry.length("ds") == 11
    assert [cluster_registry.state_of(k).state for k in kids] == ["merged", "abandoned", "abandoned"]


def between_child_and_parent_step(steps: MergeSteps, action: Callable[[], object]) -> list[str]:
    """Run ``action`` once after ``steps``' next run took its children's steps (its holds), before
    its parent's step: its code and message (or "OK"). Two requests in flight at once, pinned."""
    ran: list[str] = []
    original = steps._write_op

    def hooked(*args: Any) -> Any:
        if not ran:
            try:
                action()
                ran.append("OK")
            except ForkError as exc:
                ran.append(f"{exc.code.value}: {exc.message}")
        return original(*args)

    steps._write_op = hooked  # type: ignore[method-assign]  # this instance's only
    return ran


def test_a_merge_and_a_select_of_one_branch_in_flight_at_once_one_wins_across_slots(
        cluster_registry: Registry, cluster_client: RedisCluster) -> None:
    """Each candidate on a node of its own: the select's holds are taken slot by slot, and a
    refused one lets go of those it took (the other candidate stays free)."""
    kids = elsewhere(cluster_client, "hp", "hk", 4)
    family(cluster_registry, "hp", kids)
    a, b, c, d = kids
    other = Registry(cluster_client)
    during = between_child_and_parent_step(cluster_registry.merges, lambda: merges.select(
        other, "hp", [a, b], a, mode="events", request_id="h-sel"))
    merged = outcome_of(lambda: merges.merge(cluster_registry, "hp", b, mode="events", request_id="h-mrg"))
    assert during == [f'ALREADY_MERGED: session "{b}" is being merged or selected by request "h-mrg" '
                      "(one request at a time changes a session's state)"]
    assert isinstance(merged, Merged) and [cluster_registry.state_of(k).state for k in (a, b)] == ["live", "merged"]
    assert [k for k in cluster_client.hkeys(keys.session(a)) if k.startswith((b"plan:", b"hold"))] == []

    during = between_child_and_parent_step(cluster_registry.merges, lambda: merges.merge(
        other, "hp", d, mode="events", request_id="h-mrg-2"))
    selected = outcome_of(lambda: merges.select(cluster_registry, "hp", [c, d], c, mode="events", request_id="h-sel-2"))
    assert len(during) == 1 and during[0].startswith("ALREADY_MERGED: ") and 'request "h-sel-2"' in during[0]
    assert isinstance(selected, Merged) and selected.abandoned == (d,)
    assert [cluster_registry.state_of(k).state for k in (c, d)] == ["merged", "abandoned"]
    for kid in kids:
        assert [k for k in cluster_client.hkeys(keys.session(kid)) if k.startswith((b"plan:", b"hold"))] == []


def test_a_select_into_the_grandparent_won_by_a_candidate_another_select_abandons_is_refused_across_slots(
        cluster_registry: Registry, cluster_client: RedisCluster) -> None:
    p, q = elsewhere(cluster_client, "hg", "hgp", 2)
    family(cluster_registry, "hg", [p, q])
    a, b = elsewhere(cluster_client, p, "hgk", 2)
    forks.fork(cluster_registry, p, a)
    forks.fork(cluster_registry, p, b)
    for cid in (a, b):
        cluster_registry.append(cid, turn(20))
    other = Registry(cluster_client)
    during = between_child_and_parent_step(cluster_registry.merges, lambda: merges.select(
        other, "hg", [b, q], b, mode="summary", summary="b", request_id="g-up"))
    below = outcome_of(lambda: merges.select(cluster_registry, p, [a, b], a, mode="events", request_id="g-down"))
    assert len(during) == 1 and during[0].startswith("ALREADY_MERGED: ") and 'request "g-down"' in during[0]
    assert isinstance(below, Merged)
    assert [cluster_registry.state_of(k).state for k in (a, b, q)] == ["merged", "abandoned", "live"]
    assert cluster_registry.length("hg") == 4


def test_no_node_answered_crossslot(cluster: EmbeddedCluster) -> None:
    assert_no_crossslot(cluster)
