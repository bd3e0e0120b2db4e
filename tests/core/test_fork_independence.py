"""Independence and seeds by reference, against a real server: appends to a source never change its
child nor the reverse, siblings are independent, every range at every level of a lineage reads the
right events, unknown event fields survive, a seed is a reference (no copied log, a small record),
and a deep child's log is read in one round trip."""

from __future__ import annotations

from typing import Any

import pytest
from fork_helpers import completed_source
from redis import Redis

from sessionfork.core import forks, keys
from sessionfork.core.registry import Registry
from sessionfork.core.wire import Event, NewEvent

# -- independence and lineage ----------------------------------------------------------------------


def tagged(owner: str, n: int) -> list[NewEvent]:
    """A whole turn whose events say who wrote them."""
    return [NewEvent("turn/start", {"owner": owner, "n": n}),
            NewEvent("assistant/message", {"owner": owner, "n": n}),
            NewEvent("turn/end", {"owner": owner, "n": n, "reason": "completed"})]


def shape(events: list[Event]) -> list[tuple[int, str, Any]]:
    return [(e.seq, e.type, e.data) for e in events]


def test_append_to_source_after_fork_does_not_change_child(registry: Registry) -> None:
    registry.create("src")
    registry.append("src", tagged("src", 0))
    forks.fork(registry, "src", "child")
    before = registry.events("child")
    registry.append("src", tagged("src", 1))
    assert registry.events("child") == before
    assert registry.length("child") == 3
    assert registry.length("src") == 6


def test_append_to_child_does_not_change_source(registry: Registry) -> None:
    registry.create("src")
    registry.append("src", tagged("src", 0))
    forks.fork(registry, "src", "child")
    before = registry.events("src")
    registry.append("child", tagged("child", 0))
    assert registry.events("src") == before
    assert [e.data["owner"] for e in registry.events("child")] == ["src"] * 3 + ["child"] * 3


def test_sibling_forks_are_independent(registry: Registry) -> None:
    registry.create("src")
    registry.append("src", tagged("src", 0))
    forks.fork(registry, "src", "left")
    forks.fork(registry, "src", "right")
    registry.append("left", tagged("left", 0))
    registry.append("right", tagged("right", 0))
    registry.append("right", tagged("right", 1))
    assert [e.data["owner"] for e in registry.events("left")] == ["src"] * 3 + ["left"] * 3
    assert [e.data["owner"] for e in registry.events("right")] == ["src"] * 3 + ["right"] * 6


@pytest.fixture
def lineage(registry: Registry) -> dict[str, list[tuple[int, str, Any]]]:
    """A -> B -> C -> D, each level appending before and after being forked; returns the expected logs."""
    expected: dict[str, list[tuple[int, str, Any]]] = {}

    def add(sid: str, events: list[NewEvent]) -> None:
        registry.append(sid, events)
        log = expected.setdefault(sid, [])
        base = len(log)
        log.extend([(base + i, e.type, e.data) for i, e in enumerate(events)])

    def fork(parent: str, child: str) -> None:
        forks.fork(registry, parent, child)
        expected[child] = list(expected[parent])

    registry.create("A")
    expected["A"] = []
    add("A", tagged("A", 0))
    add("A", tagged("A", 1))
    fork("A", "B")
    add("A", tagged("A", 2))  # after the fork: not in B
    add("B", tagged("B", 0))
    fork("B", "C")
    add("B", tagged("B", 1))
    add("C", tagged("C", 0))
    add("C", tagged("C", 1))
    fork("C", "D")
    add("C", tagged("C", 2))
    add("D", tagged("D", 0))
    fork("D", "E")  # E has no own events: its seed is D's whole log
    return expected


def test_fork_of_fork_of_fork_reads_the_right_events_at_every_level(
    registry: Registry, lineage: dict[str, list[tuple[int, str, Any]]]
) -> None:
    for sid, expected in lineage.items():
        assert shape(registry.events(sid)) == expected, sid
    assert [len(lineage[s]) for s in "ABCDE"] == [9, 12, 18, 18, 18]
    assert [registry.header(s).seed_length for s in "BCDE"] == [6, 9, 15, 18]


def test_lineage_headers_name_each_parent(
    registry: Registry, lineage: dict[str, list[tuple[int, str, Any]]]
) -> None:
    assert [registry.header(s).parent_session for s in "BCDE"] == ["A", "B", "C", "D"]
    assert registry.children("A") == ["B"]
    assert registry.children("C") == ["D"]


