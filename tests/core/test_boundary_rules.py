"""The boundary rule of forks at an earlier turn, and the seed arithmetic of boundary children (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionfork.core import rules
from sessionfork.core.errors import ErrorCode
from sessionfork.core.wire import Event
from sessionfork.ops.repair import plan_repair

TYPES = ["turn/start", "user/message", "tool/call", "tool/result", "turn/end", "todo/write", "step/start"]


def error_of(types: list[str], boundary: int) -> tuple[ErrorCode, str] | None:
    error = rules.check_boundary_in("s", types, boundary)
    return None if error is None else (error.code, error.message)


def test_a_turn_end_is_a_valid_boundary() -> None:
    assert error_of(["turn/start", "user/message", "turn/end", "turn/start"], 2) is None


def test_events_after_a_turn_end_that_open_no_turn_are_between_turns() -> None:
    assert error_of(["turn/start", "turn/end", "todo/write", "todo/write", "turn/start"], 3) is None


def test_events_before_any_turn_marker_are_valid_boundaries() -> None:
    assert error_of(["todo/write", "user/message", "turn/start"], 0) is None
    assert error_of(["todo/write", "user/message", "turn/start"], 1) is None


def test_boundary_zero_on_a_turn_start_is_inside_that_turn() -> None:
    assert error_of(["turn/start", "turn/end"], 0) == (
        ErrorCode.INVALID_BOUNDARY, 'cannot fork session "s" at boundary 0: inside the turn opened at seq 0')


def test_inside_an_open_turn_names_the_newest_turn_start() -> None:
    types = ["turn/start", "turn/end", "turn/start", "user/message", "tool/call"]
    assert error_of(types, 4) == (
        ErrorCode.INVALID_BOUNDARY, 'cannot fork session "s" at boundary 4: inside the turn opened at seq 2')


def test_past_the_end_names_the_length() -> None:
    assert error_of(["turn/start", "turn/end"], 2) == (
        ErrorCode.INVALID_BOUNDARY, 'cannot fork session "s" at boundary 2: past the end of a log of 2 events')
    assert error_of([], 0) == (
        ErrorCode.INVALID_BOUNDARY, 'cannot fork session "s" at boundary 0: past the end of a log of 0 events')


def test_a_negative_boundary_is_invalid() -> None:
    assert error_of(["turn/end"], -1) == (
        ErrorCode.INVALID_BOUNDARY, 'cannot fork session "s" at boundary -1: before the first event (seqs start at 0)')


def test_batch_markers_encode_position_and_kind() -> None:
    assert rules.batch_markers(["user/message", "turn/start", "x", "turn/end"]) == [2, 7]
    assert rules.batch_markers(["todo/write"]) == []


def test_clip_segments_exactly_on_a_segment_border() -> None:
    segments = [["g", 0, 4], ["f", 0, 2], ["p", 0, 3]]
    assert rules.clip_segments(segments, 6) == [["g", 0, 4], ["f", 0, 2]]
    assert rules.clip_segments(segments, 4) == [["g", 0, 4]]
    assert rules.clip_segments(segments, 0) == []
    with pytest.raises(ValueError, match="fewer events"):
        rules.clip_segments(segments, 10)


def test_child_segments_of_a_boundary_inside_the_parents_own_events() -> None:
    assert rules.child_segments("p", [["g", 0, 4]], 4, 6) == [["g", 0, 4], ["p", 0, 2]]


def test_child_segments_of_a_boundary_on_the_border_of_the_parents_seed() -> None:
    assert rules.child_segments("p", [["g", 0, 4], ["f", 0, 2]], 6, 6) == [["g", 0, 4], ["f", 0, 2]]


def test_owner_of_a_seq_is_the_segment_that_holds_it() -> None:
    segments = [["g", 0, 4], ["f", 0, 2]]
    assert [rules.owner_of(segments, seq)[0] for seq in range(6)] == ["g"] * 4 + ["f"] * 2
    # the index in the owner's own log: seqs are positions (a summary child renumbers its slices)
    assert [rules.owner_of([["@c", 0, 1], ["p", 3, 6]], seq) for seq in range(4)] == \
        [("@c", 0), ("p", 3), ("p", 4), ("p", 5)]
    with pytest.raises(ValueError, match="past the seed"):
        rules.owner_of(segments, 6)


@given(st.lists(st.integers(min_value=0, max_value=30), min_size=1, max_size=5), st.data())
def test_clipped_segments_always_hold_the_prefix(sizes: list[int], data: st.DataObject) -> None:
    segments = [[f"s{i}", 0, n] for i, n in enumerate(sizes) if n]
    total = sum(sizes)
    length = data.draw(st.integers(min_value=0, max_value=total))
    clipped = rules.clip_segments(segments, length)
    assert sum(hi - lo for _, lo, hi in clipped) == length
    flat = [(o, i) for o, lo, hi in segments for i in range(lo, hi)]
    assert [(o, i) for o, lo, hi in clipped for i in range(lo, hi)] == flat[:length]


@given(st.lists(st.sampled_from(TYPES), max_size=25))
def test_repair_and_the_boundary_rule_agree_on_what_a_turn_boundary_is(types: list[str]) -> None:
    # A log needs a repair exactly when its last event is not a valid fork boundary.
    events = [Event(t, i, 0, {"id": f"c{i}"} if t.startswith("tool/") else {}) for i, t in enumerate(types)]
    last_is_boundary = bool(types) and rules.check_boundary_in("s", types, len(types) - 1) is None
    assert (plan_repair(events) == []) == (not types or last_is_boundary)
    assert (rules.open_turn_start(types) is None) == (not types or last_is_boundary)
