"""Forks at an earlier turn (``boundary``) against a real server: the rule, error order, seeds by
reference at any depth, and the turn index kept on append (operations: ``test_boundary_ops``)."""

from __future__ import annotations

import json

import pytest
from fork_helpers import fork_error
from helpers import turn
from redis import Redis

from sessionfork.core import forks, keys, wire
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.registry import Registry
from sessionfork.core.wire import Event, LiveHandle, NewEvent

OPEN = [NewEvent("turn/start", {"turn": 9}), NewEvent("tool/call", {"id": "t1"})]


def inside(sid: str, boundary: int, start: int) -> tuple[ErrorCode, str]:
    return (ErrorCode.INVALID_BOUNDARY,
            f'cannot fork session "{sid}" at boundary {boundary}: inside the turn opened at seq {start}')


def past(sid: str, boundary: int, length: int) -> tuple[ErrorCode, str]:
    return (ErrorCode.INVALID_BOUNDARY,
            f'cannot fork session "{sid}" at boundary {boundary}: past the end of a log of {length} events')


def same(a: list[Event], b: list[Event]) -> bool:
    return [wire.event_to_builtins(e) for e in a] == [wire.event_to_builtins(e) for e in b]


def make(registry: Registry, sid: str, *chunks: list[NewEvent]) -> str:
    handle = registry.create(sid, cwd="/w")
    for chunk in chunks:
        registry.append(handle, chunk)
    return sid


def assert_child(registry: Registry, child: str, source: str, boundary: int) -> None:
    """The child's seed is exactly events [0, boundary] of the source, and it goes on from there."""
    header = registry.header(child)
    assert (header.parent_session, header.seed_length, header.cwd) == (source, boundary + 1, "/w")
    assert same(registry.events(child), registry.events(source, 0, boundary + 1))
    (appended,) = registry.append(child, [NewEvent("user/message", {"text": "own"})])
    assert appended.seq == boundary + 1
    assert registry.events(child)[-1].data == {"text": "own"}


# -- the rule, case by case --------------------------------------------------------------------------


def test_a_turn_end_in_the_middle_of_the_log_is_a_boundary(registry: Registry) -> None:
    make(registry, "a", turn(1), turn(2), turn(3))
    forks.fork(registry, "a", "c", boundary=7)
    assert_child(registry, "c", "a", 7)


def test_standalone_events_after_a_turn_end_are_between_turns(registry: Registry) -> None:
    make(registry, "a", turn(1), [NewEvent("todo/write", {"n": 1}), NewEvent("todo/write", {"n": 2})], turn(2))
    for boundary in (3, 4, 5):
        forks.fork(registry, "a", f"c{boundary}", boundary=boundary)
        assert_child(registry, f"c{boundary}", "a", boundary)


def test_a_child_ending_with_a_standalone_event_keeps_the_plain_rule_and_forks_at_its_end(
        registry: Registry) -> None:
    make(registry, "a", turn(1), [NewEvent("todo/write")], turn(2))
    forks.fork(registry, "a", "c", boundary=4)
    with fork_error(ErrorCode.OPEN_TURN, 'cannot fork session "c" inside an open turn (last event: todo/write)'):
        forks.fork(registry, "c")  # no boundary: today's rule, its last event is not turn/end
    forks.fork(registry, "c", "g", boundary=4)
    assert_child(registry, "g", "c", 4)


def test_boundary_zero(registry: Registry) -> None:
    make(registry, "a", [NewEvent("todo/write")], turn(1))
    forks.fork(registry, "a", "c", boundary=0)
    assert_child(registry, "c", "a", 0)
    make(registry, "b", turn(1))
    with fork_error(*inside("b", 0, 0)):
        forks.fork(registry, "b", "x", boundary=0)


def test_the_last_event(registry: Registry) -> None:
    make(registry, "a", turn(1), turn(2))
    forks.fork(registry, "a", "c", boundary=7)
    assert_child(registry, "c", "a", 7)


def test_past_the_end_and_negative(registry: Registry) -> None:
    make(registry, "a", turn(1))
    with fork_error(*past("a", 4, 4)):
        forks.fork(registry, "a", "x", boundary=4)
    with fork_error(ErrorCode.INVALID_BOUNDARY,
                    'cannot fork session "a" at boundary -1: before the first event (seqs start at 0)'):
        forks.fork(registry, "a", "x", boundary=-1)
    make(registry, "empty")
    with fork_error(*past("empty", 0, 0)):
        forks.fork(registry, "empty", "x", boundary=0)
    assert not registry.exists("x")


def test_inside_a_turn_names_the_turn_start(registry: Registry) -> None:
    make(registry, "a", turn(1), turn(2), OPEN)
    for boundary, start in ((0, 0), (2, 0), (5, 4), (8, 8), (9, 8)):
        with fork_error(*inside("a", boundary, start)):
            forks.fork(registry, "a", "x", boundary=boundary)
    assert not registry.exists("x")


