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
    NOT_DESCENDANT = "NOT_DESCENDANT"
    ALREADY_MERGED = "ALREADY_MERGED"
    REQUEST_NOT_FOUND = "REQUEST_NOT_FOUND"
    INVALID_BUNDLE = "INVALID_BUNDLE"


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
    """A live handle whose instance token is not the session's live one (a stale handle)."""
    return ForkError(ErrorCode.SESSION_NOT_LIVE,
                     f'live handle of session "{session_id}" is stale: its instance is not the live one')


def disposed(session_id: str) -> ForkError:
    """A merge or select into a parent that exists but is disposed (no live instance)."""
    return ForkError(ErrorCode.SESSION_NOT_LIVE, f'session "{session_id}" is disposed: nothing merges into it')


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


def request_not_found(request_id: str) -> ForkError:
    """A client's wait for a request id no request on its queue server has: neither queued nor
    running (no job) nor answered (no stored outcome). A client's answer, never an outcome."""
    return ForkError(ErrorCode.REQUEST_NOT_FOUND,
                     f'request "{request_id}" is not known: not queued, running nor answered (never enqueued on '
                     "this queue server, or its outcome expired)")


def not_descendant(child: str, parent: str) -> ForkError:
    """A merge whose child's ``parentSession`` chain does not reach the parent it names."""
    return ForkError(ErrorCode.NOT_DESCENDANT, f'session "{child}" does not descend from session "{parent}" '
                     f"(its parentSession chain does not reach it): child and parent must be a fork's descendant "
                     "and its ancestor")


def already_merged(child: str, parent: str, request_id: str, seq: int) -> ForkError:
    """A merge of what was merged already: the same parent, child and range, under any request id
    (or, for a select, a candidate merged before): names the earlier request and where it landed."""
    return ForkError(ErrorCode.ALREADY_MERGED, f'session "{child}" was already merged into session "{parent}" '
                     f'by request "{request_id}" (at seq {seq})')


def abandoned(child: str, request_id: str) -> ForkError:
    """A merge or select of a session that a select abandoned (a stale selection)."""
    return ForkError(ErrorCode.ALREADY_MERGED, f'session "{child}" was abandoned by request "{request_id}" '
                     "(a select that chose another candidate)")


def held(session_id: str, request_id: str) -> ForkError:
    """A merge or select of a session that another merge or select still running holds: of two
    requests that would change one session's state, one wins (``lib/hold.lua``)."""
    return ForkError(ErrorCode.ALREADY_MERGED, f'session "{session_id}" is being merged or selected by request '
                     f'"{request_id}" (one request at a time changes a session\'s state)')


def open_merge_turn(session_id: str, last_type: str) -> ForkError:
    """A merge into a parent whose last turn is still open."""
    return ForkError(ErrorCode.OPEN_TURN,
                     f'cannot merge into session "{session_id}" inside an open turn (last event: {last_type})')


def invalid_range(session_id: str, why: str) -> ForkError:
    """A merge whose range is outside the child's own events, or does not end between turns."""
    return ForkError(ErrorCode.INVALID_BOUNDARY, f'cannot merge from session "{session_id}": {why}')


def invalid(message: str) -> ForkError:
    return ForkError(ErrorCode.INVALID_REQUEST, message)
