"""Idempotent forks against a real server: a replay with the fork's request id returns the same child
(even after its source opened a turn or was disposed, even when the first attempt landed its child
after the replay's source step) and changes nothing; another or no request id never claims a child;
a child-less or malformed request id is refused."""

from __future__ import annotations

import pytest
from fork_helpers import completed_source, exists, fork_error, state
from redis import Redis

from sessionfork.core import forks
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.registry import Registry
from sessionfork.core.wire import NewEvent

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
    again = forks.create(registry, forks.make_spec("src", ["child"], request_id="req-1"), plan)
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