def test_a_running_session_forks_at_its_last_completed_turn(registry: Registry) -> None:
    make(registry, "a", turn(1), turn(2), OPEN)
    with fork_error(ErrorCode.OPEN_TURN, 'cannot fork session "a" inside an open turn (last event: tool/call)'):
        forks.fork(registry, "a", "x")
    last = registry.last_turn_end("a")
    assert last == 7
    forks.fork(registry, "a", "c", boundary=last)
    assert_child(registry, "c", "a", 7)
    registry.append("a", [NewEvent("turn/end", {"turn": 9})])  # the running turn goes on, unseen
    assert [e.seq for e in registry.events("c")] == list(range(9))


def test_bool_and_other_types_are_invalid_request(registry: Registry) -> None:
    make(registry, "a", turn(1))
    for bad in (True, 1.0, "3"):
        with pytest.raises(ForkError) as info:
            forks.fork(registry, "a", "x", boundary=bad)  # type: ignore[arg-type]
        assert info.value.code is ErrorCode.INVALID_REQUEST


# -- error order ------------------------------------------------------------------------------------


def test_error_order(registry: Registry) -> None:
    make(registry, "a", turn(1), OPEN)
    make(registry, "taken")
    with fork_error(ErrorCode.SESSION_NOT_FOUND, 'session "nope" not found'):
        forks.fork(registry, "nope", "taken", boundary=99)
    with fork_error(ErrorCode.SESSION_NOT_LIVE,
                    'live handle of session "a" is stale: its instance is not the live one'):
        forks.fork(registry, LiveHandle("a", "stale"), "taken", boundary=99)
    with fork_error(ErrorCode.SESSION_ALREADY_EXISTS, 'session "taken" already exists'):
        forks.fork(registry, "a", "taken", boundary=99)
    with fork_error(*past("a", 99, 6)):
        forks.fork(registry, "a", "x", boundary=99)  # INVALID_BOUNDARY, never OPEN_TURN
    with fork_error(*inside("a", 5, 4)):
        forks.fork(registry, "a", "x", boundary=5)


# -- seeds by reference, at any depth -------------------------------------------------------------


def test_forks_of_boundary_children_inside_the_seed_the_own_events_and_on_the_border(
        registry: Registry, redis: Redis) -> None:
    make(registry, "a", turn(1), turn(2), OPEN)  # 10 events, the last turn open
    forks.fork(registry, "a", "b", boundary=7)  # b: seed 8
    registry.append("b", turn(3))  # b: 12 events, own 8..11
    registry.append("b", OPEN)  # b: 14 events, open turn from 12
    cases = {"inherited": 3, "border": 7, "own": 11}
    for name, boundary in cases.items():
        forks.fork(registry, "b", f"g-{name}", boundary=boundary)
        assert_child(registry, f"g-{name}", "b", boundary)
    seeds = {name: json.loads(redis.hget(keys.session(f"g-{name}"), "seed")) for name in cases}
    # Stored by reference to b's seed (rules.by_reference): one entry for what b inherited, whatever
    # the depth, then b's own slice; b's seed itself was stored by value at its first fork.
    assert seeds == {"inherited": [["b", -4, 0]], "border": [["b", -8, 0]], "own": [["b", -8, 0], ["b", 0, 4]]}
    assert json.loads(redis.hget(keys.session("b"), "seed")) == [["a", 0, 8]]
    for boundary, start in ((2, 0), (5, 4), (9, 8), (13, 12)):  # inherited turns and own turns alike
        with fork_error(*inside("b", boundary, start)):
            forks.fork(registry, "b", "x", boundary=boundary)
    # A third generation, forked inside the seed that the second inherited from the first.
    registry.append("g-own", turn(4))
    forks.fork(registry, "g-own", "h", boundary=3)
    assert_child(registry, "h", "g-own", 3)
    with fork_error(*inside("g-own", 9, 8)):
        forks.fork(registry, "g-own", "x", boundary=9)


