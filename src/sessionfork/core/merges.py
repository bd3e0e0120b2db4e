"""Merge a child into its parent, select the best of N: composed from the registry's merge steps
(``Registry.merges``).

Each operation is one spec (``specs.MergeSpec``, ``specs.SelectSpec``), built once at the edge:
here (``merge_spec``, ``select_spec``, for the library's ``merge`` and ``select``) or by the
worker's request parser (``protocol.requests.merge_spec_of``). Below it nothing unpacks it:
``check`` (the summary's JSON and size, before any Redis call), then ``run`` (a merge or a
select, by the spec's type).

The error order, each checked before anything is written: ``INVALID_REQUEST`` (the request's
shape), ``SESSION_NOT_FOUND`` (the parent, then the child or each candidate), ``SESSION_NOT_LIVE``
(the parent), ``NOT_DESCENDANT``, ``ALREADY_MERGED`` (a child a select abandoned; for a select, a
candidate merged before; then a session another merge or select still running holds),
``PRECONDITION_FAILED`` (``ifChildLength``), ``INVALID_BOUNDARY`` (the range), then in the
parent's atomic step ``ALREADY_MERGED`` (the same range of the same child merged into this parent
before, under any request id; a select's candidate noted there), ``PRECONDITION_FAILED``
(``ifParentLength``) and ``OPEN_TURN``. A request id that merged already answers its first merge
before any of these (a retry after a crash, whatever the sessions' state), for the request window
(the registry's ``request_ttl``); after it, the id is a new request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Literal, Required, TypedDict, Unpack

from ..core import errors, rules
from .merge_steps import Merged
from .registry import Registry, SessionRef
from .specs import MergeSpec, SelectSpec
from .wire import LiveHandle

MODES = ("summary", "events")
"""A merge's modes: one summary event, or the range's events."""


class MergeOptions(TypedDict, total=False):
    """A merge's options (the keywords of ``merge`` and ``select``, and of both clients' ``merge``
    and ``select``); ``mode`` is required. An option not named here is a ``TypeError``."""

    mode: Required[Literal["summary", "events"]]
    """``"summary"``: one ``session/summary`` event holding ``summary``; ``"events"``: the range's
    events, renumbered, each with ``"source": {"session", "seq"}``."""
    summary: Any
    """Mode ``summary`` only, and required there: any JSON but ``None``."""
    range: tuple[int, int] | None
    """``(fromSeq, toSeq)``, inclusive: the child's own events to merge (default: its events after
    its seed up to its last completed turn)."""
    if_parent_length: int | None
    """Merge only if the parent's log has exactly this many events (``PRECONDITION_FAILED``)."""
    if_child_length: int | None
    """Merge only if the child's (a select: the winner's) log has exactly this many events."""
    request_id: str | None
    """The idempotency key: a retried call returns the first merge and writes nothing."""


OPTION_NAMES: Final = frozenset(MergeOptions.__annotations__)


def merge(registry: Registry, parent: SessionRef, child: str, **options: Unpack[MergeOptions]) -> Merged:
    """Merge ``child``'s events into ``parent`` (an ancestor of it, at any depth) as one turn,
    atomically: ``turn/start {"trigger": "merge"}``, ``session/merge {"mergedFrom": {"session",
    "fromSeq", "toSeq"}, "mode", "forkedAt", "parentLength"}``, then mode ``summary``'s one
    ``session/summary`` event (``{"summary": summary, "summarizes": mergedFrom}``) or mode
    ``events``' range, renumbered, each event with ``"source": {"session", "seq"}``, then
    ``turn/end {"reason": "merged"}``. The child records ``mergedInto`` (``Registry.state_of``).

    Options: ``MergeOptions``. The errors and their order are the module's. With ``request_id``,
    a retried call returns the first merge and writes nothing.
    """
    return run(registry, merge_spec(parent, child, options))


def select(registry: Registry, parent: SessionRef, candidates: Sequence[str], winner: str,
           **options: Unpack[MergeOptions]) -> Merged:
    """Best of N: merge ``winner`` into ``parent`` as ``merge`` does and mark every other candidate
    abandoned, in one call with one result (``Merged.abandoned``). A candidate merged or abandoned
    before is ``ALREADY_MERGED`` (a stale selection), nothing written; a winner not among the
    candidates, or candidates not distinct, ``INVALID_REQUEST``. ``if_child_length``: the winner's."""
    return run(registry, select_spec(parent, candidates, winner, options))


def run(registry: Registry, spec: MergeSpec | SelectSpec) -> Merged:
    """The steps of a checked spec: a merge, or a select (``check`` first, then the registry's)."""
    check(registry, spec)
    if isinstance(spec, SelectSpec):
        return registry.merges.select(spec)
    return registry.merges.merge(spec)


