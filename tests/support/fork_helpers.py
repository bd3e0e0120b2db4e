"""Shared helpers of the fork-semantics tests (``test_fork_*.py``, ``test_disposal.py``, and the
cluster tests' ``fork_error``): finished turns, a completed source, the exact ``ForkError`` each code
raises with its message, and a key-by-key dump of a server's state."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from redis import Redis

from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.registry import Registry
from sessionfork.core.wire import LiveHandle, NewEvent


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
    return ErrorCode.SESSION_NOT_LIVE, f'live handle of session "{sid}" is stale: its instance is not the live one'


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


def completed_source(registry: Registry, sid: str = "src", cwd: str | None = None) -> LiveHandle:
    handle = registry.create(sid, cwd=cwd)
    registry.append(handle, turn())
    return handle
