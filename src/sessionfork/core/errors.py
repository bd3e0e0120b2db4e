"""The one exception type of sessionfork, and the error codes that are part of the wire contract.

    Exception
     └── ForkError(code: ErrorCode, message: str)

Every expected failure is a ``ForkError``. Its ``code`` travels on the wire as the ``code`` of a
``fork/error`` event; its ``message`` is the human text, fixed by the functions below so that the
words match the original harness exactly. Any other exception is a bug: entry points report it as
``INTERNAL`` and re-raise it.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    """Error codes, stable on the wire."""

    SESSION_NOT_FOUND = "SESSION_NOT_FOUND"
    SESSION_NOT_LIVE = "SESSION_NOT_LIVE"
    SESSION_ALREADY_EXISTS = "SESSION_ALREADY_EXISTS"
    OPEN_TURN = "OPEN_TURN"
    INVALID_BOUNDARY = "INVALID_BOUNDARY"
    PRECONDITION_FAILED = "PRECONDITION_FAILED"
    INVALID_REQUEST = "INVALID_REQUEST"
    IDEMPOTENCY_CONFLICT = "IDEMPOTENCY_CONFLICT"
    INTERNAL = "INTERNAL"
    WRONG_SHARD = "WRONG_SHARD"


class ForkError(Exception):
    """An expected failure with a stable ``code`` and an exact ``message``."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"ForkError({self.code.value}, {self.message!r})"

    def __reduce__(self) -> tuple[type[ForkError], tuple[ErrorCode, str]]:
        # Keeps the error intact across multiprocessing boundaries in tests and pools.
        return (ForkError, (self.code, self.message))


def not_found(session_id: str) -> ForkError:
    return ForkError(ErrorCode.SESSION_NOT_FOUND, f'session "{session_id}" not found')


def not_live(session_id: str) -> ForkError:
    return ForkError(ErrorCode.SESSION_NOT_LIVE, f'session "{session_id}" is not the live store instance')


def already_exists(session_id: str) -> ForkError:
    return ForkError(ErrorCode.SESSION_ALREADY_EXISTS, f'session "{session_id}" already exists')


def open_turn(session_id: str, last_type: str) -> ForkError:
    return ForkError(
        ErrorCode.OPEN_TURN,
        f'cannot fork session "{session_id}" inside an open turn (last event: {last_type})',
    )


def boundary_past_end(session_id: str, boundary: int, length: int) -> ForkError:
    return ForkError(
        ErrorCode.INVALID_BOUNDARY,
        f'cannot fork session "{session_id}" at boundary {boundary}: past the end of a log of {length} events',
    )


def boundary_negative(session_id: str, boundary: int) -> ForkError:
    return ForkError(
        ErrorCode.INVALID_BOUNDARY,
        f'cannot fork session "{session_id}" at boundary {boundary}: before the first event (seqs start at 0)',
    )


def boundary_inside_turn(session_id: str, boundary: int, turn_start: int) -> ForkError:
    return ForkError(
        ErrorCode.INVALID_BOUNDARY,
        f'cannot fork session "{session_id}" at boundary {boundary}: inside the turn opened at seq {turn_start}',
    )


def invalid_keep_from(session_id: str, keep_from: object, why: str) -> ForkError:
    """A summary fork whose ``keepFrom`` is out of range or not between turns."""
    return ForkError(ErrorCode.INVALID_BOUNDARY,
                     f'cannot summarise session "{session_id}" before keepFrom {keep_from}: {why}')


def precondition_failed(session_id: str, length: int, expected: int) -> ForkError:
    """A guarded fork (``ifLength``) whose source's log does not have the expected length."""
    return ForkError(ErrorCode.PRECONDITION_FAILED, f'session "{session_id}" has {length} events, not {expected}')


def wrong_shard(request_id: str, owner: int, served: int, count: int) -> ForkError:
    """A request enqueued on a queue server (shard ``served`` of ``count``) that is not the one its
    request id lives on (``owner``): refused, never forked, so that the right shard forks it once."""
    return ForkError(ErrorCode.WRONG_SHARD,
                     f'request id "{request_id}" lives on shard {owner} of {count}, not on shard {served}, which this '
                     f"worker serves: enqueue it on shard {owner}'s queue server (protocol.shards.shard_of)")


def invalid(message: str) -> ForkError:
    return ForkError(ErrorCode.INVALID_REQUEST, message)
