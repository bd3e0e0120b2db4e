"""``Trip``: one round trip of a worker's, composed by the worker.

A batch's first trip carries the worker's RQ start bookkeeping of its jobs (a ``Part``: commands
of its own, added to the pipeline and answered once), the claims of the request ids, and, when
the registry lives on the same single server, the core's source steps (``forks.source_ops``): three
layers' commands in one pipelined round trip, composed here and nowhere below. The core's steps
and the claim describe themselves as ops (``core.lua.Op``); the trip runs them with ``lua.add``
and ``lua.settle`` (a NOSCRIPT re-runs only the ops that got it, never the parts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ..core import lua


class Part(Protocol):
    """Commands another part of the worker sends at the head of a trip (the RQ start bookkeeping,
    ``rq_seam.riders.Started``): ``add`` puts them in the pipeline, ``done`` gets their replies
    (and raises for an error reply)."""

    def add(self, pipe: Any) -> None: ...

    def done(self, replies: list[Any]) -> None: ...


class Trip:
    """Parts, then groups of ops, pipelined on ``redis`` in one round trip (``run``)."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self._parts: list[Part] = []
        self._ops: list[lua.Op] = []
        self._groups: list[list[int]] = []  # each group's ops, as indexes into ``_ops``
        self._read: dict[tuple[Any, ...], int] = {}  # a read's words -> its index in ``_ops``

    def add(self, part: Part) -> None:
        """Send ``part``'s commands at the head of the trip."""
        self._parts.append(part)

    def ops(self, ops: Sequence[lua.Op]) -> int:
        """Send ``ops`` in the trip; returns the group's number, for ``results``."""
        start = len(self._ops)
        self._ops.extend(ops)
        self._groups.append(list(range(start, len(self._ops))))
        return len(self._groups) - 1

    def reads(self, ops: Sequence[lua.Op]) -> int:
        """``ops`` as ``ops`` does, when they only read keys that nothing else in the trip writes
        (the caller's promise: a batch's source steps, beside claims and RQ's bookkeeping): an op
        the same as one that ``reads`` sent already in this trip is not sent again, its reply is
        shared (a batch of forks of one source reads it once)."""
        group: list[int] = []
        for op in ops:
            words = _words(op)
            at = self._read.get(words)
            if at is None:
                at = self._read[words] = len(self._ops)
                self._ops.append(op)
            group.append(at)
        self._groups.append(group)
        return len(self._groups) - 1

    def run(self) -> list[list[Any]]:
        """Run the trip: each part's replies go to its ``done`` (in order, before any op's result
        is read); returns each group's results, in the order the groups were added. An error
        reply of an op raises (``lua.settle``)."""
        pipe = self.redis.pipeline(transaction=False)
        sizes = []
        for part in self._parts:
            before = len(pipe)
            part.add(pipe)
            sizes.append(len(pipe) - before)
        lua.add(pipe, self._ops)
        out = list(pipe.execute(raise_on_error=False))
        at = 0
        for part, size in zip(self._parts, sizes, strict=True):
            part.done(out[at:at + size])
            at += size
        results = lua.settle(self.redis, self._ops, out[at:])
        return [[results[i] for i in group] for group in self._groups]


def _words(op: lua.Op) -> tuple[Any, ...]:
    """An op as the words the server runs: the script's digest, its keys and arguments."""
    if isinstance(op[0], str):
        return tuple(op)
    script, call_keys, args = op
    return script.sha, tuple(call_keys), tuple(args)
