"""Disposal against a real server: a disposed or never-created session is SESSION_NOT_FOUND to
append, dispose and reads (a disposed one stays readable), a stale handle is SESSION_NOT_LIVE, and
disposing a parent leaves its children readable and live."""

from __future__ import annotations

import pytest
from fork_helpers import completed_source, fork_error, not_found, not_live, turn
from redis import Redis

from sessionfork.core import forks
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.registry import Registry
from sessionfork.core.wire import LiveHandle

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
