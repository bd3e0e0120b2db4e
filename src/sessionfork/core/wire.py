"""Every type that crosses Redis, the queue or the CLI, as msgspec Structs; decoders built once.

Wire names are camelCase (``createdAt``, ``parentSession``); optional keys are absent, never
null. Schema growth: new fields go last and carry a default. Requests reject unknown fields;
events keep them (``Event.extra``) so that every field of the original harness round-trips.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Final, Literal, TypeAlias

import msgspec
from msgspec import UNSET, UnsetType

from ..core import errors, rules

HEADER_VERSION: Final = 0
_EVENT_KEYS: Final = frozenset({"type", "seq", "time", "data"})


class Header(msgspec.Struct, rename="camel", frozen=True):
    """A session header: ``{version, id, createdAt, cwd?, parentSession?, seedLength?, keptFrom?}``."""

    version: int
    """The header format's version (``HEADER_VERSION``, 0)."""
    id: str
    """The session's id."""
    created_at: int
    """When it was created, Unix epoch milliseconds."""
    cwd: str | UnsetType = UNSET
    """The agent's working directory, when it was given (a child copies its source's)."""
    parent_session: str | UnsetType = UNSET
    """A child only: the id of the session it was forked from."""
    seed_length: int | UnsetType = UNSET
    """A child only: the number of events it started with (its seed); its next seq."""
    kept_from: int | UnsetType = UNSET
    """A summary child only: the seq of the source's first kept event (its seq 1 here)."""


class LiveHandle(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A live incarnation of a session: its id and the instance token it was created with."""

    id: str
    """The session's id."""
    instance: str
    """The token of this live incarnation (``Registry.instance`` answers the current one)."""


def ref_id(ref: str | LiveHandle) -> str:
    """The session id of a reference: a plain id, or a live handle's id."""
    return ref.id if isinstance(ref, LiveHandle) else ref


class NewEvent(msgspec.Struct, frozen=True):
    """An event to append; the registry assigns ``seq`` and ``time``.

    ``extra`` holds fields beyond ``type``/``data`` (``sourceEventSeqs``, ``surfaceOp``, ...); they
    are stored and returned verbatim.
    """

    type: str
    """The event's type (``turn/start``, ``user/message``, ...): a non-empty string."""
    data: Any = None
    """Its payload: JSON that reads back identically (``None`` by default)."""
    extra: dict[str, Any] = msgspec.field(default_factory=dict)
    """Fields beyond ``type``, ``seq``, ``time`` and ``data``, stored and returned verbatim."""

    def __post_init__(self) -> None:
        if not isinstance(self.type, str) or not self.type:
            raise errors.invalid("event type must be a non-empty string")
        extra = self.extra
        # Most events have no extra fields: an empty dict is checked no further.
        if type(extra) is not dict or (extra and any(type(k) is not str for k in extra)):
            raise errors.invalid("event extra fields must be a dict with str keys")
        if extra and (clash := _EVENT_KEYS.intersection(extra)):
            raise errors.invalid(f"event extra fields may not redefine {sorted(clash)}")


class Event(msgspec.Struct):
    """A logged event ``{type, seq, time, data, ...extra}``; ``time`` is Unix epoch milliseconds."""

    type: str
    """The event's type."""
    seq: int
    """Its position in the session's log, from 0 (seed included), contiguous."""
    time: int
    """When it was appended, Unix epoch milliseconds."""
    data: Any = None
    """Its payload, as appended."""
    extra: dict[str, Any] = msgspec.field(default_factory=dict)
    """Its other fields, as appended."""


class MergedInto(msgspec.Struct, rename="camel", frozen=True, kw_only=True):
    """Where a session's latest merge landed: the ancestor, the merge's first seq there, the request."""

    session: str
    """The ancestor merged into."""
    seq: int
    """The seq of the merge's ``turn/start`` in it."""
    request_id: str
    """The request that merged it (``""``: a library call without one)."""


USAGE_MAX: Final = 2**53 - 1
"""The largest value of one usage counter an append may carry (JSON's exact integers)."""


class Usage(msgspec.Struct, rename="camel", frozen=True, kw_only=True):
    """What an append (or a session, or a subtree) consumed: token counts and cost, non-negative
    integers (``costMicros``: millionths of the caller's currency unit). Checked when built:
    anything but an integer in ``0..USAGE_MAX`` is ``INVALID_REQUEST``."""

    input_tokens: int = 0
    """Prompt tokens."""
    output_tokens: int = 0
    """Completion tokens."""
    cache_read_tokens: int = 0
    """Prompt tokens read from a cache."""
    cache_write_tokens: int = 0
    """Prompt tokens written to a cache."""
    cost_micros: int = 0
    """Cost, in millionths of a currency unit."""

    def __post_init__(self) -> None:
        for name in USAGE_FIELDS:
            value = getattr(self, name)
            if type(value) is not int or not 0 <= value <= USAGE_MAX:
                raise errors.invalid(f"usage {_camel(name)} must be an integer from 0 to {USAGE_MAX}, "
                                     f"got {rules.echo(value)}")

    def __add__(self, other: Usage) -> Usage:
        return Usage(**{n: min(getattr(self, n) + getattr(other, n), USAGE_MAX) for n in USAGE_FIELDS})

    def values(self) -> tuple[int, ...]:
        """The counters in ``USAGE_FIELDS`` order."""
        return tuple(getattr(self, n) for n in USAGE_FIELDS)


USAGE_FIELDS: Final = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "cost_micros")
"""``Usage``'s counters, in the order the append script takes and the record keeps them."""


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)


