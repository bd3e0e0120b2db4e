"""A fork request at the edge: its bytes decoded and validated once, before any work.

``parse`` is the only place a request's fields are checked: ids, exclusive fields, limits. What
it returns is trusted downstream (the fork steps do not check the ids again).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypedDict, TypeVar, cast

import msgspec
from msgspec import UNSET, UnsetType

from ..core import errors, rules, wire
from ..core.forks import FanOut
from ..core.settings import ENV, REQUEST_LIMIT, Settings
from ..core.specs import ForkSpec
from ..core.wire import ForkRequest, LiveHandle, NewEvent

MAX_CHANNEL_LENGTH = 256
R = TypeVar("R", bound=wire.AnyRequest)
"""A request of any operation, as the clients build and send it."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What a request may ask for (settings ``SESSIONFORK_MAX_*``)."""

    max_request_bytes: int = REQUEST_LIMIT
    max_fanout: int = 1024
    max_id_length: int = 128
    max_write_bytes: int = Settings().max_request_write_bytes
    """``SESSIONFORK_MAX_REQUEST_WRITE_BYTES``: most bytes of edits and summary data, summed over
    the children, one request may add (``write_bytes``)."""


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True, slots=True)
class Variant:
    """One child of a variant fan-out (``variants=``): its id (``None``: generated) and the events
    appended to it right after the shared seed."""

    session_id: str | None = None
    """The child's id; ``None``: generated (``session-<uuid4>``)."""
    edits: Sequence[NewEvent] = ()
    """Events appended to this child right after the seed, in the step that creates it."""


def edit_json(event: NewEvent) -> dict[str, Any]:
    """An event as a request's ``edits`` carry it: ``{"type", "data", ...extra}``."""
    if not isinstance(event, NewEvent):
        raise errors.invalid(f"edits must be NewEvent objects, got {type(event).__name__}")
    return {"type": event.type, "data": event.data, **event.extra}


def _edits(edits: Sequence[NewEvent] | None) -> Any:
    if edits is None or (isinstance(edits, Sequence) and not isinstance(edits, str | bytes) and not edits):
        return UNSET
    if not isinstance(edits, Sequence) or isinstance(edits, str | bytes):
        raise errors.invalid(f"edits must be a sequence of NewEvent, got {type(edits).__name__}")
    return [edit_json(e) for e in edits]


class ForkOptions(TypedDict, total=False):
    """A fork's options: the keywords of both clients' ``request()`` and ``fork()``, each one
    optional (absent or ``None``: not asked for). An option not named here is a ``TypeError``, from
    mypy and at run time (``check_options``). At most one of ``session_id``, ``session_ids``,
    ``count`` and ``variants``; none of them: one child with a generated id."""

    session_id: str | None
    """The one child's id (default: generated)."""
    session_ids: list[str] | None
    """A fan-out: one child per id (distinct)."""
    count: int | None
    """A fan-out: this many children with generated ids."""
    request_id: str | None
    """The idempotency key, ``[A-Za-z0-9_-]{1,128}`` (it is the RQ job id; ``INVALID_REQUEST``
    otherwise); default: the client's ``new_id()``, ``req-<uuid4>``."""
    reply_to: str | None
    """The channel the outcome is announced on (default: the settings' reply channel)."""
    boundary: int | None
    """Fork at that inclusive event seq: the child's seed is events ``[0, boundary]`` (default: the
    end of the log)."""
    if_length: int | None
    """Fork only if the source's log has exactly that many events (else ``PRECONDITION_FAILED``)."""
    edits: Sequence[NewEvent] | None
    """Events appended to every child right after its seed, in the step that creates it."""
    variants: Sequence[Variant] | None
    """One snapshot, each child its own id and edits (``Variant(session_id=None, edits=())``);
    exclusive with ``session_id``, ``session_ids``, ``count`` and ``edits``."""
    summary: wire.Summary | None
    """Each child a summary child (``sessionfork.Summary(keep_from=K, data=...)``): one
    ``session/summary`` event holding ``data``, then the source's events ``K...`` renumbered from 1."""


OPTION_NAMES: Final = frozenset(ForkOptions.__annotations__)
_REQUEST_FIELDS: Final = frozenset(f.name for f in msgspec.structs.fields(ForkRequest))
PASSED_OPTIONS: Final = tuple(name for name in ForkOptions.__annotations__
                              if name in _REQUEST_FIELDS and name not in ("request_id", "edits", "variants"))
