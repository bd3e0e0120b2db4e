"""Crash repair: close a turn that a crashed host left open, as the original harness does on reload.

``plan_repair`` is the rule (pure): for the open turn at the end of a log (its newest turn marker
is a ``turn/start``: ``rules.open_turn_start``, the same notion as the fork boundary rule, so a log
needs a repair exactly when its last event is not a valid fork boundary) it returns, in order,
an error ``tool/result`` for every ``tool/call`` without a result, a ``step/end`` if a step is
open, then ``turn/end`` with reason ``{"kind": "interrupted"}``. A balanced log needs nothing.
``repair`` appends them atomically (only if the log did not move meanwhile), with ``time``
repeating the last event's time.

Field conventions read from the events: a tool call's id is ``data.id``, ``data.callId`` or
``data.toolCallId`` (a result answers the call with the same id under the same key); the turn
number is ``data.turn`` of the ``turn/start``; the step number, ``data.step`` of ``step/start``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core import errors, rules
from ..core.registry import Registry
from ..core.store import LengthMoved
from ..core.wire import Event, NewEvent

INTERRUPTED_ERROR = {"name": "InterruptedError", "code": "interrupted"}
_ID_KEYS = ("id", "callId", "toolCallId")
_CHUNK = 256


def _call_id(data: Any) -> tuple[str, Any] | None:
    if isinstance(data, dict):
        for key in _ID_KEYS:
            if key in data:
                return key, data[key]
    return None


def plan_repair(open_turn: Sequence[Event]) -> list[NewEvent]:
    """Events that close ``open_turn`` (the log from its last ``turn/start``); [] when balanced.

    ``open_turn`` may also be a whole log or any suffix of it that holds the last ``turn/start``.
    """
    start = rules.open_turn_start([e.type for e in open_turn])
    if start is None:
        return []
    turn = open_turn[start:]
    pending: dict[Any, tuple[str, dict[str, Any]]] = {}
    step_open: Event | None = None
    for event in turn:
        if event.type == "tool/call" and (cid := _call_id(event.data)):
            pending[cid[1]] = (cid[0], event.data)
        elif event.type == "tool/result" and (rid := _call_id(event.data)):
            pending.pop(rid[1], None)
        elif event.type == "step/start":
            step_open = event
        elif event.type == "step/end":
            step_open = None
    out = [NewEvent("tool/result", {key: call_id, **({"name": data["name"]} if "name" in data else {}),
                                    "error": dict(INTERRUPTED_ERROR)})
           for call_id, (key, data) in pending.items()]
    if step_open is not None:
        step = step_open.data.get("step") if isinstance(step_open.data, dict) else None
        out.append(NewEvent("step/end", {} if step is None else {"step": step}))
    turn_no = turn[0].data.get("turn") if isinstance(turn[0].data, dict) else None
    out.append(NewEvent("turn/end", {**({} if turn_no is None else {"turn": turn_no}),
                                     "reason": {"kind": "interrupted"}}))
    return out


def repair(registry: Registry, session_id: str, *, attempts: int = 5) -> list[Event]:
    """Close the open turn of a live session; returns the events appended ([] when balanced).

    Raises ``SESSION_NOT_FOUND`` / ``SESSION_NOT_LIVE`` like an append. Retries when the host
    appended meanwhile (the repair is recomputed from the new tail).
    """
    sid = rules.check_id(session_id)
    if registry.instance(sid) is None:
        raise errors.not_found(sid)  # never created, or disposed: nothing live to repair
    for _ in range(attempts):
        length = registry.length(sid)
        tail = _open_turn(registry, sid, length)
        fix = plan_repair(tail)
        if not fix:
            return []
        try:
            return registry.append(sid, fix, expect_length=length, time_ms=tail[-1].time)
        except LengthMoved:
            continue
    # Its host keeps writing: it did not crash, and its open turn is its own to close.
    raise errors.ForkError(errors.ErrorCode.OPEN_TURN,
                           f'session "{sid}" is being written to; repair is for sessions whose host crashed')


def _open_turn(registry: Registry, sid: str, length: int) -> list[Event]:
    # Read backwards in chunks until the last turn/start: a repair never loads a whole long log.
    tail: list[Event] = []
    stop = length
    while stop > 0:
        start = max(0, stop - _CHUNK)
        chunk = registry.events(sid, start, stop)
        tail = chunk + tail
        if any(rules.is_marker(e.type) for e in chunk):  # the newest marker says open or not
            break
        stop = start
    return tail