class SessionUsage(msgspec.Struct, rename="camel", frozen=True, kw_only=True):
    """A session's usage: its own (what its appends carried; its seed's not counted again) and its
    subtree's (itself and every descendant, merged, abandoned, disposed and deleted ones included)."""

    id: str
    """The session's id."""
    own: Usage
    """What the session's own appends carried."""
    subtree: Usage
    """``own`` plus every descendant's own usage."""


SessionStateName: TypeAlias = Literal["live", "merged", "abandoned", "disposed", "deleted"]


class SessionState(msgspec.Struct, rename="camel", frozen=True, kw_only=True, omit_defaults=True):
    """Where a session stands: ``live``, ``merged`` (into an ancestor: ``mergedInto``; still live
    until its branch TTL disposes it), ``abandoned`` (by a select: ``abandonedBy``), ``disposed``
    or ``deleted`` (a tombstone its descendants keep). The first that holds, in this order:
    deleted, disposed, abandoned, merged, live."""

    id: str
    """The session's id."""
    state: SessionStateName
    """Its state."""
    merged_into: MergedInto | UnsetType = UNSET
    """Its latest merge (kept once disposed)."""
    abandoned_by: str | UnsetType = UNSET
    """The select request that abandoned it."""


class SessionView(msgspec.Struct, rename="camel", frozen=True, kw_only=True):
    """What ``sessionfork session show`` prints: a session's header, state, lengths and usage."""

    header: Header
    """Its header."""
    state: SessionState
    """Where it stands."""
    length: int
    """Events in its log, seed included."""
    seed_length: int
    """Events inherited from its ancestors (0 for a root)."""
    own_length: int
    """Its own events (``length - seedLength``)."""
    last_turn_end: int | None
    """The seq of its newest ``turn/end``, seed included (``null``: none)."""
    children: list[str]
    """The sessions forked from it, sorted."""
    usage: SessionUsage
    """Its own and its subtree's usage."""


class SeedMeta(msgspec.Struct, rename="camel", frozen=True):
    """Lineage of a snapshot: what a child forked from it records in its header."""

    parent_session: str
    """The snapshot's source: a child's ``parentSession``."""
    seed_length: int
    """The number of events in the snapshot: a child's ``seedLength``."""
    cwd: str | UnsetType = UNSET
    """The source's ``cwd``, when it has one."""


_json = msgspec.json.Encoder()
_body_decoder = msgspec.json.Decoder(dict[str, Any])
_header_decoder = msgspec.json.Decoder(Header)