"""The options a request carries as the caller gave them, each the wire field of its name
(``ForkRequest``): an option declared in ``ForkOptions`` and the wire reaches the request with no
line of its own here (``tests/protocol/test_fork_options.py`` pins the three declarations)."""
PASSED_TO_SPEC: Final = tuple(f.name for f in msgspec.structs.fields(ForkSpec)
                              if f.name in _REQUEST_FIELDS and f.name not in ("source", "request_id", "edits"))
"""The request's fields its spec takes as they are (``ForkSpec``'s of the same name; absent: ``None``)."""


def check_options(options: Mapping[str, object], where: str) -> None:
    """``TypeError`` naming an option ``ForkOptions`` does not have, as Python's for an unknown
    keyword of ``where`` (the caller's name: ``Client.fork``)."""
    unknown = sorted(options.keys() - OPTION_NAMES)
    if unknown:
        raise TypeError(f"{where}() got an unexpected keyword argument {unknown[0]!r}")


def build(source: str | LiveHandle, options: ForkOptions, new_id: Callable[[], str], *,
          traceparent: str | UnsetType = UNSET, where: str = "build") -> ForkRequest:
    """A request as the clients send it: a fork of ``source`` with ``options`` (``None``,
    ``UNSET``, no edits: the field is absent), its request id ``options["request_id"]`` or, when
    none is given, ``new_id()``. ``TypeError`` for an unknown option (``check_options``, naming
    ``where``), before anything else; ``INVALID_REQUEST`` for a request id outside
    ``[A-Za-z0-9_-]{1,128}`` (it is the RQ job id) or edits that are not ``NewEvent``, or a
    ``summary`` that is not a ``sessionfork.Summary``. The rest is checked by ``parse`` where the
    request is run."""
    check_options(options, where)
    request_id = options.get("request_id") or new_id()
    rules.check_request_id(request_id)

    def given(name: str) -> Any:
        value = options.get(name)
        return UNSET if value is None else value

    wire_variants: Any = UNSET
    variants, summary = options.get("variants"), options.get("summary")
    if variants is not None:
        if not isinstance(variants, Sequence) or not all(isinstance(v, Variant) for v in variants):
            raise errors.invalid("variants must be a sequence of sessionfork.client.Variant")
        wire_variants = [wire.Variant(session_id=UNSET if v.session_id is None else v.session_id,
                                      edits=_edits(v.edits)) for v in variants]
    if summary is not None and not isinstance(summary, wire.Summary):
        raise errors.invalid(f"summary must be a sessionfork.Summary, got {type(summary).__name__}")
    return ForkRequest(source=source, request_id=request_id, traceparent=traceparent,
                       edits=_edits(options.get("edits")), variants=wire_variants,
                       **{name: given(name) for name in PASSED_OPTIONS})


def checked(request: R, *, to_wait: bool = False) -> R:
    """``request`` if it is a ``ForkRequest``, ``MergeRequest`` or ``SelectRequest`` (and,
    ``to_wait``, has its request id: a waiter reads the outcome stored under it); ``INVALID_REQUEST``
    otherwise, before any I/O."""
    if not isinstance(request, ForkRequest | wire.MergeRequest | wire.SelectRequest):
        raise errors.invalid("expected a ForkRequest, MergeRequest or SelectRequest (as the client's request(), "
                             f"merge_request() or select_request() builds), not {type(request).__name__}")
    if to_wait and not isinstance(request.request_id, str):
        raise errors.invalid("a request without a request id cannot be waited for: build it with the client's "
                             "request(), which gives it one")
    return request


def waited(request: object, reply_to: str | None = None) -> tuple[wire.AnyRequest, str | None]:
    """What both clients' ``wait`` waits for, and the digest that tells a conflict: a request
    (``checked``, ``to_wait``) and its digest; or, for a request id alone (a request submitted
    elsewhere), a request of that id woken on ``reply_to`` and no digest (no request to tell a
    conflict from). ``INVALID_REQUEST`` before any I/O, for an id outside ``[A-Za-z0-9_-]{1,128}``
    as for anything but a ``ForkRequest``."""
    if isinstance(request, str):
        rid = rules.check_request_id(request, "request id")
        return ForkRequest(source="", request_id=rid, reply_to=reply_to or UNSET), None
    request = checked(cast(wire.AnyRequest, request), to_wait=True)
    return request, wire.digest(request)


