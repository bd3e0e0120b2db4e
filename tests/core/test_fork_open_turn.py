"""The boundary rule against a real server: a fork or snapshot inside an open turn is OPEN_TURN,
naming the last event (never clipped to an older boundary); after a ``turn/end`` of any reason, or
none, it succeeds."""

from __future__ import annotations

import pytest
from fork_helpers import completed_source, fork_error, open_turn, turn

from sessionfork.core import forks
from sessionfork.core.errors import ForkError
from sessionfork.core.registry import Registry
from sessionfork.core.wire import NewEvent

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