def test_every_range_at_every_level_matches(
    registry: Registry, lineage: dict[str, list[tuple[int, str, Any]]]
) -> None:
    # Includes every range spanning the borders between ancestor slices and the own log.
    for sid, expected in lineage.items():
        n = len(expected)
        for start in range(n + 2):
            for stop in range(start, n + 2):
                assert shape(registry.events(sid, start, stop)) == expected[start:stop], (sid, start, stop)


def test_open_ended_and_out_of_bounds_ranges(
    registry: Registry, lineage: dict[str, list[tuple[int, str, Any]]]
) -> None:
    for sid, expected in lineage.items():
        n = len(expected)
        for start in range(n + 2):
            assert shape(registry.events(sid, start)) == expected[start:], (sid, start)
        assert shape(registry.events(sid, -5, 3)) == expected[:3]
        assert registry.events(sid, 5, 2) == []
        assert shape(registry.events(sid, 0, n + 100)) == expected


def test_unknown_event_fields_survive_a_fork(registry: Registry) -> None:
    extra = {"sourceEventSeqs": [0, 1], "surfaceOp": {"op": "replace", "at": [2]}, "vendor": None}
    registry.create("src")
    registry.append("src", [NewEvent("turn/start", None, extra), NewEvent("turn/end", {"r": 1}, {"x": "y"})])
    forks.fork(registry, "src", "child")
    forks.fork(registry, "child", "grandchild")
    for sid in ("child", "grandchild"):
        events = registry.events(sid)
        assert events[0].extra == extra
        assert events[1].extra == {"x": "y"}
        assert events[1].data == {"r": 1}


# -- seeds by reference ----------------------------------------------------------------------------


def test_fork_of_a_long_parent_stores_the_seed_by_reference(registry: Registry, redis: Redis) -> None:
    registry.create("big")
    body = [NewEvent("assistant/message", {"text": "x" * 50, "i": i}) for i in range(9_999)]
    registry.append("big", [*body, NewEvent("turn/end")])
    assert registry.length("big") == 10_000
    keys_before = set(redis.keys("*"))
    header = forks.fork(registry, "big", "child")
    assert header.seed_length == 10_000
    new_keys = set(redis.keys("*")) - keys_before
    assert new_keys == {keys.session("child").encode(), keys.session_children("big").encode()}
    assert redis.type(keys.session("child")) == b"hash"
    assert redis.type(keys.session_children("big")) == b"set"
    assert not redis.exists(keys.session_log("child"))
    usage = redis.memory_usage(keys.session("child"))
    assert usage is not None
    assert usage < 2048


def test_grandchild_of_a_long_parent_is_also_small(registry: Registry, redis: Redis) -> None:
    registry.create("big")
    registry.append("big", [NewEvent("x", i) for i in range(9_999)] + [NewEvent("turn/end")])
    forks.fork(registry, "big", "child")
    registry.append("child", tagged("child", 0))
    forks.fork(registry, "child", "grandchild")
    assert not redis.exists(keys.session_log("grandchild"))
    assert redis.memory_usage(keys.session("grandchild")) < 2048
    assert redis.llen(keys.session_log("child")) == 3
    events = registry.events("grandchild", 9_998, 10_003)
    assert [(e.seq, e.type) for e in events] == [
        (9_998, "x"), (9_999, "turn/end"), (10_000, "turn/start"), (10_001, "assistant/message"),
        (10_002, "turn/end"),
    ]


def test_child_log_key_appears_only_when_the_child_appends(registry: Registry, redis: Redis) -> None:
    completed_source(registry)
    forks.fork(registry, "src", "child")
    assert not redis.exists(keys.session_log("child"))
    registry.append("child", [NewEvent("turn/start")])
    assert redis.llen(keys.session_log("child")) == 1


def test_a_deep_childs_log_is_read_in_one_round_trip(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    from redis.connection import AbstractConnection

    parent = "depth-0"
    registry.append(registry.create(parent), [NewEvent("turn/start"), NewEvent("turn/end")])
    for depth in range(1, 21):
        child = f"depth-{depth}"
        forks.fork(registry, parent, child)
        registry.append(child, [NewEvent("turn/start"), NewEvent("turn/end")])
        parent = child
    registry.events(parent)  # the first read also reads the record
    sent: list[bytes] = []
    original = AbstractConnection.send_packed_command

    def counting(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
        sent.append(command)
        original(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
    events = registry.events(parent)
    assert len(sent) == 1
    assert [e.seq for e in events] == list(range(42))
    assert [e.type for e in events] == ["turn/start", "turn/end"] * 21
