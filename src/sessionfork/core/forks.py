"""Snapshot, fork and fan-out, composed from the registry's two atomic steps (``Registry.forks``).

A fork is one atomic step on the source's slot (live? instance? boundary? length) and one on each
child's slot (create if absent). Between the two nothing can go wrong for the child: the seed is
a reference to an immutable prefix of the source's log, so appends to the source after the source
step never show in the child.

Every fork is one ``specs.ForkSpec``, built once at the edge: here (``make_spec``, for the library's
``fork`` and ``fork_many``) or by the worker's request parser. The steps take it whole, going
down once each: ``check`` (edits and summary against ``append``'s rules, before any Redis call),
the source step (``source_ops`` to run in a caller's round trip and ``plan`` to read their
replies, or ``plan`` alone), then the child step (``create``); ``created_by`` says what a failed
one left. The caller composes the round trips: nothing here knows who else rides in them. No
module of ``worker/`` calls the registry's fork steps itself (a layering test checks).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from ..core import errors, lua, rules
from .call_stream import CallStream, Ticket
from .fork_steps import ChildStep
from .registry import Registry, SessionRef
from .snapshots import ForkPlan, Snapshot
from .specs import ForkSpec
from .wire import Event, Header, NewEvent, SeedMeta, Summary


def snapshot(registry: Registry, source: SessionRef, *, boundary: int | None = None,
             if_length: int | None = None) -> tuple[list[Event], SeedMeta]:
    """The source's events at a turn boundary, and the lineage a child of them records.

    Without ``boundary``: the whole log, which must be empty or end with ``turn/end``. With it:
    events ``[0, boundary]``. Raises ``SESSION_NOT_FOUND``, ``SESSION_NOT_LIVE``, then
    ``PRECONDITION_FAILED`` (``if_length``: the log must have exactly that many events), then
    ``INVALID_BOUNDARY`` or ``OPEN_TURN``. The events are fresh objects: mutating them never
    changes the source.
    """
    snap = registry.forks.take_snapshot(make_spec(source, (), boundary=boundary, if_length=if_length))
    return registry.forks.read_snapshot(snap), snap.meta


def fork(registry: Registry, source: SessionRef, session_id: str | None = None, *,
         boundary: int | None = None, request_id: str = "", if_length: int | None = None,
         edits: Sequence[NewEvent] = (), summary: Summary | None = None) -> Header:
    """Create a live child of ``source`` whose log starts as the source's log; return its header.

    With ``boundary`` (an inclusive seq) the child's seed is events ``[0, boundary]`` and its
    ``seedLength`` is ``boundary + 1``: valid when ``0 <= boundary < length`` and no turn is open
    at it (``rules.boundary_error``), whatever the state of the source's last turn.
    ``if_length``: fork only if the source's log has exactly that many events, checked in the
    source's atomic step (``PRECONDITION_FAILED`` otherwise). ``edits`` (1 to ``rules.MAX_EDITS``
    events, validated as ``append`` validates; empty: none) are appended to the child right after
    its seed in the atomic step that creates it: seqs ``seedLength…``, the fork's time.
    ``summary`` (``Summary(keep_from=K, data=...)``): the child's log is one ``session/summary``
    event (``{"summary": data, "summarizes": {"session", "fromSeq": 0, "toSeq": K-1}}``) then the
    source's events ``K…`` (to the boundary, or the whole log) renumbered from seq 1, by
    reference; its header has ``keptFrom: K`` and ``seedLength`` 1 + the kept events. ``K`` must
    be in ``[1, E+1]`` with ``K-1`` between turns (``INVALID_BOUNDARY`` otherwise, after the
    boundary rules). Errors in this order: ``SESSION_NOT_FOUND`` / ``SESSION_NOT_LIVE``, ``PRECONDITION_FAILED``,
    ``SESSION_ALREADY_EXISTS`` for a used ``session_id``, then ``INVALID_BOUNDARY`` or
    ``OPEN_TURN``. With ``request_id``, a retried call returns the child it already created (its
    edits once), even if the source has moved on or been disposed since.
    """
    if not isinstance(request_id, str):
        raise errors.invalid(f"invalid request id {rules.echo(request_id)}: expected a str")
    if session_id is None and request_id:
        raise errors.invalid("request_id needs an explicit session_id: a generated id cannot be replayed")
    child = registry.state.new_id() if session_id is None else session_id
    result = fork_many(registry, source, [child], request_id=request_id, boundary=boundary,
                       if_length=if_length, edits=edits, summary=summary)
    if result.failed:
        raise result.failed[0][1]
    return result.created[0]


_SOURCE_ERRORS = (errors.ErrorCode.SESSION_NOT_FOUND, errors.ErrorCode.SESSION_NOT_LIVE)
_BEFORE_IDS = (*_SOURCE_ERRORS, errors.ErrorCode.PRECONDITION_FAILED)
"""The source step's errors that come before ``SESSION_ALREADY_EXISTS`` (the error order)."""


