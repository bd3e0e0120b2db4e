"""Pure rules: the boundary rule, id validation, lineage arithmetic. No I/O, no clock."""

from __future__ import annotations

import re

from ..core import errors

TURN_END = "turn/end"
ID_MAX_LENGTH = 128
_ID_RE = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
_TRACEPARENT_RE = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


def is_valid_id(value: str) -> bool:
    """True when ``value`` may be a session or request id: 1-128 of ``[A-Za-z0-9._:-]``."""
    return _ID_RE.fullmatch(value) is not None


def check_id(value: str, what: str = "session id") -> str:
    """Return ``value`` or raise ``INVALID_REQUEST`` naming ``what``; called before any Redis call."""
    if not isinstance(value, str) or not is_valid_id(value):
        raise errors.invalid(
            f"invalid {what} {value!r}: expected 1-{ID_MAX_LENGTH} characters from [A-Za-z0-9._:-]"
        )
    return value


_REQUEST_ID_RE = re.compile(r"[A-Za-z0-9_\-]{1,128}")


def check_request_id(value: str, what: str = "requestId") -> str:
    """Return ``value`` or raise ``INVALID_REQUEST``: 1-128 of ``[A-Za-z0-9_-]``.

    Stricter than session ids because a request id is also the RQ job id, which RQ limits so.
    """
    if not isinstance(value, str) or _REQUEST_ID_RE.fullmatch(value) is None:
        raise errors.invalid(f"invalid {what} {value!r}: expected 1-{ID_MAX_LENGTH} characters from [A-Za-z0-9_-]")
    return value


def is_valid_traceparent(value: str) -> bool:
    """A W3C Trace Context ``traceparent``: ``version-traceid-parentid-flags`` in lowercase hex,
    version not ``ff``, trace id and parent id not all zeros."""
    if not isinstance(value, str) or _TRACEPARENT_RE.fullmatch(value) is None:
        return False
    version, trace_id, parent_id, _ = value.split("-")
    return version != "ff" and trace_id != "0" * 32 and parent_id != "0" * 16


def is_forkable(last_type: str | None) -> bool:
    """The boundary rule: an empty log (``None`` or ``""``) or a last event of type ``turn/end``.

    Any ``turn/end`` reason qualifies, including reasons not invented yet. A log is never clipped
    to an older completed prefix.
    """
    return not last_type or last_type == TURN_END


def child_segments(
    parent_id: str, parent_segments: list[list[object]], parent_seed_length: int, length: int
) -> list[list[object]]:
    """The seed references of a child forked from a parent of ``length`` events.

    The parent's log is its own seed (``parent_segments``, ``parent_seed_length`` events) followed
    by its own events; the child inherits all ``length`` of them, so it gets the parent's segments
    plus the slice ``[0, length - parent_seed_length)`` of the parent's own log, when non-empty.
    """
    own = length - parent_seed_length
    if own < 0:
        raise ValueError("a session is never shorter than its seed")
    return [*parent_segments, [parent_id, 0, own]] if own else list(parent_segments)