def prepare(request: R, new_id: Callable[[], str]) -> tuple[R, bytes]:
    """A request ready to enqueue, and its JSON: given a request id (``new_id()``) when it has
    none, that id checked, the request encoded. ``INVALID_REQUEST`` for anything but a
    ``ForkRequest``, a bad request id or a request that cannot be sent as JSON (e.g. a non-UTF-8
    string); the one way both clients send."""
    request = checked(request)
    if request.request_id is UNSET:
        request = msgspec.structs.replace(request, request_id=new_id())
    assert isinstance(request.request_id, str)
    rules.check_request_id(request.request_id)
    try:
        payload = wire.encode(request)
    except (UnicodeEncodeError, TypeError, msgspec.EncodeError) as exc:
        raise errors.invalid(f"request {request.request_id} cannot be sent as JSON: {exc}") from None
    return request, payload


MAX_WAIT = 86400
"""The longest a client call waits for its reply (seconds): a day."""
SUBMIT_RETRY_FOR = 10.0
"""How long a client's ``submit`` may take (seconds): the asyncio client sends the enqueue again
while its reply is lost, the sync client's is cut there (``TimeoutError``)."""
HARD_AFTER = 0.5
"""Seconds past a call's deadline at which both clients cut a call still in Redis (a frozen server,
a client without time-outs): the asyncio client cancels the command, the sync client leaves its
work's thread; until then a last read of the stored outcome may still answer."""


def wait_bound(timeout: object) -> float:
    """``timeout`` as the seconds a client call waits: a number from 0 to ``MAX_WAIT``;
    ``INVALID_REQUEST`` for anything else (NaN, an infinity, a negative, a bool, a string), raised
    before the call sends anything."""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 <= timeout <= MAX_WAIT:
        raise errors.invalid(f"timeout must be a number of seconds from 0 to {MAX_WAIT}, not {timeout!r}")
    return float(timeout)


def reply_channel(request: wire.AnyRequest, default: str) -> str:
    """The channel a request's outcome is announced on: its ``replyTo``, else ``default`` (the
    settings' reply channel). The one rule of the clients (where they listen) and the worker
    (where it publishes)."""
    return default if request.reply_to is UNSET else request.reply_to


def parse(payload: str | bytes, job_id: str, limits: Limits) -> ForkRequest:
    """Decode and validate a request whose RQ job id is ``job_id``; ``INVALID_REQUEST`` naming the
    field otherwise. Each id is checked once, here."""
    return parse_edited(payload, job_id, limits)[0]


def parse_edited(payload: str | bytes, job_id: str, limits: Limits) -> tuple[ForkRequest, list[list[NewEvent]]]:
    """``parse``, and the request's edits as it built them to check them (``edits_of``), for
    ``spec_of``: a worker builds each edit once."""
    raw = payload.encode() if isinstance(payload, str) else payload
    if len(raw) > limits.max_request_bytes:
        raise errors.invalid(f"request is {len(raw)} bytes, over the limit of {limits.max_request_bytes}")
    request = wire.decode_request(raw)
    check_envelope(request, job_id)
    rules.check_id(request.source_id, "source")
    if isinstance(request.source, LiveHandle) and not request.source.instance:
        raise errors.invalid("invalid source: a live handle needs a non-empty instance")
    if request.session_id is not UNSET:
        rules.check_id(request.session_id, "sessionId")
    chosen = [name for name, value in (("sessionId", request.session_id), ("sessionIds", request.session_ids),
                                       ("count", request.count), ("variants", request.variants),
                                       ("edits", request.edits if request.variants is not UNSET else UNSET))
              if value is not UNSET]
    if len(chosen) > 1:
        raise errors.invalid(f"invalid request: {' and '.join(chosen)} are exclusive")
    if request.count is not UNSET and not 1 <= request.count <= limits.max_fanout:
        raise errors.invalid(f"invalid count {request.count}: expected 1 to {limits.max_fanout}")
    if request.session_ids is not UNSET:
        ids = request.session_ids
        if not 1 <= len(ids) <= limits.max_fanout:
            raise errors.invalid(f"invalid sessionIds: expected 1 to {limits.max_fanout} ids, got {len(ids)}")
        for i, cid in enumerate(ids):
            rules.check_id(cid, f"sessionIds[{i}]")
        if len(set(ids)) != len(ids):
            raise errors.invalid("invalid sessionIds: ids must be distinct")
    if request.if_length is not UNSET and request.if_length < 0:
        raise errors.invalid(f"invalid ifLength {request.if_length}: expected an integer >= 0")
    edits = edits_of(request)  # each edit's shape (type, reserved fields, JSON), before any work
    variant_ids = _check_variants(request.variants, limits)
    _check_write_bytes(request, limits)
    named = [("requestId", job_id), ("source", request.source_id)]
    named += [("sessionId", request.session_id)] if request.session_id is not UNSET else []
    named += [(f"sessionIds[{i}]", c) for i, c in enumerate(request.session_ids or ())]
    named += variant_ids
    for field, value in named:
        if len(value) > limits.max_id_length:
            raise errors.invalid(f"invalid {field}: {len(value)} characters, over the limit of {limits.max_id_length}")
    return request, edits


