"""A fork request at the edge: its bytes decoded and validated once, before any work.

``parse`` is the only place a request's fields are checked: ids, exclusive fields, limits. What
it returns is trusted downstream (the fork steps do not check the ids again).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from ..core import errors, rules, wire
from ..core.wire import ForkRequest, LiveHandle

MAX_CHANNEL_LENGTH = 256


@dataclass(frozen=True, slots=True)
class Limits:
    """What a request may ask for (settings ``SESSIONFORK_MAX_*``)."""

    max_request_bytes: int = 65536
    max_fanout: int = 1024
    max_id_length: int = 128


DEFAULT_LIMITS = Limits()


def build(source: str | LiveHandle, request_id: str, *, session_id: str | None = None,
          session_ids: list[str] | None = None, count: int | None = None, reply_to: str | None = None,
          boundary: int | None = None, traceparent: str | UnsetType = UNSET) -> ForkRequest:
    """A request as the clients send it (``None``, ``UNSET``: the field is absent); ``INVALID_REQUEST`` for a
    request id outside ``[A-Za-z0-9_-]{1,128}`` (it is the RQ job id). The rest is checked by
    ``parse`` where the request is run."""
    rules.check_request_id(request_id)

    def given(value: Any) -> Any:
        return UNSET if value is None else value

    return ForkRequest(source=source, request_id=request_id, session_id=given(session_id),
                       session_ids=given(session_ids), count=given(count), reply_to=given(reply_to),
                       traceparent=traceparent, boundary=given(boundary))


def prepare(request: ForkRequest, new_id: Callable[[], str]) -> tuple[ForkRequest, bytes]:
    """A request ready to enqueue, and its JSON: given a request id (``new_id()``) when it has
    none, that id checked, the request encoded. ``INVALID_REQUEST`` for a bad request id or a
    request that cannot be sent as JSON (e.g. a non-UTF-8 string); the one way both clients send."""
    if request.request_id is UNSET:
        request = msgspec.structs.replace(request, request_id=new_id())
    assert isinstance(request.request_id, str)
    rules.check_request_id(request.request_id)
    try:
        payload = wire.encode(request)
    except (UnicodeEncodeError, TypeError, msgspec.EncodeError) as exc:
        raise errors.invalid(f"request {request.request_id} cannot be sent as JSON: {exc}") from None
    return request, payload


def reply_channel(request: ForkRequest, default: str) -> str:
    """The channel a request's outcome is announced on: its ``replyTo``, else ``default`` (the
    settings' reply channel). The one rule of the clients (where they listen) and the worker
    (where it publishes)."""
    return default if request.reply_to is UNSET else request.reply_to


def parse(payload: str | bytes, job_id: str, limits: Limits) -> ForkRequest:
    """Decode and validate a request whose RQ job id is ``job_id``; ``INVALID_REQUEST`` naming the
    field otherwise. Each id is checked once, here."""
    raw = payload.encode() if isinstance(payload, str) else payload
    if len(raw) > limits.max_request_bytes:
        raise errors.invalid(f"request is {len(raw)} bytes, over the limit of {limits.max_request_bytes}")
    request = wire.decode_request(raw)
    rules.check_request_id(job_id, "requestId (the RQ job id)")
    if request.request_id is not UNSET and request.request_id != job_id:
        raise errors.invalid(f"requestId {rules.echo(request.request_id)} does not match the job id "
                             f"{rules.echo(job_id)}")
    rules.check_id(request.source_id, "source")
    if isinstance(request.source, LiveHandle) and not request.source.instance:
        raise errors.invalid("invalid source: a live handle needs a non-empty instance")
    if request.session_id is not UNSET:
        rules.check_id(request.session_id, "sessionId")
    chosen = [name for name, value in (("sessionId", request.session_id), ("sessionIds", request.session_ids),
                                       ("count", request.count)) if value is not UNSET]
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
    named = [("requestId", job_id), ("source", request.source_id)]
    named += [("sessionId", request.session_id)] if request.session_id is not UNSET else []
    named += [(f"sessionIds[{i}]", c) for i, c in enumerate(request.session_ids or ())]
    for field, value in named:
        if len(value) > limits.max_id_length:
            raise errors.invalid(f"invalid {field}: {len(value)} characters, over the limit of {limits.max_id_length}")
    if request.reply_to is not UNSET and not is_valid_channel(request.reply_to):
        raise errors.invalid(f"invalid replyTo: expected 1-{MAX_CHANNEL_LENGTH} printable ASCII characters")
    if request.traceparent is not UNSET and not rules.is_valid_traceparent(request.traceparent):
        raise errors.invalid("invalid traceparent: expected a W3C traceparent "
                             "(version-traceid-parentid-flags, lowercase hex)")
    return request


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
        except (msgspec.DecodeError, RecursionError):
            reply_to = UNSET
        if reply_to is not UNSET and is_valid_channel(reply_to):
            return reply_to
    return default


def invalid_digest(raw: bytes) -> str:
    """The digest recorded for a request refused before it was understood: ``invalid:<sha256>``."""
    return "invalid:" + hashlib.sha256(raw).hexdigest()
