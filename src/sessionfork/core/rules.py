"""Pure rules: the boundary rules, id and value validation, lineage arithmetic. No I/O, no clock."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Final

from ..core import errors

TURN_END = "turn/end"
TURN_START = "turn/start"
SUMMARY = "session/summary"
"""The first event of a summary child (``Summary``): the summary of the events it replaced."""
ID_MAX_LENGTH = 128
MAX_DATA_DEPTH = 100
"""Most arrays/objects an event's ``data`` (or one of its extra fields) may nest: ``{}`` is 1.

Well under the recursion limits of msgspec's and Python's JSON codecs, so every reader (the
registry, ``persist``, the harness) can read back whatever ``append`` accepted."""
INT_MIN, INT_MAX = -(2**63), 2**64 - 1
"""The integers event data may hold: what 64-bit JSON readers can read back exactly."""
ECHO_LIMIT = 160
"""Most characters of an untrusted value that ``echo`` shows (an id one over the limit shows whole)."""
_ID_RE = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
_TRACEPARENT_RE = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


def echo(value: object, limit: int = ECHO_LIMIT) -> str:
    """How an untrusted value is shown in a message, a log field or a span attribute (the one place
    that decides it): quoted and escaped as Python's ``repr`` does (every control, format or other
    non-printable character and a lone surrogate as a ``\\x``/``\\u`` escape), cut to its first
    ``limit`` characters, with ``…(N chars)`` telling its length when cut. Never longer than
    ``4 * limit + 40`` characters, whatever ``value`` is."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "backslashreplace")
    if isinstance(value, str):
        shown = repr(value[:limit])
        size = len(value)
    else:  # not text: its repr, escaped the same way (ascii) and cut
        try:
            text = ascii(value)
        except Exception:  # a hostile __repr__, or nesting past the recursion limit
            text = f"<{type(value).__name__}>"
        shown, size = text[:limit], len(text)
    return shown if size <= limit else f"{shown}…({size} chars)"


def shown_id(value: object) -> str:
    """An id as logs and spans show it: a valid id as it is, anything else through ``echo``."""
    return value if isinstance(value, str) and is_valid_id(value) else echo(value)


def is_valid_id(value: str) -> bool:
    """True when ``value`` may be a session or request id: 1-128 of ``[A-Za-z0-9._:-]``."""
    return _ID_RE.fullmatch(value) is not None


def check_id(value: str, what: str = "session id") -> str:
    """Return ``value`` or raise ``INVALID_REQUEST`` naming ``what``; called before any Redis call."""
    if not isinstance(value, str) or not is_valid_id(value):
        raise errors.invalid(
            f"invalid {what} {echo(value)}: expected 1-{ID_MAX_LENGTH} characters from [A-Za-z0-9._:-]"
        )
    return value


_REQUEST_ID_RE = re.compile(r"[A-Za-z0-9_\-]{1,128}")


def check_request_id(value: str, what: str = "requestId") -> str:
    """Return ``value`` or raise ``INVALID_REQUEST``: 1-128 of ``[A-Za-z0-9_-]``.

    Stricter than session ids because a request id is also the RQ job id, which RQ limits so.
    """
    if not isinstance(value, str) or _REQUEST_ID_RE.fullmatch(value) is None:
        raise errors.invalid(f"invalid {what} {echo(value)}: expected 1-{ID_MAX_LENGTH} characters from [A-Za-z0-9_-]")
    return value


def is_valid_traceparent(value: str) -> bool:
    """A W3C Trace Context ``traceparent``: ``version-traceid-parentid-flags`` in lowercase hex,
    version not ``ff``, trace id and parent id not all zeros."""
    if not isinstance(value, str) or _TRACEPARENT_RE.fullmatch(value) is None:
        return False
    version, trace_id, parent_id, _ = value.split("-")
    return version != "ff" and trace_id != "0" * 32 and parent_id != "0" * 16


def check_text(value: object, what: str) -> str:
    """Return ``value`` or raise ``INVALID_REQUEST``: a ``str`` that is valid UTF-8 (no lone
    surrogate), so that it can be stored and read back."""
    if not isinstance(value, str) or not _is_utf8(value):
        raise errors.invalid(f"invalid {what} {echo(value)}: expected text (a str without lone surrogates)")
    return value


def check_json_value(value: object, what: str) -> None:
    """Raise ``INVALID_REQUEST`` naming ``what`` unless ``value`` is JSON that reads back identically
    (``json_problem``)."""
    problem = json_problem(value)
    if problem is not None:
        raise errors.invalid(f"{what} {problem}")


def json_problem(value: object) -> str | None:
    """What keeps ``value`` from being JSON that reads back identically (the end of an
    ``INVALID_REQUEST`` message, after what the value is), or ``None`` when it is.

    Allowed: ``dict`` with ``str`` keys, ``list``, ``str``, ``int`` in ``[INT_MIN, INT_MAX]``,
    ``float``, ``bool``, ``None``, nested at most ``MAX_DATA_DEPTH`` deep. Anything else (bytes,
    sets, tuples, int keys, objects) is refused rather than converted. Iterative: any depth, and a
    cycle, is refused without recursion. Lone surrogates are found when the value is encoded. The
    caller names the value only when there is a problem (no message built for a valid one).
    """
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        kind = type(item)
        if item is None or kind is str or kind is bool or kind is float:
            continue
        if kind is int:
            if not INT_MIN <= item <= INT_MAX:  # type: ignore[operator]  # an int, by the check above
                bits = item.bit_length()  # type: ignore[attr-defined]
                return f"holds an integer of {bits} bits, outside the 64-bit range"
            continue
        if kind is not list and kind is not dict:
            return (f"holds a {kind.__name__} value, which is not JSON "
                    "(allowed: dict with str keys, list, str, int, float, bool, None)")
        if depth >= MAX_DATA_DEPTH:
            return f"is nested deeper than {MAX_DATA_DEPTH} levels"
        if kind is dict:
            for key, member in item.items():  # type: ignore[attr-defined]
                if type(key) is not str:
                    return f"has a {type(key).__name__} object key; JSON keys are strings"
                stack.append((member, depth + 1))
        else:
            stack.extend((member, depth + 1) for member in item)  # type: ignore[attr-defined]
    return None


def _is_utf8(value: str) -> bool:
    if value.isascii():
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


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


MAX_EDITS: Final = 256
"""The most events a fork may append to a child right after its seed (``edits``)."""


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


def owner_of(segments: Sequence[Sequence[Any]], seq: int) -> tuple[str, int]:
    """The ancestor whose own log holds event ``seq`` of a seed made of (resolved) ``segments``,
    and its index in that log.

    Seqs are positions: through a summary child they differ from the owner's own seqs, so the
    event is named by its index there (``turn.lua`` maps it back).
    """
    start = 0
    for owner, lo, hi in segments:
        size = int(hi) - int(lo)
        if seq < start + size:
            return str(owner), int(lo) + seq - start
        start += size
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