def run_many(registry: Registry, specs: Sequence[MergeSpec | SelectSpec]) -> list[Merged | errors.ForkError]:
    """The steps of many specs at once, each step of them all in one round trip
    (``MergeSteps.run_many``): each spec's result as ``run`` gives it (its error returned, not
    raised), in order."""
    out: list[Merged | errors.ForkError | None] = []  # None: checked, to run
    checked: list[MergeSpec | SelectSpec] = []
    for spec in specs:
        try:
            check(registry, spec)
        except errors.ForkError as exc:
            out.append(exc)
            continue
        checked.append(spec)
        out.append(None)
    ran = iter(registry.merges.run_many(checked))
    return [next(ran) if result is None else result for result in out]


def check(registry: Registry, spec: MergeSpec | SelectSpec) -> None:
    """The summary's JSON and size checked as ``append`` checks an event: ``INVALID_REQUEST``
    before any Redis call."""
    m = spec.merge if isinstance(spec, SelectSpec) else spec
    if m.mode == "summary":
        registry.merges.merge_events(m, (0, 0), 0, (), 0)


def merge_spec(parent: SessionRef, child: str, options: MergeOptions, *, traceparent: str | None = None) -> MergeSpec:
    """The library's edge: a ``MergeSpec``, each option checked once (``INVALID_REQUEST``; an
    unknown option is a ``TypeError``)."""
    unknown = sorted(options.keys() - OPTION_NAMES)
    if unknown:
        raise TypeError(f"merge() got an unexpected keyword argument {unknown[0]!r}")
    rules.check_id(parent.id if isinstance(parent, LiveHandle) else parent, "parent")
    rules.check_id(child, "child")
    mode, summary = options.get("mode"), options.get("summary")
    if mode not in MODES:
        raise errors.invalid(f"invalid mode {rules.echo(mode)}: expected summary or events")
    if mode == "summary" and summary is None:
        raise errors.invalid("invalid summary: mode summary needs a summary (any JSON but null)")
    if mode == "events" and summary is not None:
        raise errors.invalid("invalid summary: only mode summary takes a summary")
    if mode == "summary":
        rules.check_json_value(summary, "summary")
    from_seq = to_seq = None
    span = options.get("range")
    if span is not None:
        if not isinstance(span, tuple | list) or len(span) != 2:
            raise errors.invalid(f"invalid range {rules.echo(span)}: expected (fromSeq, toSeq)")
        from_seq, to_seq = (_seq(v, name) for v, name in zip(span, ("range.fromSeq", "range.toSeq"), strict=True))
    request_id = options.get("request_id") or ""
    if not isinstance(request_id, str) or request_id:
        rules.check_request_id(request_id, "request id")
    return MergeSpec(parent=parent, child=child, mode=mode, summary=summary, from_seq=from_seq, to_seq=to_seq,
                     if_parent_length=_length(options.get("if_parent_length"), "ifParentLength"),
                     if_child_length=_length(options.get("if_child_length"), "ifChildLength"), request_id=request_id,
                     traceparent=traceparent)


def select_spec(parent: SessionRef, candidates: Sequence[str], winner: str, options: MergeOptions, *,
                max_candidates: int = 1024, traceparent: str | None = None) -> SelectSpec:
    """The library's edge of a select: its merge's spec (``merge_spec``) and its candidates:
    1 to ``max_candidates`` distinct ids, the winner among them (``INVALID_REQUEST``)."""
    if not isinstance(candidates, Sequence) or isinstance(candidates, str | bytes):
        raise errors.invalid(f"candidates must be a sequence of ids, got {type(candidates).__name__}")
    ids = tuple(rules.check_id(c, f"candidates[{i}]") for i, c in enumerate(candidates))
    if not 1 <= len(ids) <= max_candidates:
        raise errors.invalid(f"invalid candidates: expected 1 to {max_candidates} ids, got {len(ids)}")
    if len(set(ids)) != len(ids):
        raise errors.invalid("invalid candidates: ids must be distinct")
    rules.check_id(winner, "winner")
    if winner not in ids:
        raise errors.invalid(f"invalid winner {rules.echo(winner)}: not one of the candidates")
    return SelectSpec(merge=merge_spec(parent, winner, options, traceparent=traceparent), candidates=ids)


def _seq(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= rules.INT_MAX:
        raise errors.invalid(f"invalid {name} {rules.echo(value)}: expected an integer event seq >= 0")
    return value


def _length(value: int | None, name: str) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= rules.INT_MAX):
        raise errors.invalid(f"invalid {name} {rules.echo(value)}: expected an integer >= 0")
    return value
