"""Pure rules: the boundary rules, id validation, lineage arithmetic. No I/O, no clock."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..core import errors

TURN_END = "turn/end"
TURN_START = "turn/start"
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


def is_marker(event_type: str) -> bool:
    """``turn/start`` and ``turn/end`` are the turn markers; every other event is inside a turn or
    between turns, whichever the newest marker before it says."""
    return event_type in (TURN_START, TURN_END)


def newest_marker(types: Sequence[str], boundary: int) -> tuple[str, int] | None:
    """``(type, seq)`` of the newest turn marker at or before ``boundary`` in a log whose event
    ``seq`` has type ``types[seq]``; ``None`` when there is none."""
    for seq in range(min(boundary, len(types) - 1), -1, -1):
        if is_marker(types[seq]):
            return types[seq], seq
    return None


def boundary_error(session_id: str, boundary: int, length: int,
                   newest: tuple[str, int] | None) -> errors.ForkError | None:
    """The boundary rule of a fork at ``boundary`` (an inclusive seq) of a log of ``length`` events.

    Valid when ``0 <= boundary < length`` and ``newest``, the newest turn marker at or before the
    boundary, is a ``turn/end`` or there is none: events after a ``turn/end`` that open no turn
    (``todo/write``, ...) are between turns. Otherwise ``INVALID_BOUNDARY`` naming the reason.
    """
    if boundary < 0:
        return errors.boundary_negative(session_id, boundary)
    if boundary >= length:
        return errors.boundary_past_end(session_id, boundary, length)
    if newest is not None and newest[0] == TURN_START:
        return errors.boundary_inside_turn(session_id, boundary, newest[1])
    return None


def check_boundary_in(session_id: str, types: Sequence[str], boundary: int) -> errors.ForkError | None:
    """``boundary_error`` for a log given whole, as the types of its events in seq order."""
    inside = 0 <= boundary < len(types)
    return boundary_error(session_id, boundary, len(types), newest_marker(types, boundary) if inside else None)


def open_turn_start(types: Sequence[str]) -> int | None:
    """The seq of the ``turn/start`` of the turn a log leaves open (its newest marker is a
    ``turn/start``), or ``None``: exactly when its last event is not a valid fork boundary."""
    newest = newest_marker(types, len(types) - 1)
    return newest[1] if newest is not None and newest[0] == TURN_START else None


def batch_markers(types: Sequence[str]) -> list[int]:
    """The turn markers of an appended batch, as ``2 * position + (1 for turn/end)``: what the
    append script turns into ``2 * seq + (1 for turn/end)`` entries of the session's turn index."""
    return [2 * i + (t == TURN_END) for i, t in enumerate(types) if is_marker(t)]


def clip_segments(segments: Sequence[Sequence[Any]], length: int) -> list[list[object]]:
    """The seed references of the first ``length`` events of a log made of ``segments``."""
    out: list[list[object]] = []
    left = length
    for owner, lo, hi in segments:
        if left <= 0:
            break
        take = min(int(hi) - int(lo), left)
        out.append([owner, lo, int(lo) + take])
        left -= take
    if left > 0:
        raise ValueError("the segments hold fewer events than asked")
    return out


def owner_of(segments: Sequence[Sequence[Any]], seq: int) -> str:
    """The ancestor whose own log holds event ``seq`` of a seed made of ``segments``.

    Seqs are absolute along a lineage: that ancestor's own event at the same seq is this event.
    """
    start = 0
    for owner, lo, hi in segments:
        start += int(hi) - int(lo)
        if seq < start:
            return str(owner)
    raise ValueError(f"seq {seq} is past the seed")


def child_segments(
    parent_id: str, parent_segments: list[list[object]], parent_seed_length: int, length: int
) -> list[list[object]]:
    """The seed references of a child whose seed is the first ``length`` events of a parent.

    The parent's log is its own seed (``parent_segments``, ``parent_seed_length`` events) followed
    by its own events. A child of ``length <= parent_seed_length`` events (a boundary inside the
    inherited seed, or exactly on its border) gets the parent's segments clipped at ``length``;
    a longer one gets them all plus the slice ``[0, length - parent_seed_length)`` of the parent's
    own log.
    """
    if length < 0:
        raise ValueError("a seed has 0 or more events")
    own = length - parent_seed_length
    if own <= 0:
        return clip_segments(parent_segments, length)
    return [*parent_segments, [parent_id, 0, own]]


def by_reference(parent_id: str, segments: list[list[object]]) -> list[list[object]]:
    """A child's seed ``segments`` (``child_segments``) as stored: O(1) whatever the lineage depth.

    Everything the child inherits from its parent's own seed becomes one reference
    ``[parent_id, -n, 0]``: "the first ``n`` events of ``parent_id``'s seed" (an entry with a
    negative start is a reference; its size is still ``stop - start``). The parent's own slice stays
    as it is. Readers resolve the reference from the parent's record, whose seed a fork first stores
    by value, so a reference is never more than one level deep.
    """
    own = [s for s in segments[-1:] if s[0] == parent_id and int(s[1]) >= 0]  # type: ignore[call-overload]
    inherited = segments[:len(segments) - len(own)]
    n = sum(int(s[2]) - int(s[1]) for s in inherited)  # type: ignore[call-overload]
    return ([[parent_id, -n, 0]] if n else []) + [list(s) for s in own]