@dataclass(frozen=True, slots=True)
class FanOut:
    """Children created (in request order) and ids not created, each with its error."""

    created: list[Header]
    """The children created, in request order."""
    failed: list[tuple[str, errors.ForkError]]
    """The ids not created, each with its error (``SESSION_ALREADY_EXISTS``, ``SESSION_NOT_FOUND``)."""


def fork_many(registry: Registry, source: SessionRef, child_ids: Sequence[str], *,
              request_id: str = "", boundary: int | None = None, if_length: int | None = None,
              edits: Sequence[NewEvent] | Mapping[str, Sequence[NewEvent]] = (),
              summary: Summary | None = None) -> FanOut:
    """Fork ``child_ids`` from **one** snapshot: every child gets exactly the same seed.

    Ids that exist already are reported per id (``SESSION_ALREADY_EXISTS``); the others are
    created. When every id exists, that is the error (after ``SESSION_NOT_FOUND`` and
    ``SESSION_NOT_LIVE``, before the boundary rules). With ``request_id``, children that an
    earlier call with it created are returned as they are. ``boundary`` as for ``fork``: every
    child's seed is events ``[0, boundary]``. A source deleted while the children are created:
    those created before stay and are returned, the rest fail ``SESSION_NOT_FOUND`` (``create``).
    ``if_length`` as for ``fork``; ``edits``: the same events for every child, or a mapping from
    child id to that child's own (a variant fan-out: one snapshot, each child its own edits).
    ``summary`` as for ``fork``: every child a summary child of the same snapshot.
    """
    spec = make_spec(source, child_ids, request_id=request_id, boundary=boundary, if_length=if_length, edits=edits,
                     summary=summary)
    check(registry, spec)
    return create(registry, spec, plan(registry, spec))


def make_spec(source: SessionRef, child_ids: Sequence[str], *, request_id: str = "", boundary: int | None = None,
         if_length: int | None = None, edits: Sequence[NewEvent] | Mapping[str, Sequence[NewEvent]] = (),
         summary: Summary | None = None) -> ForkSpec:
    """The library's edge: a ``ForkSpec`` from ``fork_many``'s arguments, each checked once
    (``INVALID_REQUEST``; a boundary's range is the boundary rule's, ``INVALID_BOUNDARY``, once
    the source is read). Edits' events are checked against ``append``'s rules by ``check``."""
    if not isinstance(child_ids, Sequence) or isinstance(child_ids, str | bytes):
        raise errors.invalid(f"child ids must be a sequence of ids, got {type(child_ids).__name__}")
    ids = tuple(rules.check_id(c) for c in child_ids)
    if not isinstance(request_id, str) or request_id:
        rules.check_request_id(request_id, "request id")
    if len(set(ids)) != len(ids):
        raise errors.invalid("child session ids must be distinct")
    if isinstance(edits, Mapping):
        stray = sorted(set(edits) - set(ids), key=str)
        if stray:
            raise errors.invalid(f"edits name {rules.echo(stray[0])}, which is not one of the child ids")
        own = tuple(tuple(_edit_list(edits.get(cid, ()))) for cid in ids) if edits else ()
    else:
        same = tuple(_edit_list(edits))
        own = tuple(same for _ in ids) if same else ()
    if summary is not None and not isinstance(summary, Summary):
        raise errors.invalid(f"summary must be a sessionfork.Summary, got {type(summary).__name__}")
    return ForkSpec(source=source, child_ids=ids, request_id=request_id, boundary=_checked(boundary),
                    if_length=_guard(if_length), edits=own, summary=summary)


