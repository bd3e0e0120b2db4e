"""Snapshot, fork and fan-out, composed from the registry's two atomic steps.

A fork is one atomic step on the source's slot (live? instance? boundary? length) and one on each
child's slot (create if absent). Between the two nothing can go wrong for the child: the seed is
a reference to an immutable prefix of the source's log, so appends to the source after the source
step never show in the child.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..core import errors, rules
from .registry import Registry, SessionRef
from .snapshots import ForkPlan, Snapshot
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
    (``OPEN_TURN``). With ``request_id``, a retried call returns the child it already created, even
    if the source has moved on or been disposed since.
    """
    if session_id is None:
        if request_id:
            raise errors.invalid("request_id needs an explicit session_id: a generated id cannot be replayed")
        return registry.create_child(registry.take_snapshot(source))
    result = fork_many(registry, source, [session_id], request_id=request_id)
    if result.failed:
        raise result.failed[0][1]
    return result.created[0]


@dataclass(frozen=True, slots=True)
class FanOut:
    """Children created (in request order) and ids not created, each with its error."""

    created: list[Header]
    failed: list[tuple[str, errors.ForkError]]


def fork_many(registry: Registry, source: SessionRef, child_ids: Sequence[str], *,
              request_id: str = "") -> FanOut:
    """Fork ``child_ids`` from **one** snapshot: every child gets exactly the same seed.

    Ids that exist already are reported per id (``SESSION_ALREADY_EXISTS``); the others are
    created. When every id exists, that is the error, before the boundary rule. With
    ``request_id``, children that an earlier call with it created are returned as they are.
    """
    ids = [rules.check_id(c) for c in child_ids]
    if request_id:
        rules.check_request_id(request_id, "request id")
    if len(set(ids)) != len(ids):
        raise errors.invalid("child session ids must be distinct")
    return create(registry, registry.prepare_fork(source, ids, request_id=request_id), ids, request_id=request_id)


def create(registry: Registry, plan: ForkPlan, child_ids: Sequence[str], *, request_id: str = "",
           snapshot: Snapshot | None = None) -> FanOut:
    """The child step of a prepared fork: create ``child_ids`` (checked, distinct) from ``plan``.

    ``plan`` is ``registry.prepare_fork``'s for exactly these ids; ``snapshot``, when given,
    replaces its snapshot (the one a fan-out request stored first: all its children share it).
    Raises the plan's error (``SESSION_ALREADY_EXISTS`` first, when every id exists) unless
    every child is settled already (a replay needs no live source).
    """
    if plan.existing and len(plan.existing) == len(child_ids):
        raise errors.already_exists(plan.existing[0])  # before the boundary rule, as for one child
    snap = snapshot or plan.snapshot
    if snap is None:
        if plan.replayed and len(plan.replayed) + len(plan.existing) == len(child_ids):
            registry.confirm_replays(list(plan.replayed.values()))
            return _settle(child_ids, {}, plan.replayed)
        assert plan.error is not None
        raise plan.error
    todo = [c for c in child_ids if c not in plan.replayed and c not in plan.existing]
    made = dict(zip(todo, registry.create_children(snap, todo, request_id=request_id), strict=True))
    registry.confirm_replays(list(plan.replayed.values()))
    return _settle(child_ids, made, plan.replayed)


def _settle(ids: Sequence[str], made: dict[str, Header | errors.ForkError],
            replayed: dict[str, Header]) -> FanOut:
    # An id neither replayed nor made existed before this request: SESSION_ALREADY_EXISTS.
    created: list[Header] = []
    failed: list[tuple[str, errors.ForkError]] = []
    for cid in ids:
        outcome = replayed.get(cid) or made.get(cid) or errors.already_exists(cid)
        if isinstance(outcome, Header):
            created.append(outcome)
        else:
            failed.append((cid, outcome))
    return FanOut(created, failed)
