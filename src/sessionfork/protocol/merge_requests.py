"""Merge and select requests at the edge: the clients' build, the worker's parse, the spec, the reply.

A request with ``"op": "merge"`` or ``"op": "select"`` (``wire.request_op``; a request without
``op`` is a fork, as every request before merges) is decoded once (``parse``: the envelope checks a
fork's parse makes, then the ids, the candidates and the summary's size), then its one spec is
built (``spec_of``: ``core.merges``' edge, whose checks name the wire's fields) and passed whole to
``core.merges.run``; ``reply_of`` turns what it wrote into the wire's reply.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, Literal

import msgspec
from msgspec import UNSET, UnsetType

from ..core import errors, merges, rules, wire
from ..core.merge_steps import Merged
from ..core.merges import MergeOptions
from ..core.specs import MergeSpec, SelectSpec
from ..core.wire import LiveHandle, MergeRange, MergeRequest, MergeResult, SelectRequest, SelectResult
from .requests import Limits, check_envelope


class ClientMergeOptions(MergeOptions, total=False):
    """A merge's or select's options as both clients take them: ``MergeOptions`` (``mode``
    required) and the reply channel. An option not named here is a ``TypeError``."""

    reply_to: str | None
    """The channel the outcome is announced on (default: the settings' reply channel)."""


OPTION_NAMES: Final = frozenset(ClientMergeOptions.__annotations__)


def build(op: Literal["merge", "select"], parent: str | LiveHandle, options: ClientMergeOptions,
          new_id: Callable[[], str], *, child: str = "", candidates: Sequence[str] = (),
          traceparent: str | UnsetType = UNSET) -> MergeRequest | SelectRequest:
    """A merge request (``child``) or a select request (``candidates``, the winner in ``child``) as
    the clients send it, its request id ``options["request_id"]`` or ``new_id()``. ``TypeError`` for
    an unknown option; ``INVALID_REQUEST`` for what ``core.merges``' edge refuses (checked here, so
    a bad request is refused before it is sent)."""
    unknown = sorted(options.keys() - OPTION_NAMES)
    if unknown:
        raise TypeError(f"{op}() got an unexpected keyword argument {unknown[0]!r}")
    request_id = options.get("request_id") or new_id()
    rules.check_request_id(request_id)
    core: MergeOptions = {k: v for k, v in options.items() if k != "reply_to"}  # type: ignore[assignment]
    core["request_id"] = request_id
    if op == "select":
        merges.select_spec(parent, candidates, child, core)
    else:
        merges.merge_spec(parent, child, core)
    span = options.get("range")
    common: dict[str, Any] = {
        "parent": parent, "mode": options["mode"], "request_id": request_id,
        "summary": UNSET if options.get("summary") is None else options.get("summary"),
        "range": UNSET if span is None else MergeRange(from_seq=span[0], to_seq=span[1]),
        "if_parent_length": _given(options.get("if_parent_length")),
        "if_child_length": _given(options.get("if_child_length")),
        "reply_to": _given(options.get("reply_to")), "traceparent": traceparent}
    if op == "select":
        return SelectRequest(op="select", candidates=list(candidates), winner=child, **common)
    return MergeRequest(op="merge", child=child, **common)


def _given(value: Any) -> Any:
    return UNSET if value is None else value


def parse(payload: str | bytes, job_id: str, limits: Limits, op: str) -> MergeRequest | SelectRequest:
    """Decode and validate a merge or select request (``op``: ``wire.request_op`` of it, read by
    the caller to route it here) whose RQ job id is ``job_id``:
    ``INVALID_REQUEST`` naming the field otherwise (the checks a fork's ``parse`` makes of the
    envelope, then the ids and their lengths, the candidates' count, the summary's size)."""
    raw = payload.encode() if isinstance(payload, str) else payload
    if len(raw) > limits.max_request_bytes:
        raise errors.invalid(f"request is {len(raw)} bytes, over the limit of {limits.max_request_bytes}")
    request = wire.decode_any_request(raw, op)
    assert not isinstance(request, wire.ForkRequest)  # the caller routes by wire.request_op
    check_envelope(request, job_id)
    parent = request.parent
    if isinstance(parent, LiveHandle) and not parent.instance:
        raise errors.invalid("invalid parent: a live handle needs a non-empty instance")
    named = [("parent", wire.ref_id(parent))]
    if isinstance(request, SelectRequest):
        if not 1 <= len(request.candidates) <= limits.max_fanout:
            raise errors.invalid(f"invalid candidates: expected 1 to {limits.max_fanout} ids, "
                                 f"got {len(request.candidates)}")
        named += [(f"candidates[{i}]", c) for i, c in enumerate(request.candidates)] + [("winner", request.winner)]
    else:
        named.append(("child", request.child))
    for field, value in named:
        rules.check_id(value, field)
        if len(value) > limits.max_id_length:
            raise errors.invalid(f"invalid {field}: {len(value)} characters, over the limit of {limits.max_id_length}")
    if request.summary is not UNSET:
        size = len(wire.encode(request.summary))
        if size > limits.max_write_bytes:
            raise errors.invalid(f"invalid summary: {size} bytes to write, over the limit of {limits.max_write_bytes}")
    return request


def spec_of(request: MergeRequest | SelectRequest, request_id: str, limits: Limits) -> MergeSpec | SelectSpec:
    """The spec of a request ``parse`` accepted, run under ``request_id``: built once by
    ``core.merges``' edge (its checks: mode and summary, range, guards, the winner among distinct
    candidates), then passed whole to ``core.merges.run``."""
    span = request.range
    options: MergeOptions = {
        "mode": request.mode, "summary": None if request.summary is UNSET else request.summary,
        "range": None if isinstance(span, UnsetType) else (span.from_seq, span.to_seq),
        "if_parent_length": None if request.if_parent_length is UNSET else request.if_parent_length,
        "if_child_length": None if request.if_child_length is UNSET else request.if_child_length,
        "request_id": request_id}
    trace = None if request.traceparent is UNSET else request.traceparent
    if isinstance(request, SelectRequest):
        return merges.select_spec(request.parent, request.candidates, request.winner, options,
                                  max_candidates=limits.max_fanout, traceparent=trace)
    return merges.merge_spec(request.parent, request.child, options, traceparent=trace)


def reply_of(request_id: str, merged: Merged, select: bool) -> MergeResult | SelectResult:
    """The wire's reply for what a merge or a select wrote: the parent's new length, the seqs of
    the merge's turn there, and the child's range."""
    merged_from = wire.MergedFrom(session=merged.child, from_seq=merged.from_seq, to_seq=merged.to_seq)
    if select:
        return SelectResult(request_id=request_id, parent=merged.parent, winner=merged.child,
                            abandoned=list(merged.abandoned), length=merged.length, from_seq=merged.first,
                            to_seq=merged.length - 1, merged_from=merged_from)
    return MergeResult(request_id=request_id, parent=merged.parent, length=merged.length, from_seq=merged.first,
                       to_seq=merged.length - 1, merged_from=merged_from)


def encode(request: MergeRequest | SelectRequest) -> bytes:
    """The request's JSON (``INVALID_REQUEST`` for one that cannot be sent as JSON)."""
    try:
        return wire.encode(request)
    except (UnicodeEncodeError, TypeError, msgspec.EncodeError) as exc:
        raise errors.invalid(f"request {request.request_id} cannot be sent as JSON: {exc}") from None
