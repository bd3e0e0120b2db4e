"""Refused forks against a real server: the error code and exact message of SESSION_NOT_FOUND,
SESSION_NOT_LIVE and SESSION_ALREADY_EXISTS (for fork, snapshot and create), and a failed fork, for
any reason, leaves no key behind."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fork_helpers import completed_source, exists, fork_error, not_found, not_live, state, turn
from redis import Redis

from sessionfork.core import forks
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.registry import Registry, SessionRef
from sessionfork.core.wire import LiveHandle, NewEvent

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
