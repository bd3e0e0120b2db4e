"""Fork semantics against a real server: error codes and messages, headers, seeds, independence."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import count
from typing import Any

import pytest
from msgspec import UNSET
from redis import Redis

from sessionfork.core import forks, keys, wire
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.registry import Registry, SessionRef
from sessionfork.core.wire import Event, Header, LiveHandle, NewEvent, SeedMeta

NOW = 1_700_000_000_000


def turn(reason: str = "completed", tag: str = "") -> list[NewEvent]:
    return [
        NewEvent("turn/start"),
        NewEvent("user/message", {"text": f"question {tag}"}),
        NewEvent("assistant/message", {"text": f"answer {tag}"}),
        NewEvent("turn/end", {"reason": reason}),
    ]


@contextmanager
def fork_error(code: ErrorCode, message: str) -> Iterator[None]:
    with pytest.raises(ForkError) as info:
        yield
    assert (info.value.code, info.value.message) == (code, message)


def not_found(sid: str) -> tuple[ErrorCode, str]:
    return ErrorCode.SESSION_NOT_FOUND, f'session "{sid}" not found'


def not_live(sid: str) -> tuple[ErrorCode, str]:
    return ErrorCode.SESSION_NOT_LIVE, f'session "{sid}" is not the live store instance'


def exists(sid: str) -> tuple[ErrorCode, str]:
    return ErrorCode.SESSION_ALREADY_EXISTS, f'session "{sid}" already exists'


def open_turn(sid: str, last: str) -> tuple[ErrorCode, str]:
    return ErrorCode.OPEN_TURN, f'cannot fork session "{sid}" inside an open turn (last event: {last})'


def state(redis: Redis) -> dict[bytes, Any]:
    """Every key with its type and full content."""
    out: dict[bytes, Any] = {}
    for key in sorted(redis.keys("*")):
        kind = redis.type(key)
        if kind == b"hash":
            out[key] = ("hash", redis.hgetall(key))
        elif kind == b"list":
            out[key] = ("list", redis.lrange(key, 0, -1))
        elif kind == b"set":
            out[key] = ("set", sorted(redis.smembers(key)))
        else:
            out[key] = (kind, redis.dump(key))
    return out


@pytest.fixture
def clocked(redis: Redis) -> Registry:
    """A registry whose clock reads NOW, NOW + 1, ... and whose tokens are tok-1, tok-2, ..."""
    ticks = count(NOW)
    tokens = count(1)
    return Registry(redis, clock=lambda: next(ticks), new_token=lambda: f"tok-{next(tokens)}")


def completed_source(registry: Registry, sid: str = "src", cwd: str | None = None) -> LiveHandle:
    handle = registry.create(sid, cwd=cwd)
    registry.append(handle, turn())
    return handle


# -- SESSION_NOT_FOUND -----------------------------------------------------------------------------

def fork_child(registry: Registry, source: SessionRef) -> object:
    return forks.fork(registry, source, "child")


OPS = pytest.mark.parametrize("operation", [forks.snapshot, fork_child], ids=["snapshot", "fork"])


@OPS
def test_never_created_session_by_id_is_not_found(
    registry: Registry, operation: Callable[[Registry, SessionRef], object]
) -> None:
    with fork_error(*not_found("ghost")):
        operation(registry, "ghost")


@OPS
def test_never_created_session_by_handle_is_not_found(
    registry: Registry, operation: Callable[[Registry, SessionRef], object]
) -> None:
    with fork_error(*not_found("ghost")):
        operation(registry, LiveHandle("ghost", "tok"))


@OPS
def test_disposed_session_by_id_is_not_found(
    registry: Registry, operation: Callable[[Registry, SessionRef], object]
) -> None:
    handle = completed_source(registry)
    registry.dispose(handle)
    with fork_error(*not_found("src")):
        operation(registry, "src")


@OPS
def test_disposed_session_by_its_own_handle_is_not_found(
    registry: Registry, operation: Callable[[Registry, SessionRef], object]
) -> None:
    handle = completed_source(registry)
    registry.dispose(handle)
    with fork_error(*not_found("src")):
        operation(registry, handle)


# -- SESSION_NOT_LIVE ------------------------------------------------------------------------------


@OPS
def test_stale_handle_is_not_live(registry: Registry, operation: Callable[[Registry, SessionRef], object]) -> None:
    completed_source(registry)
    with fork_error(*not_live("src")):
        operation(registry, LiveHandle("src", "wrong-token"))


@OPS
def test_live_handle_with_right_token_works(
    registry: Registry, operation: Callable[[Registry, SessionRef], object]
) -> None:
    handle = completed_source(registry)
    operation(registry, handle)


# -- SESSION_ALREADY_EXISTS ------------------------------------------------------------------------


def test_create_of_an_existing_id_already_exists(registry: Registry) -> None:
    registry.create("a")
    with fork_error(*exists("a")):
        registry.create("a")


def test_create_of_a_disposed_id_already_exists(registry: Registry) -> None:
    registry.dispose(registry.create("a"))
    with fork_error(*exists("a")):
        registry.create("a")


def test_fork_into_an_existing_session_already_exists(registry: Registry) -> None:
    completed_source(registry)
    registry.create("taken")
    with fork_error(*exists("taken")):
        forks.fork(registry, "src", "taken")


def test_fork_into_an_existing_child_already_exists(registry: Registry) -> None:
    completed_source(registry)
    forks.fork(registry, "src", "child")
    with fork_error(*exists("child")):
        forks.fork(registry, "src", "child")


def test_fork_into_the_source_id_itself_already_exists(registry: Registry) -> None:
    completed_source(registry)
    with fork_error(*exists("src")):
        forks.fork(registry, "src", "src")


def test_fork_into_a_disposed_id_already_exists(registry: Registry) -> None:
    completed_source(registry)
    registry.dispose(registry.create("gone"))
    with fork_error(*exists("gone")):
        forks.fork(registry, "src", "gone")


def test_duplicate_child_id_is_reported_before_open_turn(registry: Registry) -> None:
    handle = completed_source(registry)
    registry.create("taken")
    registry.append(handle, [NewEvent("turn/start")])
    with fork_error(*exists("taken")):
        forks.fork(registry, handle, "taken")


def test_failed_create_keeps_the_original_session(registry: Registry) -> None:
    handle = registry.create("a", cwd="/first")
    with pytest.raises(ForkError):
        registry.create("a", cwd="/second")
    assert registry.header("a").cwd == "/first"
    assert registry.instance("a") == handle.instance


# -- OPEN_TURN and the boundary rule ---------------------------------------------------------------

OPEN_TAILS = {
    "turn/start": ["turn/start"],
    "step/start": ["turn/start", "step/start"],
    "user/message": ["turn/start", "user/message"],
    "assistant/message": ["turn/start", "step/start", "user/message", "assistant/message"],
    "tool/call": ["turn/start", "assistant/message", "tool/call"],
}


@pytest.mark.parametrize("last", list(OPEN_TAILS))
def test_fork_inside_an_open_turn_is_open_turn(registry: Registry, last: str) -> None:
    handle = registry.create("src")
    registry.append(handle, [NewEvent(t) for t in OPEN_TAILS[last]])
    with fork_error(*open_turn("src", last)):
        forks.fork(registry, handle, "child")
    assert not registry.exists("child")


@pytest.mark.parametrize("last", list(OPEN_TAILS))
def test_snapshot_inside_an_open_turn_is_open_turn(registry: Registry, last: str) -> None:
    handle = registry.create("src")
    registry.append(handle, [NewEvent(t) for t in OPEN_TAILS[last]])
    with fork_error(*open_turn("src", last)):
        forks.snapshot(registry, handle)


def test_open_turn_reports_the_last_event_of_a_multi_event_append(registry: Registry) -> None:
    registry.create("src")
    registry.append("src", [NewEvent("turn/start"), NewEvent("turn/end"), NewEvent("tool/call")])
    with fork_error(*open_turn("src", "tool/call")):
        forks.fork(registry, "src", "child")


REASONS = ["completed", "aborted", "error", "disposed", "max-tokens", "interrupted", "blocked",
           "some-reason-invented-tomorrow"]


@pytest.mark.parametrize("reason", REASONS)
def test_fork_after_turn_end_with_any_reason_succeeds(registry: Registry, reason: str) -> None:
    handle = registry.create("src")
    registry.append(handle, turn(reason))
    header = forks.fork(registry, handle, "child")
    assert header.seed_length == 4
    assert registry.events("child") == registry.events("src")
    assert registry.events("child")[-1].data == {"reason": reason}


def test_turn_end_without_data_is_a_boundary(registry: Registry) -> None:
    registry.create("src")
    registry.append("src", [NewEvent("turn/start"), NewEvent("turn/end")])
    assert forks.fork(registry, "src", "child").seed_length == 2


def test_open_turn_after_completed_turn_is_never_clipped_to_the_older_prefix(registry: Registry) -> None:
    handle = completed_source(registry)
    registry.append(handle, [NewEvent("turn/start")])
    with fork_error(*open_turn("src", "turn/start")):
        forks.fork(registry, handle, "child")
    with fork_error(*open_turn("src", "turn/start")):
        forks.snapshot(registry, handle)
    assert not registry.exists("child")


def test_fork_becomes_possible_again_when_the_turn_closes(registry: Registry) -> None:
    handle = completed_source(registry)
    registry.append(handle, [NewEvent("turn/start")])
    with pytest.raises(ForkError):
        forks.fork(registry, handle, "child")
    registry.append(handle, [NewEvent("turn/end", {"reason": "completed"})])
    assert forks.fork(registry, handle, "child").seed_length == 6


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


# -- failed forks leave nothing behind -------------------------------------------------------------


def _ghost(registry: Registry) -> None:
    forks.fork(registry, "ghost", "child")


def _disposed(registry: Registry) -> None:
    forks.fork(registry, "gone", "child")


def _disposed_by_handle(registry: Registry) -> None:
    forks.fork(registry, LiveHandle("gone", "tok"), "child")


def _stale(registry: Registry) -> None:
    forks.fork(registry, LiveHandle("src", "wrong-token"), "child")


def _taken(registry: Registry) -> None:
    forks.fork(registry, "src", "other")


def _taken_on_open_source(registry: Registry) -> None:
    forks.fork(registry, "open", "other")


def _open(registry: Registry) -> None:
    forks.fork(registry, "open", "child")


def _invalid_child(registry: Registry) -> None:
    forks.fork(registry, "src", "bad{id}")


def _invalid_source(registry: Registry) -> None:
    forks.fork(registry, "bad id", "child")


FAILED_FORKS: dict[str, tuple[ErrorCode, Callable[[Registry], None]]] = {
    "never-created source": (ErrorCode.SESSION_NOT_FOUND, _ghost),
    "disposed source": (ErrorCode.SESSION_NOT_FOUND, _disposed),
    "disposed source by handle": (ErrorCode.SESSION_NOT_FOUND, _disposed_by_handle),
    "stale handle": (ErrorCode.SESSION_NOT_LIVE, _stale),
    "existing child": (ErrorCode.SESSION_ALREADY_EXISTS, _taken),
    "existing child, open source": (ErrorCode.SESSION_ALREADY_EXISTS, _taken_on_open_source),
    "open turn": (ErrorCode.OPEN_TURN, _open),
    "invalid child id": (ErrorCode.INVALID_REQUEST, _invalid_child),
    "invalid source id": (ErrorCode.INVALID_REQUEST, _invalid_source),
}


@pytest.mark.parametrize("case", list(FAILED_FORKS))
def test_failed_fork_leaves_no_key_behind(registry: Registry, redis: Redis, case: str) -> None:
    completed_source(registry, "src")
    forks.fork(registry, "src", "other")
    registry.dispose(completed_source(registry, "gone"))
    registry.create("open")
    registry.append("open", [*turn(), NewEvent("turn/start")])
    keys_before = sorted(redis.keys("*"))
    state_before = state(redis)
    code, failing_fork = FAILED_FORKS[case]
    with pytest.raises(ForkError) as info:
        failing_fork(registry)
    assert info.value.code == code
    assert sorted(redis.keys("*")) == keys_before
    assert state(redis) == state_before


# -- idempotent forks ------------------------------------------------------------------------------


def test_fork_replay_with_same_request_id_returns_the_same_child(registry: Registry, redis: Redis) -> None:
    completed_source(registry)
    first = forks.fork(registry, "src", "child", request_id="req-1")
    before = state(redis)
    assert forks.fork(registry, "src", "child", request_id="req-1") == first
    assert state(redis) == before



def test_a_replay_whose_first_attempt_made_the_child_after_its_source_step_gets_that_child(
        registry: Registry, redis: Redis) -> None:
    # The replay's source step runs before the first attempt's child step lands (a crashed worker's
    # pipeline still executing): only the child step can tell the child is this request's.
    completed_source(registry)
    plan = registry.prepare_fork("src", ["child"], request_id="req-1")
    assert not plan.replayed and not plan.existing  # the interleaving: the child was not there yet
    first = forks.fork(registry, "src", "child", request_id="req-1")
    before = state(redis)
    again = forks.create(registry, plan, ["child"], request_id="req-1")
    assert again.created == [first] and again.failed == []
    assert state(redis) == before

def test_fork_replay_succeeds_after_source_moved_into_an_open_turn(registry: Registry) -> None:
    handle = completed_source(registry)
    first = forks.fork(registry, handle, "child", request_id="req-1")
    registry.append(handle, [NewEvent("turn/start")])
    assert forks.fork(registry, handle, "child", request_id="req-1") == first
    assert registry.header("child") == first
    assert registry.length("child") == 4


def test_fork_replay_succeeds_after_source_was_disposed(registry: Registry) -> None:
    handle = completed_source(registry)
    first = forks.fork(registry, handle, "child", request_id="req-1")
    registry.dispose(handle)
    assert forks.fork(registry, handle, "child", request_id="req-1") == first
    assert forks.fork(registry, "src", "child", request_id="req-1") == first


def test_fork_with_other_request_id_for_same_child_already_exists(registry: Registry) -> None:
    completed_source(registry)
    forks.fork(registry, "src", "child", request_id="req-1")
    with fork_error(*exists("child")):
        forks.fork(registry, "src", "child", request_id="req-2")


def test_fork_without_request_id_for_a_child_made_by_a_request_already_exists(registry: Registry) -> None:
    completed_source(registry)
    forks.fork(registry, "src", "child", request_id="req-1")
    with fork_error(*exists("child")):
        forks.fork(registry, "src", "child")


def test_request_id_does_not_claim_a_session_created_without_it(registry: Registry) -> None:
    completed_source(registry)
    forks.fork(registry, "src", "child")
    with fork_error(*exists("child")):
        forks.fork(registry, "src", "child", request_id="req-1")


def test_request_id_does_not_claim_a_root_session(registry: Registry) -> None:
    completed_source(registry)
    registry.create("root")
    with fork_error(*exists("root")):
        forks.fork(registry, "src", "root", request_id="req-1")


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


# -- disposal --------------------------------------------------------------------------------------


def test_append_to_a_disposed_session_is_not_found(registry: Registry) -> None:
    handle = completed_source(registry)
    registry.dispose(handle)
    with fork_error(*not_found("src")):
        registry.append("src", turn())
    with fork_error(*not_found("src")):
        registry.append(handle, turn())
    assert registry.length("src") == 4


def test_append_to_a_never_created_session_is_not_found(registry: Registry, redis: Redis) -> None:
    with fork_error(*not_found("ghost")):
        registry.append("ghost", turn())
    assert redis.keys("*") == []


def test_append_with_a_stale_handle_is_not_live(registry: Registry) -> None:
    completed_source(registry)
    with fork_error(*not_live("src")):
        registry.append(LiveHandle("src", "wrong-token"), turn())
    assert registry.length("src") == 4


def test_dispose_with_a_stale_handle_is_not_live(registry: Registry) -> None:
    handle = completed_source(registry)
    with fork_error(*not_live("src")):
        registry.dispose(LiveHandle("src", "wrong-token"))
    assert registry.instance("src") == handle.instance


def test_dispose_twice_is_not_found(registry: Registry) -> None:
    handle = completed_source(registry)
    registry.dispose(handle)
    with fork_error(*not_found("src")):
        registry.dispose(handle)
    with fork_error(*not_found("src")):
        registry.dispose("src")


def test_dispose_of_a_never_created_session_is_not_found(registry: Registry) -> None:
    with fork_error(*not_found("ghost")):
        registry.dispose("ghost")


def test_disposed_session_header_and_events_stay_readable(registry: Registry) -> None:
    handle = registry.create("src", cwd="/w")
    registry.append(handle, turn())
    header, events = registry.header("src"), registry.events("src")
    registry.dispose(handle)
    assert registry.header("src") == header
    assert registry.events("src") == events
    assert registry.events("src", 1, 3) == events[1:3]
    assert registry.exists("src")
    assert registry.instance("src") is None
    assert registry.length("src") == 4


def test_disposing_a_parent_keeps_its_children_readable_and_live(registry: Registry) -> None:
    handle = completed_source(registry)
    forks.fork(registry, handle, "child")
    registry.dispose(handle)
    assert len(registry.events("child")) == 4
    assert registry.instance("child") is not None
    assert forks.fork(registry, "child", "grandchild").seed_length == 4


def test_reads_of_a_never_created_session_are_not_found(registry: Registry) -> None:
    with fork_error(*not_found("ghost")):
        registry.header("ghost")
    with fork_error(*not_found("ghost")):
        registry.events("ghost")
    assert registry.instance("ghost") is None
    assert not registry.exists("ghost")
    assert registry.length("ghost") == 0


def test_empty_append_to_a_disposed_session_is_not_found(registry: Registry) -> None:
    handle = registry.create("gone-empty")
    registry.dispose(handle)
    with pytest.raises(ForkError) as err:
        registry.append("gone-empty", [])
    assert err.value.code is ErrorCode.SESSION_NOT_FOUND


def test_empty_append_through_a_stale_handle_is_not_live(registry: Registry) -> None:
    registry.create("stale-empty")
    with pytest.raises(ForkError) as err:
        registry.append(LiveHandle("stale-empty", "nope"), [])
    assert err.value.code is ErrorCode.SESSION_NOT_LIVE


def test_request_id_without_child_id_is_refused(registry: Registry) -> None:
    registry.create("src-noid")
    with pytest.raises(ForkError) as err:
        forks.fork(registry, "src-noid", request_id="r-1")
    assert err.value.code is ErrorCode.INVALID_REQUEST


def test_bad_request_id_is_refused(registry: Registry) -> None:
    registry.create("src-badreq")
    with pytest.raises(ForkError) as err:
        forks.fork(registry, "src-badreq", "child-badreq", request_id="bad id{")
    assert err.value.code is ErrorCode.INVALID_REQUEST


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