def check_envelope(request: wire.AnyRequest, job_id: str) -> None:
    """What every request's ``parse`` checks first, whatever its op: the job id, a ``requestId``
    that matches it, ``replyTo`` and ``traceparent`` (``INVALID_REQUEST`` naming the field)."""
    rules.check_request_id(job_id, "requestId (the RQ job id)")
    if request.request_id is not UNSET and request.request_id != job_id:
        raise errors.invalid(f"requestId {rules.echo(request.request_id)} does not match the job id "
                             f"{rules.echo(job_id)}")
    if request.reply_to is not UNSET and not is_valid_channel(request.reply_to):
        raise errors.invalid(f"invalid replyTo: expected 1-{MAX_CHANNEL_LENGTH} printable ASCII characters")
    if request.traceparent is not UNSET and not rules.is_valid_traceparent(request.traceparent):
        raise errors.invalid("invalid traceparent: expected a W3C traceparent "
                             "(version-traceid-parentid-flags, lowercase hex)")


def _check_variants(variants: list[wire.Variant] | UnsetType, limits: Limits) -> list[tuple[str, str]]:
    """The variants' count and ids (checked; distinct when given); returns them named by field."""
    if variants is UNSET:
        return []
    if not 1 <= len(variants) <= limits.max_fanout:
        raise errors.invalid(f"invalid variants: expected 1 to {limits.max_fanout} variants, got {len(variants)}")
    named = [(f"variants[{i}].sessionId", v.session_id) for i, v in enumerate(variants) if v.session_id is not UNSET]
    for field, cid in named:
        rules.check_id(cid, field)
    if len({cid for _, cid in named}) != len(named):
        raise errors.invalid("invalid variants: session ids must be distinct")
    return named


def write_bytes(request: ForkRequest) -> tuple[int, str]:
    """What ``request`` would add to the registry beyond its children's seeds (stored by reference,
    O(1)): the JSON bytes of each child's edits and summary ``data``, as the request carries them,
    summed over its children; and how that sum is made, in the request's field names."""
    summary = 0 if request.summary is UNSET else len(wire.encode(request.summary.data))
    also = " and summary.data" if summary else ""
    if request.variants is not UNSET:
        total = sum(_edit_bytes(v.edits) + summary for v in request.variants)
        return total, f"variants: {len(request.variants)} children's edits{also}"
    per_child = _edit_bytes(request.edits) + summary
    what = f"{per_child} bytes of edits{also}" if request.edits is not UNSET else f"{per_child} bytes of summary.data"
    if request.count is not UNSET:
        return request.count * per_child, f"count {request.count} \u00d7 {what}"
    if request.session_ids is not UNSET:
        return len(request.session_ids) * per_child, f"sessionIds: {len(request.session_ids)} \u00d7 {what}"
    return per_child, f"1 child \u00d7 {what}"


def _edit_bytes(edits: list[dict[str, Any]] | UnsetType) -> int:
    return 0 if edits is UNSET else sum(len(wire.encode(body)) for body in edits)


def _check_write_bytes(request: ForkRequest, limits: Limits) -> None:
    """``INVALID_REQUEST`` for a request that would write more than ``limits.max_write_bytes``
    (``write_bytes``), naming the fields and the limit."""
    if request.edits is UNSET and request.summary is UNSET and request.variants is UNSET:
        return  # nothing but seeds, O(1) per child
    total, how = write_bytes(request)
    if total > limits.max_write_bytes:
        raise errors.invalid(f"invalid request: {how} is {total} bytes to write, over the limit of "
                             f"{limits.max_write_bytes} ({ENV['max_request_write_bytes']})")