def encode_stored_event(event: NewEvent, time_ms: int, *, checked: bool = False) -> bytes:
    """The bytes kept in a session log: the event without ``seq`` (it is the position).

    ``INVALID_REQUEST`` when its data or an extra field is not JSON that reads back identically
    (``rules.json_problem``: no bytes, sets, tuples, non-str keys; at most
    ``rules.MAX_DATA_DEPTH`` levels deep) or holds a lone surrogate. Checked before any Redis call.
    ``checked``: the event was encoded (so checked) before, at another time: its values are not
    walked again (what the encoder refuses still raises).
    """
    if not isinstance(event, NewEvent):
        raise errors.invalid(f"events must be NewEvent objects, got {type(event).__name__}")
    if not checked:
        _check_values(event)
    try:
        return _json.encode({"type": event.type, "time": time_ms, "data": event.data, **event.extra})
    except UnicodeEncodeError:
        raise errors.invalid(f"event {rules.echo(event.type)} holds a lone surrogate: text must be valid "
                             "UTF-8") from None
    except (TypeError, ValueError, RecursionError, msgspec.EncodeError) as exc:
        raise errors.invalid(f"event {rules.echo(event.type)} is not JSON: {exc}") from None


def _check_values(event: NewEvent) -> None:
    """``INVALID_REQUEST`` naming the event's data or extra field that is not JSON that reads back
    identically (``rules.json_problem``; the message built only then)."""
    if (problem := rules.json_problem(event.data)) is not None:
        raise errors.invalid(f"event {rules.echo(event.type)} data {problem}")
    for name, value in event.extra.items():
        if (problem := rules.json_problem(value)) is not None:
            raise errors.invalid(f"event {rules.echo(event.type)} field {rules.echo(name)} {problem}")


def decode_stored_event(raw: bytes, seq: int) -> Event:
    """The event stored at ``seq``. One nested too deep to read (written around ``append``) is a
    ``ForkError`` (``INTERNAL``), never a ``RecursionError``."""
    try:
        body = _body_decoder.decode(raw)
    except RecursionError:
        raise errors.ForkError(errors.ErrorCode.INTERNAL,
                               f"event {seq} is nested too deep to read (over {rules.MAX_DATA_DEPTH} levels)") from None
    kind = body.pop("type")
    time_ms = body.pop("time")
    data = body.pop("data", None)
    body.pop("seq", None)
    return Event(kind, seq, time_ms, data, body)


def event_to_builtins(event: Event) -> dict[str, Any]:
    """The harness's JSON shape of an event: ``{type, seq, time, data, ...extra}``."""
    return {"type": event.type, "seq": event.seq, "time": event.time, "data": event.data, **event.extra}


def encode_event(event: Event) -> bytes:
    return _json.encode(event_to_builtins(event))


def text(value: bytes | str) -> str:
    """A Redis reply as ``str`` (clients are created without ``decode_responses``)."""
    return value.decode() if isinstance(value, bytes) else value


def encode(value: Any) -> bytes:
    """JSON-encode any wire Struct."""
    return _json.encode(value)


def encode_header(header: Header) -> bytes:
    return _json.encode(header)


def decode_header(raw: bytes | str) -> Header:
    return _header_decoder.decode(raw)


# -- requests and replies (the queue's wire format) ---------------------------------------------