def test_a_deep_boundary_childs_log_is_read_in_one_round_trip(registry: Registry,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from redis.connection import AbstractConnection

    parent = make(registry, "depth-0", turn(0), turn(1))
    expected = registry.events(parent)
    for depth in range(1, 16):
        # Alternately inside the inherited seed and at the last completed turn of the parent.
        boundary = 3 if depth % 2 else registry.last_turn_end(parent)
        assert boundary is not None
        child = f"depth-{depth}"
        forks.fork(registry, parent, child, boundary=boundary)
        expected = expected[: boundary + 1]
        expected += registry.append(child, [*turn(depth), *OPEN])
        parent = child
    registry.events(parent)  # the first read also reads the record
    sent: list[bytes] = []
    original = AbstractConnection.send_packed_command

    def counting(self: AbstractConnection, command: object, check_health: bool = True) -> None:
        sent.append(command)  # type: ignore[arg-type]
        original(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
    events = registry.events(parent)
    assert len(sent) == 1
    assert same(events, expected)


def test_an_ancestor_disposed_later_still_answers_for_the_seed(registry: Registry) -> None:
    make(registry, "a", turn(1), turn(2))
    forks.fork(registry, "a", "b")
    registry.dispose("a")
    forks.fork(registry, "b", "c", boundary=3)
    assert_child(registry, "c", "b", 3)
    with fork_error(*inside("b", 5, 4)):
        forks.fork(registry, "b", "x", boundary=5)


def test_fan_out_and_snapshot_take_a_boundary(registry: Registry) -> None:
    make(registry, "a", turn(1), turn(2), OPEN)
    result = forks.fork_many(registry, "a", ["c1", "c2", "c3"], boundary=3)
    assert [h.seed_length for h in result.created] == [4, 4, 4] and not result.failed
    events, meta = forks.snapshot(registry, "a", boundary=3)
    assert same(events, registry.events("a", 0, 4))
    assert (meta.parent_session, meta.seed_length) == ("a", 4)


def test_a_retry_with_the_same_request_id_returns_the_same_child(registry: Registry) -> None:
    make(registry, "a", turn(1), turn(2))
    first = forks.fork(registry, "a", "c", boundary=3, request_id="r1")
    registry.append("a", OPEN)
    assert forks.fork(registry, "a", "c", boundary=3, request_id="r1") == first


# -- the last completed turn ------------------------------------------------------------------------


def test_last_turn_end_follows_appends_and_seeds(registry: Registry) -> None:
    make(registry, "a")
    assert registry.last_turn_end("a") is None
    registry.append("a", [NewEvent("todo/write"), NewEvent("turn/start")])
    assert registry.last_turn_end("a") is None
    registry.append("a", [NewEvent("turn/end"), *turn(2), NewEvent("todo/write")])
    assert registry.last_turn_end("a") == 6
    forks.fork(registry, "a", "plain", boundary=7)
    forks.fork(registry, "a", "early", boundary=2)
    forks.fork(registry, "a", "before", boundary=0)
    assert [registry.last_turn_end(c) for c in ("plain", "early", "before")] == [6, 2, None]
    registry.append("early", OPEN)
    assert registry.last_turn_end("early") == 2
    registry.dispose("a")
    assert registry.last_turn_end("a") == 6
    with fork_error(ErrorCode.SESSION_NOT_FOUND, 'session "nope" not found'):
        registry.last_turn_end("nope")


def test_a_record_without_a_turn_index_is_checked_by_reading_its_prefix(registry: Registry, redis: Redis) -> None:
    # Records written before turn indexes existed have no lastend field and no turns list.
    make(registry, "a", turn(1), turn(2), OPEN)
    redis.hdel(keys.session("a"), "lastend", "seedend")
    redis.delete(keys.session_turns("a"))
    forks.fork(registry, "a", "c", boundary=3)
    assert_child(registry, "c", "a", 3)
    with fork_error(*inside("a", 9, 8)):
        forks.fork(registry, "a", "x", boundary=9)
    registry.append("a", [NewEvent("turn/end")])
    assert redis.exists(keys.session_turns("a")) == 0  # never a partial index
    assert registry.last_turn_end("c") == 3  # the child of an unindexed source has its own index
    registry.append("c", OPEN)  # c: seed 0..3, its own user/message at 4 (assert_child), then OPEN
    with fork_error(*inside("c", 5, 5)):
        forks.fork(registry, "c", "x", boundary=5)
    forks.fork(registry, "c", "g", boundary=4)
    assert_child(registry, "g", "c", 4)


@pytest.mark.parametrize("kind", ['note/"quoted"', "back\\slash", "ünïcode/✓"])
def test_the_childs_last_event_type_is_exact_whatever_its_characters(registry: Registry, kind: str) -> None:
    # The source step reads the type of the boundary event (fast path: the head of the stored
    # JSON; anything escaped: the whole event decoded): the plain rule of the child names it.
    make(registry, "a", turn(1), [NewEvent(kind, {"x": 1})], OPEN)
    forks.fork(registry, "a", "c", boundary=4)
    with fork_error(ErrorCode.OPEN_TURN, f'cannot fork session "c" inside an open turn (last event: {kind})'):
        forks.fork(registry, "c", "x")
    forks.fork(registry, "c", "g", boundary=4)  # the same event, now inside c's inherited seed
    with fork_error(ErrorCode.OPEN_TURN, f'cannot fork session "g" inside an open turn (last event: {kind})'):
        forks.fork(registry, "g", "x")
