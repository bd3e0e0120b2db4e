"""Snapshot, fork and fan-out, composed from the registry's two atomic steps.

A fork is one atomic step on the source's slot (live? instance? boundary? length) and one on each
child's slot (create if absent). Between the two nothing can go wrong for the child: the seed is
a reference to an immutable prefix of the source's log, so appends to the source after the source
step never show in the child.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
    if not isinstance(request_id, str):
        raise errors.invalid(f"invalid request id {request_id!r:.80}: expected a str")
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
              request_id: str = "", stored: Snapshot | None = None,
              remember: Callable[[Snapshot], Snapshot] | None = None, plan: ForkPlan | None = None) -> FanOut:
    """Fork ``child_ids`` from **one** snapshot: every child gets exactly the same seed.

    Ids that exist already are reported per id (``SESSION_ALREADY_EXISTS``); the others are
    created. When every id exists, that is the error, before the boundary rule. ``stored`` is the
    snapshot a crashed attempt of the same request took (its children must share it);
    ``remember`` is called with a new snapshot before any child exists, to keep it for a retry; it
    returns the snapshot to use (the one another attempt of the same request stored first).
    ``plan`` is the result of ``registry.prepare_fork`` for exactly these ids, when the caller ran
    it already (pipelined with other work).
    """
    if not isinstance(child_ids, Sequence) or isinstance(child_ids, str | bytes):
        raise errors.invalid(f"child ids must be a sequence of ids, got {type(child_ids).__name__}")
    ids = [rules.check_id(c) for c in child_ids]
    if not isinstance(request_id, str) or request_id:
        rules.check_request_id(request_id, "request id")
    if len(set(ids)) != len(ids):
        raise errors.invalid("child session ids must be distinct")
    if plan is None:
        plan = registry.prepare_fork(source, ids, request_id=request_id)
    if plan.existing and len(plan.existing) == len(ids):
        raise errors.already_exists(plan.existing[0])  # before the boundary rule, as for one child
    snap = stored or plan.snapshot
    if snap is None:
        if plan.replayed and len(plan.replayed) + len(plan.existing) == len(ids):
            # Every child is settled already: a replay needs no live source.
            registry.confirm_replays(list(plan.replayed.values()))
            return _settle(ids, {}, plan.replayed)
        assert plan.error is not None
        raise plan.error
    todo = [c for c in ids if c not in plan.replayed and c not in plan.existing]
    if stored is None and remember is not None and todo:
        snap = remember(snap)
    made = dict(zip(todo, registry.create_children(snap, todo, request_id=request_id), strict=True))
    registry.confirm_replays(list(plan.replayed.values()))
    return _settle(ids, made, plan.replayed)


def _settle(ids: list[str], made: dict[str, Header | errors.ForkError],
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
