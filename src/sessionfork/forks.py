"""Snapshot and fork, composed from the registry's two atomic steps.

A fork is one atomic step on the source's slot (live? instance? boundary? length) and one on the
child's slot (create if absent). Between the two nothing can go wrong for the child: the seed is
a reference to an immutable prefix of the source's log, so appends to the source after the source
step never show in the child.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import rules
from .registry import Registry, SessionRef
from .wire import Event, Header, SeedMeta


def snapshot(registry: Registry, source: SessionRef) -> tuple[list[Event], SeedMeta]:
    """The source's events at a turn boundary, and the lineage a child of them records.

    Raises ``SESSION_NOT_FOUND``, ``SESSION_NOT_LIVE`` or ``OPEN_TURN``. The events are fresh
    objects: mutating them never changes the source.
    """
    snap = registry.take_snapshot(source)
    return registry.read_snapshot(snap), snap.meta


def fork(registry: Registry, source: SessionRef, session_id: str | None = None, *,
         request_id: str = "") -> Header:
    """Create a live child of ``source`` whose log starts as the source's log; return its header.

    ``SESSION_ALREADY_EXISTS`` for a used ``session_id`` is reported before the boundary rule
    (``OPEN_TURN``). ``request_id`` makes a retried call return the child it already created.
    """
    child_ids: Sequence[str] = () if session_id is None else (rules.check_id(session_id),)
    plan = registry.prepare_fork(source, child_ids, request_id=request_id)
    if session_id is not None and session_id in plan.replayed:
        return plan.replayed[session_id]
    if plan.error is not None:
        raise plan.error
    assert plan.snapshot is not None
    return registry.create_child(plan.snapshot, session_id, request_id=request_id)
