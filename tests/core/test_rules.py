"""Pure rules: id validation, the turn-boundary rule, and seed-segment arithmetic."""

from __future__ import annotations

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionfork.core import rules
from sessionfork.core.errors import ErrorCode, ForkError

ID_ALPHABET = string.ascii_letters + string.digits + "._:-"


@pytest.mark.parametrize(
    "value",
    ["a", "Z", "0", "x" * 128, "session-1", "a.b", "a:b", "a_b", "A-z.0_9:", "...", "-", ID_ALPHABET],
)
def test_valid_ids_are_accepted(value: str) -> None:
    assert rules.is_valid_id(value)
    assert rules.check_id(value) == value


@pytest.mark.parametrize(
    "value",
    [
        "",
        "x" * 129,
        "a{b",
        "a}b",
        "{a}",
        "a b",
        " a",
        "a\n",
        "a\t",
        "a\x00",
        "a\x7f",
        "caf\u00e9",
        "\u0661",  # ARABIC-INDIC DIGIT ONE: a unicode digit, not [0-9]
        "\uff21",  # FULLWIDTH LATIN CAPITAL LETTER A
        "a/b",
        "a\\b",
        "a*b",
        "a,b",
    ],
)
def test_invalid_ids_are_rejected(value: str) -> None:
    assert not rules.is_valid_id(value)


def test_id_length_limit_is_128() -> None:
    assert rules.ID_MAX_LENGTH == 128


@pytest.mark.parametrize("value", ["", "x" * 129, "a{b", "a}b", "a b", "a\x01", "caf\u00e9", "a/b"])
def test_check_id_raises_invalid_request(value: str) -> None:
    with pytest.raises(ForkError) as info:
        rules.check_id(value)
    assert info.value.code is ErrorCode.INVALID_REQUEST
    assert info.value.message == (
        f"invalid session id {value!r}: expected 1-128 characters from [A-Za-z0-9._:-]"
    )


def test_check_id_names_what_it_checked() -> None:
    with pytest.raises(ForkError) as info:
        rules.check_id("a b", "request id")
    assert info.value.message.startswith("invalid request id 'a b': ")


@pytest.mark.parametrize("value", [None, 1, b"abc", ["a"]])
def test_check_id_rejects_non_strings(value: object) -> None:
    with pytest.raises(ForkError) as info:
        rules.check_id(value)  # type: ignore[arg-type]
    assert info.value.code is ErrorCode.INVALID_REQUEST


@given(st.text(alphabet=ID_ALPHABET, min_size=1, max_size=128))
def test_every_string_over_the_id_alphabet_up_to_128_is_valid(value: str) -> None:
    assert rules.is_valid_id(value)


@given(st.text(min_size=1, max_size=140))
def test_is_valid_id_agrees_with_the_alphabet_and_length_rule(value: str) -> None:
    expected = len(value) <= 128 and all(c in ID_ALPHABET for c in value)
    assert rules.is_valid_id(value) is expected


@pytest.mark.parametrize("last_type", [None, "", "turn/end"])
def test_empty_log_or_turn_end_is_forkable(last_type: str | None) -> None:
    assert rules.is_forkable(last_type)


@pytest.mark.parametrize(
    "last_type",
    ["turn/start", "step/start", "step/end", "user/message", "assistant/message", "tool/call",
     "tool/result", "turn/end/x", "Turn/End", " turn/end", "turn/end "],
)
def test_any_other_last_event_is_not_forkable(last_type: str) -> None:
    assert not rules.is_forkable(last_type)


def test_turn_end_constant() -> None:
    assert rules.TURN_END == "turn/end"


def test_child_of_a_root_session_references_the_parents_log() -> None:
    assert rules.child_segments("p", [], 0, 5) == [["p", 0, 5]]


def test_child_of_an_empty_root_session_has_no_segments() -> None:
    assert rules.child_segments("p", [], 0, 0) == []


def test_child_of_a_forked_parent_appends_the_parents_own_slice() -> None:
    parent = [["g", 0, 4], ["f", 0, 2]]
    assert rules.child_segments("p", parent, 6, 9) == [["g", 0, 4], ["f", 0, 2], ["p", 0, 3]]


def test_child_of_a_forked_parent_without_own_events_inherits_its_segments_only() -> None:
    parent: list[list[object]] = [["g", 0, 4]]
    result = rules.child_segments("p", parent, 4, 4)
    assert result == [["g", 0, 4]]
    assert result is not parent


def test_child_segments_do_not_mutate_the_parent_segments() -> None:
    parent: list[list[object]] = [["g", 0, 4]]
    rules.child_segments("p", parent, 4, 7)
    assert parent == [["g", 0, 4]]


def test_child_segments_clip_the_inherited_seed_for_a_shorter_length() -> None:
    # A boundary fork inside the parent's own seed: no reference to the parent itself.
    assert rules.child_segments("p", [["g", 0, 4], ["f", 0, 2]], 6, 5) == [["g", 0, 4], ["f", 0, 1]]


def test_child_segments_reject_a_negative_length() -> None:
    with pytest.raises(ValueError, match="0 or more"):
        rules.child_segments("p", [["g", 0, 4]], 4, -1)


@given(st.lists(st.integers(min_value=0, max_value=50), max_size=6))
def test_segment_sizes_sum_to_the_childs_length(own_sizes: list[int]) -> None:
    # A chain of forks: each level adds ``own`` events of its own before the next fork.
    segments: list[list[object]] = []
    seed_length = 0
    for level, own in enumerate(own_sizes):
        length = seed_length + own
        segments = rules.child_segments(f"s{level}", segments, seed_length, length)
        seed_length = length
        total = 0
        for _, lo, hi in segments:
            assert isinstance(lo, int)
            assert isinstance(hi, int)
            assert 0 == lo < hi
            total += hi - lo
        assert total == seed_length


def test_a_childs_seed_references_its_parents_seed_by_one_entry() -> None:
    parent: list[list[object]] = [["g", 0, 4], ["f", 0, 2]]
    full = rules.child_segments("p", parent, 6, 9)
    assert rules.by_reference("p", full) == [["p", -6, 0], ["p", 0, 3]]
    assert rules.by_reference("p", rules.child_segments("p", parent, 6, 6)) == [["p", -6, 0]]
    assert rules.by_reference("p", rules.child_segments("p", [], 0, 5)) == [["p", 0, 5]]  # a root's child: as before
    assert rules.by_reference("p", []) == []


@given(st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=30))
def test_a_stored_seed_has_at_most_two_entries_and_the_same_size(own_sizes: list[int]) -> None:
    segments: list[list[object]] = []
    seed_length = 0
    for level, own in enumerate(own_sizes):
        length = seed_length + own
        stored = rules.by_reference(f"s{level}", rules.child_segments(f"s{level}", segments, seed_length, length))
        assert len(stored) <= 2
        assert sum(int(s[2]) - int(s[1]) for s in stored) == length  # type: ignore[call-overload]
        segments = rules.child_segments(f"s{level}", segments, seed_length, length)
        seed_length = length