def _new_events(edits: list[dict[str, Any]] | UnsetType, field: str) -> list[NewEvent]:
    """A request's edits as ``NewEvent``: 1 to ``rules.MAX_EDITS`` objects with a non-empty
    string ``type``; ``seq`` and ``time`` are the registry's (``INVALID_REQUEST`` naming ``field``)."""
    if edits is UNSET:
        return []
    if not 1 <= len(edits) <= rules.MAX_EDITS:
        raise errors.invalid(f"invalid {field}: expected 1 to {rules.MAX_EDITS} events, got {len(edits)}")
    events = []
    for i, body in enumerate(edits):
        rest = dict(body)
        kind = rest.pop("type", None)
        if not isinstance(kind, str) or not kind:
            raise errors.invalid(f"invalid {field}[{i}]: expected a non-empty string type")
        data = rest.pop("data", None)
        try:
            events.append(NewEvent(kind, data, rest))
        except errors.ForkError as exc:
            raise errors.invalid(f"invalid {field}[{i}]: {exc.message}") from None
        if (problem := rules.json_problem(data)) is not None:
            raise errors.invalid(f"{field}[{i}] data {problem}")
        for name, value in rest.items():
            if (problem := rules.json_problem(value)) is not None:
                raise errors.invalid(f"{field}[{i}] field {rules.echo(name)} {problem}")
    return events


def edits_of(request: ForkRequest) -> list[list[NewEvent]]:
    """Each variant's edits (the one list of ``edits`` without variants), checked as ``parse``
    checks them; ``[[]]`` for a request without edits."""
    if request.variants is UNSET:
        return [_new_events(request.edits, "edits")]
    return [_new_events(v.edits, f"variants[{i}].edits") for i, v in enumerate(request.variants)]


def child_ids(request: ForkRequest, new_id: Callable[[], str]) -> list[str]:
    """The child ids a request that ``parse`` accepted plans: the caller's, or ``new_id()``'s."""
    if request.session_ids is not UNSET:
        return list(request.session_ids)
    if request.count is not UNSET:
        return [new_id() for _ in range(request.count)]
    if request.variants is not UNSET:
        return [new_id() if v.session_id is UNSET else v.session_id for v in request.variants]
    return [new_id() if request.session_id is UNSET else request.session_id]


def reply_of(request: ForkRequest, request_id: str, made: FanOut) -> wire.Reply:
    """The reply of a fork request that ``made`` answers: a one-child fork's child (its one
    failure raised), a fan-out's children and failures."""
    if not request.fans_out:
        if made.failed:
            raise made.failed[0][1]
        return wire.ForkResult(request_id=request_id, session=made.created[0])
    return wire.ForkResult(
        request_id=request_id, ok=not made.failed, sessions=made.created,
        failed=[wire.ChildError(session_id=cid, code=e.code.value, message=e.message)
                for cid, e in made.failed] or UNSET,
    )


def spec_of(request: ForkRequest, request_id: str, child_ids: Sequence[str],
            edits: list[list[NewEvent]] | None = None) -> ForkSpec:
    """The ``ForkSpec`` of a request that ``parse`` accepted, run under ``request_id`` into
    ``child_ids`` (the ids it asked for, or generated for it: one per child, in order): built once,
    then passed whole to the core's steps. Each variant's edits go with its child; without
    variants every child gets the request's edits (one tuple, shared). ``edits``: the request's
    ``edits_of``, when the caller has them (``parse_edited``)."""
    edits = edits_of(request) if edits is None else edits
    if request.variants is not UNSET:
        own: tuple[tuple[NewEvent, ...], ...] = tuple(tuple(events) for events in edits)
    else:
        same = tuple(edits[0])
        own = tuple(same for _ in child_ids) if same else ()
    passed = {name: None if (value := getattr(request, name)) is UNSET else value for name in PASSED_TO_SPEC}
    return ForkSpec(source=request.source, child_ids=tuple(child_ids), request_id=request_id, edits=own, **passed)


def is_valid_channel(name: str) -> bool:
    return 0 < len(name) <= MAX_CHANNEL_LENGTH and name.isascii() and name.isprintable()


class _ReplyTo(msgspec.Struct, rename="camel"):
    reply_to: str | UnsetType = UNSET


_reply_to_only = msgspec.json.Decoder(_ReplyTo)


def reply_channel_of(raw: bytes, default: str, limits: Limits) -> str:
    """The ``replyTo`` of a request refused as invalid, when it can be read and is valid."""
    if len(raw) <= limits.max_request_bytes:
        try:
            reply_to = _reply_to_only.decode(raw).reply_to
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):  # its refusal says why
            reply_to = UNSET
        if reply_to is not UNSET and is_valid_channel(reply_to):
            return reply_to
    return default


def invalid_digest(raw: bytes) -> str:
    """The digest recorded for a request refused before it was understood: ``invalid:<sha256>``."""
    return "invalid:" + hashlib.sha256(raw).hexdigest()