def check(registry: Registry, spec: ForkSpec) -> None:
    """The spec's edits and summary checked as ``append`` checks events (``check_edits``,
    ``check_summary``): ``INVALID_REQUEST`` before any Redis call. Each distinct edit list once."""
    seen: set[int] = set()
    for events in spec.edits:
        if id(events) not in seen:
            seen.add(id(events))
            check_edits(registry, events)
    check_summary(registry, spec.summary)


def source_ops(registry: Registry, spec: ForkSpec, on: Any) -> list[lua.Op] | None:
    """The source step's commands, for a caller to run in its own round trip on the server
    ``on`` (``lua.run``) and hand their replies to ``plan``; ``None`` when the registry cannot
    run them there (another server, or a cluster: ``plan`` then runs the step itself)."""
    if on is not registry.redis or registry.forks.is_cluster:
        return None
    return registry.forks.look_ops(spec)


def plan(registry: Registry, spec: ForkSpec, replies: Sequence[Any] | None = None) -> ForkPlan:
    """The source step's plan: read from ``replies`` (``source_ops``'s), or run now (``None``).
    The step only reads, so a caller that learns the request is not new drops the plan."""
    if replies is None:
        return registry.forks.prepare_fork(spec)
    return registry.forks.plan_of(spec, replies)


def created_by(registry: Registry, spec: ForkSpec) -> list[str]:
    """Those of the spec's children that its request id created, sorted (for an ``INTERNAL``
    outcome: no hidden partial state)."""
    return sorted(registry.forks.prepare_fork(spec).replayed)


def create(registry: Registry, spec: ForkSpec, planned: ForkPlan, snapshot: Snapshot | None = None) -> FanOut:
    """The child step of a planned fork: create the spec's children from ``planned`` (its source
    step's, for exactly these ids).

    ``snapshot``, when given, replaces the plan's (the one a fan-out request stored first: all
    its children share it, so a retry after a crash creates the rest from the same seed).
    Raises the plan's error unless this request created a child already (a replay needs no live
    source); when every id exists, ``SESSION_ALREADY_EXISTS`` comes after the source's own
    errors and before the boundary rules. No hidden partial state: when the source is deleted
    while (or before a replay of) a fan-out that created some of its children, those children are
    returned in ``created`` and every other id is in ``failed`` with ``SESSION_NOT_FOUND``; the
    source's error is raised only when this request created no child at all. The spec's edits
    are written in each child's create step; its summary makes each a summary child
    (``INVALID_BOUNDARY`` for a ``keepFrom`` outside the rule, before any child).
    """
    start = _begin(registry, spec, planned, snapshot)
    if start.snap is None:
        return _finish(registry, start, start.made)
    return _finish(registry, start, dict(zip(start.todo, registry.forks.create_children(start.snap, spec, start.todo),
                                             strict=True)))


def send_many(registry: Registry, planned: Sequence[tuple[ForkSpec, ForkPlan, Snapshot | None]]) -> Sent:
    """``create(registry, spec, plan, snapshot)`` of each of ``planned`` (a batch of requests),
    begun: ``Sent.collect`` gives each fork's result, or the error ``create`` raises for it, in its
    place. On one server the child steps stream (``ForkSteps.stream``): each fork's calls are sent
    as soon as they are built, so the server creates one fork's children while the next fork's
    calls are built, and ``Sent.collect`` reads one fork's replies while the server runs the next;
    the caller may do other work between the two (a worker begins its next batch). Else (a
    cluster, replicas to wait for) all of them run now, in one round trip
    (``ForkSteps.run_children``), and ``collect`` only hands their results. Whoever does not
    ``collect`` a ``Sent`` closes it (``close``: its replies are never read)."""
    stream = registry.forks.stream()
    if stream is None:
        return Sent(registry, None, _create_together(registry, planned))
    try:
        # Each fork's calls sent as soon as its step is built (the generator builds the next after).
        begun: list[tuple[_Start, ChildStep | None, Ticket | None] | errors.ForkError] = [
            item if isinstance(item, errors.ForkError) else
            (*item, None if item[1] is None else stream.send(item[1].calls))
            for item in _stepped(registry, planned)]
    except BaseException:
        stream.close()
        raise
    return Sent(registry, stream, begun)


