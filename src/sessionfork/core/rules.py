"""Pure rules: the boundary rule, id and value validation, lineage arithmetic. No I/O, no clock."""

from __future__ import annotations

import re

from ..core import errors

TURN_END = "turn/end"
ID_MAX_LENGTH = 128
MAX_DATA_DEPTH = 100
"""Most arrays/objects an event's ``data`` (or one of its extra fields) may nest: ``{}`` is 1.

Well under the recursion limits of msgspec's and Python's JSON codecs, so every reader (the
registry, ``persist``, the harness) can read back whatever ``append`` accepted."""
INT_MIN, INT_MAX = -(2**63), 2**64 - 1
"""The integers event data may hold: what 64-bit JSON readers can read back exactly."""
_ID_RE = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


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


def is_valid_request_id(value: str) -> bool:
    """True when ``value`` may be a request id (and so an RQ job id): 1-128 of ``[A-Za-z0-9_-]``."""
    return isinstance(value, str) and _REQUEST_ID_RE.fullmatch(value) is not None


def check_request_id(value: str, what: str = "requestId") -> str:
    """Return ``value`` or raise ``INVALID_REQUEST``: 1-128 of ``[A-Za-z0-9_-]``.

    Stricter than session ids because a request id is also the RQ job id, which RQ limits so.
    """
    if not isinstance(value, str) or _REQUEST_ID_RE.fullmatch(value) is None:
        raise errors.invalid(f"invalid {what} {value!r}: expected 1-{ID_MAX_LENGTH} characters from [A-Za-z0-9_-]")
    return value


def check_text(value: object, what: str) -> str:
    """Return ``value`` or raise ``INVALID_REQUEST``: a ``str`` that is valid UTF-8 (no lone
    surrogate), so that it can be stored and read back."""
    if not isinstance(value, str) or not _is_utf8(value):
        raise errors.invalid(f"invalid {what} {value!r:.80}: expected text (a str without lone surrogates)")
    return value


def check_json_value(value: object, what: str) -> None:
    """Raise ``INVALID_REQUEST`` naming ``what`` unless ``value`` is JSON that reads back identically.

    Allowed: ``dict`` with ``str`` keys, ``list``, ``str``, ``int`` in ``[INT_MIN, INT_MAX]``,
    ``float``, ``bool``, ``None``, nested at most ``MAX_DATA_DEPTH`` deep. Anything else (bytes,
    sets, tuples, int keys, objects) is refused rather than converted. Iterative: any depth, and a
    cycle, is refused without recursion. Lone surrogates are found when the value is encoded.
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
                raise errors.invalid(f"{what} holds an integer of {bits} bits, outside the 64-bit range")
            continue
        if kind is not list and kind is not dict:
            raise errors.invalid(f"{what} holds a {kind.__name__} value, which is not JSON "
                                 "(allowed: dict with str keys, list, str, int, float, bool, None)")
        if depth >= MAX_DATA_DEPTH:
            raise errors.invalid(f"{what} is nested deeper than {MAX_DATA_DEPTH} levels")
        if kind is dict:
            for key, member in item.items():  # type: ignore[attr-defined]
                if type(key) is not str:
                    raise errors.invalid(f"{what} has a {type(key).__name__} object key; JSON keys are strings")
                stack.append((member, depth + 1))
        else:
            stack.extend((member, depth + 1) for member in item)  # type: ignore[attr-defined]


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