class Variant(msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """One child of a variant fan-out: its id (generated when absent) and its own edits."""

    session_id: str | UnsetType = UNSET
    edits: list[dict[str, Any]] | UnsetType = UNSET


class Summary(msgspec.Struct, rename="camel", forbid_unknown_fields=True, kw_only=True, frozen=True):
    """A summary seed: the child's log is one ``session/summary`` event holding ``data`` (any
    JSON), then the source's events ``keep_from…`` renumbered from seq 1."""

    keep_from: int
    """The seq of the source's first kept event (``keepFrom``): events before it are summarised."""
    data: Any = None
    """The summary itself, any JSON: the ``summary`` of the child's ``session/summary`` event."""


class ForkRequest(msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True,
                  kw_only=True):
    """A fork request as schedulers enqueue it. Unknown fields are rejected.

    At most one of ``session_id`` (one child, caller's id), ``session_ids`` (fan-out, caller's ids)
    and ``count`` (fan-out, generated ids); none of them means one child with a generated id.
    ``boundary``: fork at that inclusive event seq instead of at the end of the log.
    """

    source: str | LiveHandle
    """The session to fork: an id, or a live handle (that live incarnation only)."""
    request_id: str | UnsetType = UNSET
    """The idempotency key and RQ job id (the clients generate ``req-<uuid4>`` when absent)."""
    session_id: str | UnsetType = UNSET
    """One child, with this id."""
    reply_to: str | UnsetType = UNSET
    """The reply channel (default ``sf:replies``)."""
    count: int | UnsetType = UNSET
    """A fan-out of this many children with generated ids."""
    session_ids: list[str] | UnsetType = UNSET
    """A fan-out of children with these ids."""
    traceparent: str | UnsetType = UNSET
    """W3C trace context of the scheduler (set by the clients when OpenTelemetry is installed)."""
    boundary: int | UnsetType = UNSET
    """Fork at this inclusive event seq (the child's seed is events ``[0, boundary]``)."""
    if_length: int | UnsetType = UNSET
    """Fork only if the source's log has exactly this many events (``PRECONDITION_FAILED``)."""
    edits: list[dict[str, Any]] | UnsetType = UNSET
    """Events ``{"type", "data"?, ...extra}`` appended to every child right after its seed."""
    variants: list[Variant] | UnsetType = UNSET
    """A fan-out of one snapshot, each child with its own id and edits (exclusive with
    ``session_id``, ``session_ids``, ``count`` and ``edits``)."""
    summary: Summary | UnsetType = UNSET
    """Seed the children with a summary of the source's events before ``keepFrom`` (``Summary``)."""
    op: Literal["fork"] | UnsetType = UNSET
    """The operation: ``"fork"``, or absent (a request without ``op`` is a fork)."""

    @property
    def source_id(self) -> str:
        """The source's session id (of a plain id or a live handle)."""
        return ref_id(self.source)

    @property
    def instance(self) -> str:
        """The source's instance token; ``""`` (any live instance) for a plain id."""
        return self.source.instance if isinstance(self.source, LiveHandle) else ""

    @property
    def fans_out(self) -> bool:
        """Whether this is a fan-out (``count``, ``session_ids`` or ``variants``): answered with
        ``sessions`` rather than ``session``."""
        return self.count is not UNSET or self.session_ids is not UNSET or self.variants is not UNSET


class ChildError(msgspec.Struct, rename="camel", kw_only=True):
    """One requested child of a fan-out that was not created: its id, why (an ``ErrorCode``
    value) and the message."""

    session_id: str
    """The child id that was not created."""
    code: str
    """An ``ErrorCode`` value (``SESSION_ALREADY_EXISTS``, ``SESSION_NOT_FOUND``, ...)."""
    message: str
    """What went wrong, for people."""


class ForkResult(msgspec.Struct, tag="fork/result", tag_field="type", rename="camel", kw_only=True):
    """The reply when a fork created children (the wire's ``fork/result``).

    A single fork (no ``session_ids``, ``count`` or ``variants``) answers its child in
    ``session``, and ``ok`` is true. A fan-out answers ``sessions`` (the children created, in
    request order) and ``failed`` (the ids not created, with their errors); its ``ok`` is false
    when any child failed. Read the children through ``child`` (a single fork's) or
    ``children`` (any fork's) and the failures through ``not_created``: typed, never ``UNSET``.
    ``isinstance(reply, ForkResult)``, or ``if reply.ok:`` (a ``ForkFailure``'s ``ok`` is the
    literal ``False``), narrows a ``Reply`` to this type.
    """

    request_id: str
    """The request this answers."""
    ok: bool = True
    """True unless a fan-out left some of its children uncreated (``failed``)."""
    session: Header | UnsetType = UNSET
    """A single fork's child (absent for a fan-out): read it as ``child``."""
    sessions: list[Header] | UnsetType = UNSET
    """A fan-out's children created, in request order (absent for a single fork)."""
    failed: list[ChildError] | UnsetType = UNSET
    """A fan-out's children not created (absent when none failed)."""

    @property
    def child(self) -> Header:
        """The child of a single fork. On a fan-out's reply, ``ForkError`` (``INVALID_REQUEST``):
        read ``children`` there."""
        if isinstance(self.session, UnsetType):
            raise errors.invalid(f"the reply to request {rules.echo(self.request_id)} is a fan-out's: "
                                 "read its children, not one child")
        return self.session

    @property
    def children(self) -> list[Header]:
        """Every child created: a single fork's one child, or a fan-out's children in request order."""
        if not isinstance(self.session, UnsetType):
            return [self.session]
        return [] if isinstance(self.sessions, UnsetType) else list(self.sessions)

    @property
    def not_created(self) -> list[ChildError]:
        """A fan-out's children that were not created, each with its error (empty when none)."""
        return [] if isinstance(self.failed, UnsetType) else list(self.failed)


class ForkFailure(msgspec.Struct, tag="fork/error", tag_field="type", rename="camel", kw_only=True):
    """The reply when a fork created nothing (the wire's ``fork/error``): ``code`` says why.

    ``isinstance(reply, ForkFailure)`` narrows a ``Reply`` to this type (``not reply.ok`` does
    not: a fan-out's ``ForkResult`` can have ``ok`` false too).
    """

    request_id: str
    """The request this answers."""
    ok: Literal[False] = False
    """Always false: nothing was created."""
    code: str
    """An ``ErrorCode`` value (``OPEN_TURN``, ``SESSION_NOT_FOUND``, ...)."""
    message: str
    """What went wrong, for people (the messages are listed with the error codes)."""


Reply: TypeAlias = ForkResult | ForkFailure
"""The one reply a fork request gets: ``ForkResult`` or ``ForkFailure`` (narrow with
``isinstance``, or with ``if reply.ok:`` to a ``ForkResult``)."""

MergeMode: TypeAlias = Literal["summary", "events"]
"""How a merge brings a child's events back: one ``session/summary`` event carrying the request's
``summary``, or the range's events themselves, renumbered, each with its provenance."""


class MergeRange(msgspec.Struct, rename="camel", forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Seqs ``fromSeq..toSeq`` (both inclusive) of a child's own events (after its seed)."""

    from_seq: int
    """The first event merged (a seq of the child's, at or past its ``seedLength``)."""
    to_seq: int
    """The last event merged: it must end a turn, or lie between turns."""


class MergeRequest(msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """A merge request (``"op": "merge"``): bring ``child``'s events back into ``parent``, one of
    its ancestors, as one turn. Unknown fields are rejected."""

    op: Literal["merge"]
    """Always ``"merge"``."""
    parent: str | LiveHandle
    """The session merged into: an id, or a live handle (that live incarnation only)."""
    child: str
    """The session merged from: its ``parentSession`` chain must reach ``parent``."""
    mode: MergeMode
    """``"summary"`` (one event carrying ``summary``) or ``"events"`` (the range's events)."""
    request_id: str | UnsetType = UNSET
    """The idempotency key and RQ job id (the clients generate ``req-<uuid4>`` when absent)."""
    summary: Any = UNSET
    """Mode ``summary`` only, and required there: the summary, any JSON but ``null``."""
    range: MergeRange | UnsetType = UNSET
    """The child's events to merge (default: its own events after its seed up to its last
    completed turn)."""
    if_parent_length: int | UnsetType = UNSET
    """Merge only if the parent's log has exactly this many events (``PRECONDITION_FAILED``)."""
    if_child_length: int | UnsetType = UNSET
    """Merge only if the child's log has exactly this many events (``PRECONDITION_FAILED``)."""
    reply_to: str | UnsetType = UNSET
    """The reply channel (default ``sf:replies``)."""
    traceparent: str | UnsetType = UNSET
    """W3C trace context of the scheduler (set by the clients when OpenTelemetry is installed)."""


class SelectRequest(msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """A select request (``"op": "select"``): best of N. ``winner`` is merged into ``parent`` as a
    merge request would merge it, and every other candidate is marked abandoned, in one request
    with one outcome. Unknown fields are rejected."""

    op: Literal["select"]
    """Always ``"select"``."""
    parent: str | LiveHandle
    """The session the winner is merged into."""
    candidates: list[str]
    """The branches compared (distinct ids, the winner among them)."""
    winner: str
    """The candidate merged; the others are abandoned."""
    mode: MergeMode
    """As a merge's: ``"summary"`` or ``"events"``."""
    request_id: str | UnsetType = UNSET
    """The idempotency key and RQ job id."""
    summary: Any = UNSET
    """As a merge's (mode ``summary``: required)."""
    range: MergeRange | UnsetType = UNSET
    """The winner's events to merge (default as a merge's)."""
    if_parent_length: int | UnsetType = UNSET
    """Select only if the parent's log has exactly this many events."""
    if_child_length: int | UnsetType = UNSET
    """Select only if the winner's log has exactly this many events."""
    reply_to: str | UnsetType = UNSET
    """The reply channel (default ``sf:replies``)."""
    traceparent: str | UnsetType = UNSET
    """W3C trace context of the scheduler."""


AnyRequest: TypeAlias = ForkRequest | MergeRequest | SelectRequest
"""A request of any operation, as the queue carries it."""


class MergedFrom(msgspec.Struct, rename="camel", frozen=True, kw_only=True):
    """Where merged events came from: the child and its seqs ``fromSeq..toSeq``."""

    session: str
    """The child merged from."""
    from_seq: int
    """The first of its events merged."""
    to_seq: int
    """The last of its events merged."""


class MergeResult(msgspec.Struct, tag="merge/result", tag_field="type", rename="camel", kw_only=True):
    """The reply when a merge landed (the wire's ``merge/result``)."""

    request_id: str
    """The request this answers."""
    ok: Literal[True] = True
    """Always true."""
    parent: str
    """The session merged into."""
    length: int
    """The parent's length after the merge."""
    from_seq: int
    """The parent's seq of the merge's ``turn/start``."""
    to_seq: int
    """The parent's seq of the merge's ``turn/end`` (``length - 1`` when nothing came after it)."""
    merged_from: MergedFrom
    """The child and the range of its events merged."""


class MergeFailure(msgspec.Struct, tag="merge/error", tag_field="type", rename="camel", kw_only=True):
    """The reply when a merge wrote nothing (the wire's ``merge/error``): ``code`` says why."""

    request_id: str
    """The request this answers."""
    ok: Literal[False] = False
    """Always false: nothing was written."""
    code: str
    """An ``ErrorCode`` value (``NOT_DESCENDANT``, ``ALREADY_MERGED``, ``OPEN_TURN``, ...)."""
    message: str
    """What went wrong, for people."""


class SelectResult(msgspec.Struct, tag="select/result", tag_field="type", rename="camel", kw_only=True):
    """The reply when a select merged its winner and abandoned the other candidates
    (the wire's ``select/result``)."""

    request_id: str
    """The request this answers."""
    ok: Literal[True] = True
    """Always true."""
    parent: str
    """The session the winner was merged into."""
    winner: str
    """The candidate merged."""
    abandoned: list[str]
    """The other candidates, now abandoned, in request order."""
    length: int
    """The parent's length after the merge."""
    from_seq: int
    """The parent's seq of the merge's ``turn/start``."""
    to_seq: int
    """The parent's seq of the merge's ``turn/end``."""
    merged_from: MergedFrom
    """The winner and the range of its events merged."""


class SelectFailure(msgspec.Struct, tag="select/error", tag_field="type", rename="camel", kw_only=True):
    """The reply when a select changed nothing (the wire's ``select/error``): ``code`` says why."""

    request_id: str
    """The request this answers."""
    ok: Literal[False] = False
    """Always false: nothing was written, no candidate abandoned."""
    code: str
    """An ``ErrorCode`` value (``ALREADY_MERGED`` for a stale selection, ...)."""
    message: str
    """What went wrong, for people."""


MergeReply: TypeAlias = MergeResult | MergeFailure
"""The one reply a merge request gets (``if reply.ok:`` narrows to ``MergeResult``)."""
SelectReply: TypeAlias = SelectResult | SelectFailure
"""The one reply a select request gets (``if reply.ok:`` narrows to ``SelectResult``)."""
Failure: TypeAlias = ForkFailure | MergeFailure | SelectFailure
"""The failure reply of any request: nothing was written (``isinstance(reply, Failure)`` tells one)."""
Outcome: TypeAlias = ForkResult | ForkFailure | MergeResult | MergeFailure | SelectResult | SelectFailure
"""The one outcome of any request (fork, merge or select)."""
def op_of(request: AnyRequest) -> str:
    """The request's operation: ``"fork"``, ``"merge"`` or ``"select"``."""
    return "fork" if isinstance(request, ForkRequest) else request.op


class _Op(msgspec.Struct):
    op: Any = UNSET


_request_decoder = msgspec.json.Decoder(ForkRequest)
_merge_decoder = msgspec.json.Decoder(MergeRequest)
_select_decoder = msgspec.json.Decoder(SelectRequest)
_op_decoder = msgspec.json.Decoder(_Op)
_reply_decoder: msgspec.json.Decoder[Outcome] = msgspec.json.Decoder(Outcome)


def request_op(raw: bytes | str) -> str:
    """The ``op`` of a request's JSON: ``"fork"`` when absent (every request before merges),
    ``"merge"`` or ``"select"``; ``INVALID_REQUEST`` for any other value, and for text that is not
    valid UTF-8 in any field (naming that field: a merge's ``summary`` too). A request that is not
    a JSON object answers ``"fork"`` (its decoding says what is wrong)."""
    if (b'"op"' not in raw) if isinstance(raw, bytes) else ('"op"' not in raw):
        return "fork"  # the common case: no field, no second decode
    try:
        op = _op_decoder.decode(raw).op
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        bad = _bad_text(raw)  # text that is not UTF-8 anywhere in it: named here, whatever the op
        if bad is not None:
            raise errors.invalid(bad) from None
        return "fork"
    if op is UNSET or op == "fork":
        return "fork"
    if op in ("merge", "select"):
        return str(op)
    raise errors.invalid(f"invalid request: unknown op {rules.echo(op)} (expected fork, merge or select)")


def decode_any_request(raw: bytes | str, op: str | None = None) -> AnyRequest:
    """Decode a request of any operation, as ``decode_request`` decodes a fork; ``op``: the one
    ``request_op`` read from it already (``None``: read it here)."""
    op = request_op(raw) if op is None else op
    if op == "fork":
        return decode_request(raw)
    decoder: msgspec.json.Decoder[Any] = _merge_decoder if op == "merge" else _select_decoder
    try:
        return decoder.decode(raw)  # type: ignore[no-any-return]
    except msgspec.ValidationError as exc:
        raise errors.invalid(f"invalid {op} request: {exc}") from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise errors.invalid(_bad_text(raw) or f"invalid request: not JSON ({exc})") from None


def decode_request(raw: bytes | str) -> ForkRequest:
    """Decode a request; any schema violation is ``INVALID_REQUEST`` naming the field, text that is
    not valid UTF-8 (a lone surrogate escape, bytes that are not UTF-8) too, saying which."""
    try:
        return _request_decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise errors.invalid(f"invalid request: {exc}") from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        # msgspec refuses such text for the whole document ("Input data was truncated", or a
        # UnicodeDecodeError): the slow reader below finds the field, on this failure path only.
        raise errors.invalid(_bad_text(raw) or f"invalid request: not JSON ({exc})") from None


_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PATH_LIMIT = 200
"""Most characters of a field path that a message shows (a deep path is cut)."""


def _bad_text(raw: bytes | str) -> str | None:
    """The message for a request whose JSON holds text that is not valid UTF-8, naming the first
    field (its wire path: ``edits[0].data.text``) that holds it; ``None`` when that is not why
    the document was refused."""
    if isinstance(raw, bytes):
        try:
            text, utf8 = raw.decode(), True
        except UnicodeDecodeError:
            text, utf8 = raw.decode("utf-8", "surrogateescape"), False  # a bad byte: U+DC80-U+DCFF
    else:
        text, utf8 = raw, True
    try:
        document = json.loads(text)  # Python's reader keeps lone surrogates as they are
    except (ValueError, RecursionError):
        return None
    stack: list[tuple[str, object]] = [("", document)]
    while stack:
        path, item = stack.pop()
        found: str | None = None
        if isinstance(item, str):
            found = item
        elif isinstance(item, dict):
            for key in item:
                if _surrogate(key) is not None:
                    path, found = f"{path or '$'} (an object key)", key
                    break
            else:
                stack.extend((_member(path, key), value) for key, value in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", value) for i, value in reversed(list(enumerate(item))))
        char = None if found is None else _surrogate(found)
        if char is not None:
            shown = path if len(path) <= _PATH_LIMIT else path[:_PATH_LIMIT] + "…"
            what = (f"a lone surrogate ({char!r}): text must be valid UTF-8 (a \\ud800-\\udbff escape needs "
                    "its \\udc00-\\udfff pair)") if utf8 else \
                f"bytes that are not valid UTF-8 (0x{ord(char) - 0xDC00:02x}): text must be valid UTF-8"
            return f"invalid request: {shown or '$'} holds {what}"
    return None


def _member(path: str, key: str) -> str:
    return f"{path}.{key}" if path and _PLAIN_KEY.fullmatch(key) else \
        (key if _PLAIN_KEY.fullmatch(key) else f"{path}[{rules.echo(key, 40)}]")


def _surrogate(value: str) -> str | None:
    """The first lone surrogate of ``value`` (what cannot be encoded as UTF-8), or ``None``."""
    if value.isascii():
        return None
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        return value[exc.start]
    return None


def decode_reply(raw: bytes | str) -> Outcome:
    """Any request's outcome from its JSON (a fork's, a merge's or a select's)."""
    return _reply_decoder.decode(raw)


IDENTITY_FIELDS: Final = ("source", "sessionId", "count", "sessionIds", "boundary", "ifLength", "edits",
                          "variants", "summary", "op", "parent", "child", "mode", "range", "ifParentLength",
                          "ifChildLength", "candidates", "winner")
"""The wire names of the fields that make two requests under one request id "the same", in order.
``protocol/scripts/enqueue.lua`` lists the same names (``FIELDS``; a test pins the two, and a property
test runs the script against ``identity`` on random requests). ``identity`` is the one Python
definition: both clients (``digest``, to read the outcome) and the worker (``digest`` and
``identity``, kept with the claim) use it."""
_IDENTITY_ATTRS: Final = {
    kind: tuple(next((f.name for f in msgspec.structs.fields(kind) if f.encode_name == name), "")
                for name in IDENTITY_FIELDS)
    for kind in (ForkRequest, MergeRequest, SelectRequest)}
"""Each request type's attribute for each identity field (``""``: the type has none)."""


IDENTITY_KEPT: Final = 4
"""The identity fields always written; the later ones (``boundary`` on) only up to the last given
(the script's ``KEPT``, pinned with ``FIELDS``)."""
_canonical = msgspec.json.Encoder(order="deterministic")  # object keys sorted: edits in any key order


def identity(request: AnyRequest) -> bytes:
    """What makes two requests under one request id "the same", as JSON: the values of
    ``IDENTITY_FIELDS`` (``null`` when absent) with object keys sorted, trailing absent fields
    after the first four left out (a request without ``boundary``, ``ifLength``, ``edits`` and
    ``variants`` keeps the identity it had before they existed).

    ``requestId``, ``replyTo`` and ``traceparent`` are not part of it (a retry may listen
    elsewhere, or run in another trace). The worker keeps it in the request's record, where the
    enqueue script compares it.
    """
    fields = [getattr(request, attr) if attr else UNSET for attr in _IDENTITY_ATTRS[type(request)]]
    if isinstance(request, ForkRequest):
        fields[IDENTITY_FIELDS.index("op")] = UNSET  # "op": "fork" is a fork without op: the same request
    while len(fields) > IDENTITY_KEPT and fields[-1] is UNSET:
        fields.pop()
    return _canonical.encode([None if f is UNSET else f for f in fields])


def digest(request: AnyRequest) -> str:
    """The sha256 of ``identity(request)``: equal digests, same request."""
    return digest_of(identity(request))


def digest_of(identity: bytes) -> str:
    """``digest`` of a request whose ``identity`` is this (computed once, where both are kept)."""
    return hashlib.sha256(identity).hexdigest()