class Sent:
    """A batch's child steps sent (``send_many``): ``collect`` reads their replies, ``close``
    gives up on them (the connection dropped, never handed back with replies unread)."""

    def __init__(self, registry: Registry, stream: CallStream | None,
                 begun: Sequence[tuple[_Start, ChildStep | None, Ticket | None] | FanOut | errors.ForkError]) -> None:
        self._registry, self._stream, self._begun = registry, stream, begun

    def collect(self) -> list[FanOut | errors.ForkError]:
        """Each fork's result, or its error, in the batch's order (once; the connection given back)."""
        stream, registry = self._stream, self._registry
        if stream is None:
            return [item for item in self._begun if isinstance(item, FanOut | errors.ForkError)]
        with stream:
            out: list[FanOut | errors.ForkError] = []
            for item in self._begun:  # in order: each fork's replies read while the server runs the later ones
                if isinstance(item, FanOut | errors.ForkError):
                    out.append(item)
                    continue
                start, step, ticket = item
                replies = None if step is None or ticket is None else registry.forks.flat(step, stream.replies(ticket))
                out.append(_made(registry, start, step, replies))
            return out

    def close(self) -> None:
        """Give up on the replies not read (a failed batch): the connection is dropped."""
        if self._stream is not None:
            self._stream.close()


def _create_together(registry: Registry,
                     planned: Sequence[tuple[ForkSpec, ForkPlan, Snapshot | None]]) -> list[FanOut | errors.ForkError]:
    """``send_many`` with every child step in one round trip (``ForkSteps.run_children``)."""
    starts = list(_stepped(registry, planned))
    steps = [s[1] for s in starts if not isinstance(s, errors.ForkError) and s[1] is not None]
    replies = iter(registry.forks.run_children(steps) if steps else ())
    return [begun if isinstance(begun, errors.ForkError) else
            _made(registry, begun[0], begun[1], None if begun[1] is None else next(replies))
            for begun in starts]


def _stepped(registry: Registry, planned: Sequence[tuple[ForkSpec, ForkPlan, Snapshot | None]]
             ) -> Iterator[tuple[_Start, ChildStep | None] | errors.ForkError]:
    """Each of ``planned`` begun (``_begin``) with its child step built (none for a replay whose
    source cannot be forked now), or the error ``create`` raises for it: one at a time, so that a
    caller may send each step before the next is built."""
    for spec, plan, snapshot in planned:
        try:
            start = _begin(registry, spec, plan, snapshot)
            yield start, None if start.snap is None else registry.forks.child_step(start.snap, spec, start.todo)
        except errors.ForkError as exc:
            yield exc


def _made(registry: Registry, start: _Start, step: ChildStep | None,
          replies: list[Any] | None) -> FanOut | errors.ForkError:
    """A fork's result from its child step's ``replies`` (one per child), or the error of it."""
    try:
        made = start.made if step is None or replies is None else \
            dict(zip(start.todo, registry.forks.children_of(step, replies), strict=True))
        return _finish(registry, start, made)
    except errors.ForkError as exc:
        return exc


@dataclass(frozen=True, slots=True)
class _Start:
    """A planned fork's children to create (``todo``) from ``snap``, or, for a replay whose source
    cannot be forked now (``snap`` None), the error of each (``made``)."""

    spec: ForkSpec
    planned: ForkPlan
    todo: list[str]
    snap: Snapshot | None
    made: dict[str, Header | errors.ForkError]


def _begin(registry: Registry, spec: ForkSpec, planned: ForkPlan, snapshot: Snapshot | None) -> _Start:
    """``create`` up to its child step; raises what ``create`` raises before it."""
    child_ids = spec.child_ids
    if planned.existing and len(planned.existing) == len(child_ids):
        # Error order: the source's own state and the guard, then the child id, then the boundary rules.
        if planned.error is not None and planned.error.code in _BEFORE_IDS:
            raise planned.error
        raise errors.already_exists(planned.existing[0])
    snap = snapshot or planned.snapshot
    todo = [c for c in child_ids if c not in planned.replayed and c not in planned.existing]
    if snap is None:
        error = planned.error
        assert error is not None  # a plan holds its snapshot or its error
        if not planned.replayed:
            raise error
        # A replay whose source cannot be forked now: its children stay, reported with the error
        # in place of each child it did not create (no hidden partial state).
        return _Start(spec, planned, todo, None, dict.fromkeys(todo, error))
    return _Start(spec, planned, todo, snap, {})


def _finish(registry: Registry, start: _Start, made: dict[str, Header | errors.ForkError]) -> FanOut:
    """``create`` from its children's results (``made``) on."""
    planned = start.planned
    lost = [e for e in made.values() if isinstance(e, errors.ForkError) and e.code in _SOURCE_ERRORS]
    if lost and not planned.replayed and not any(isinstance(h, Header) for h in made.values()):
        raise lost[0]  # nothing of this request exists: the source's error is the outcome
    registry.forks.confirm_replays(list(planned.replayed.values()))
    return _settle(start.spec.child_ids, made, planned.replayed)


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


def check_edits(registry: Registry, edits: Sequence[NewEvent]) -> Sequence[NewEvent]:
    """``edits`` (empty: none) validated exactly as ``append`` validates its events, and their
    count (at most ``rules.MAX_EDITS``): ``INVALID_REQUEST`` before any Redis call."""
    if not isinstance(edits, Sequence) or isinstance(edits, str | bytes):
        raise errors.invalid(f"edits must be a sequence of NewEvent, got {type(edits).__name__}")
    if len(edits) > rules.MAX_EDITS:
        raise errors.invalid(f"invalid edits: expected 1 to {rules.MAX_EDITS} events, got {len(edits)}")
    registry.encode_events(edits, 0)
    return edits


def check_summary(registry: Registry, summary: Summary | None) -> None:
    """``summary`` (``None``: none) checked before any Redis call: a ``Summary`` whose ``keep_from``
    is an integer (its range is the summary rule's: ``INVALID_BOUNDARY``) and whose ``data`` is
    JSON that reads back identically, within the event size limit (``INVALID_REQUEST``)."""
    if summary is None:
        return
    if not isinstance(summary, Summary):
        raise errors.invalid(f"summary must be a sessionfork.Summary, got {type(summary).__name__}")
    k = summary.keep_from
    if isinstance(k, bool) or not isinstance(k, int):
        raise errors.invalid(f"invalid keepFrom {rules.echo(k)}: expected an integer event seq")
    # The data is checked in the event the child would get. A keepFrom no log reaches (its toSeq
    # K-1 outside the 64-bit range) is the summary rule's INVALID_BOUNDARY once the source is read,
    # as a boundary's is: never an INVALID_REQUEST about the summary event's own toSeq. Clamped,
    # the check still sees a toSeq at least as long as any real one.
    clamped = min(max(k, 1), rules.INT_MAX + 1)
    registry.summary_event("x", summary if clamped == k else msgspec.structs.replace(summary, keep_from=clamped), 0)


def _guard(if_length: int | None) -> int | None:
    if if_length is not None and (isinstance(if_length, bool) or not isinstance(if_length, int) or if_length < 0):
        raise errors.invalid(f"invalid ifLength {rules.echo(if_length)}: expected an integer >= 0")
    return if_length


def _checked(boundary: int | None) -> int | None:
    # bool is an int to Python, never a seq; the range is the boundary rule's (INVALID_BOUNDARY).
    if boundary is not None and (isinstance(boundary, bool) or not isinstance(boundary, int)):
        raise errors.invalid(f"invalid boundary {rules.echo(boundary)}: expected an integer event seq")
    return boundary


def _edit_list(edits: Sequence[NewEvent]) -> Sequence[NewEvent]:
    if not isinstance(edits, Sequence) or isinstance(edits, str | bytes):
        raise errors.invalid(f"edits must be a sequence of NewEvent, got {type(edits).__name__}")
    return edits
