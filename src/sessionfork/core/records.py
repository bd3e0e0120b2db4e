"""How a session header and a request's outcome are laid out in their Redis hashes.

Redis keeps a hash whose values are all at most ``hash-max-listpack-value`` bytes (default 64) as
one compact listpack; one longer value makes it a hashtable, ~40 % larger. A header as one JSON
object (~150 bytes) or a one-child outcome as one JSON reply (~240 bytes) is longer, so records are
written in the *compact* layout: small fields, each at most 64 bytes in the normal case.

- A session record ``sf:s:{<id>}``: ``header`` = ``[version, createdAt(, seedLength(, keptFrom))]``
  (a JSON array; ``seedLength`` ``null`` when absent but ``keptFrom`` given), ``cwd`` (only if
  set), ``parent`` (the parent's id, only if set). The id is the key's. ``scripts/lib/header.lua``
  reads the same layout (a test pins the two).
- A request record ``sf:req:<id>`` answered by one child: ``child`` (its id) and the child's header
  in the fields above; any other outcome (a failure, a fan-out) stays one ``outcome`` JSON value.

Readers accept both layouts: the *old* one (``header`` a JSON object; ``outcome`` the reply JSON)
is what ``SESSIONFORK_COMPACT_RECORDS=0`` still writes, and what earlier versions wrote. A long
``cwd`` (over 64 bytes) makes that record a hashtable again: correct, only larger.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import msgspec
from msgspec import UNSET

from . import wire
from .wire import ForkResult, Header, Outcome

HEADER_FIELDS: Final = ("header", "cwd", "parent")
"""A session header's fields in its record, in the order ``decode_header`` takes them."""
OUTCOME_FIELDS: Final = ("digest", "outcome", "child", *HEADER_FIELDS)
"""What a waiter reads of a request's record (``keys.request``), in ``decode_outcome``'s order
(after ``digest``): the one stored-outcome read of both clients, ``HMGET sf:req:<id> digest
outcome child header cwd parent``; ``record.lua`` and ``claim.lua`` get the names after ``digest``."""
OUTCOME_MARKS: Final = ("outcome", "child")
"""A request's record holds an outcome when one of these fields is set (either layout)."""
STORED_OUTCOME: Final = OUTCOME_FIELDS[1:]
"""The fields that hold an outcome (either layout): the names ``record.lua``/``claim.lua`` read."""

_array = msgspec.json.Decoder(list[int | None])
_json = msgspec.json.Encoder()


def compact_header(header: Header) -> bytes:
    """The ``header`` field of the compact layout: ``[version, createdAt(, seedLength(, keptFrom))]``."""
    items: list[int | None] = [header.version, header.created_at]
    if header.kept_from is not UNSET:
        items += [None if header.seed_length is UNSET else header.seed_length, header.kept_from]
    elif header.seed_length is not UNSET:
        items.append(header.seed_length)
    return _json.encode(items)


def header_fields(header: Header, *, compact: bool = True) -> dict[str, bytes | str]:
    """A header's fields in its record: compact (``header``, ``cwd``?, ``parent``?), or one JSON
    ``header`` (the old layout)."""
    if not compact:
        return {"header": wire.encode_header(header)}
    out: dict[str, bytes | str] = {"header": compact_header(header)}
    if header.cwd is not UNSET:
        out["cwd"] = header.cwd
    if header.parent_session is not UNSET:
        out["parent"] = header.parent_session
    return out


def decode_header(sid: str, raw: bytes | str, cwd: bytes | str | None = None,
                  parent: bytes | str | None = None) -> Header:
    """The header of session ``sid`` from its record's ``HEADER_FIELDS`` (either layout)."""
    if raw[:1] in (b"{", "{"):
        return wire.decode_header(raw)  # the old layout: one JSON object, which names the id
    items = _array.decode(raw)
    version, created = items[0], items[1]
    assert version is not None and created is not None, raw
    seed = items[2] if len(items) > 2 else None
    kept = items[3] if len(items) > 3 else None
    return Header(version=version, id=sid, created_at=created, cwd=UNSET if cwd is None else wire.text(cwd),
                  parent_session=UNSET if parent is None else wire.text(parent),
                  seed_length=UNSET if seed is None else seed, kept_from=UNSET if kept is None else kept)


def outcome_fields(reply: Outcome, *, compact: bool = True, encoded: bytes | None = None) -> dict[str, bytes | str]:
    """A reply's fields in its request record: one child's outcome as ``child`` and its header's
    fields (compact), any other as one ``outcome`` JSON value (``encoded``: the reply's wire JSON,
    when the caller has it already)."""
    if compact and isinstance(reply, ForkResult) and reply.ok and reply.session is not UNSET \
            and reply.sessions is UNSET and reply.failed is UNSET:
        return {"child": reply.session.id, **header_fields(reply.session)}
    return {"outcome": wire.encode(reply) if encoded is None else encoded}


def decode_outcome(request_id: str, fields: Sequence[bytes | str | None]) -> Outcome | None:
    """The outcome of ``request_id`` from its record's ``STORED_OUTCOME`` fields (either layout),
    ``None`` when none is stored. The rebuilt reply is the one stored: the same wire JSON."""
    outcome, child, raw, cwd, parent = fields
    if outcome is not None:
        return wire.decode_reply(outcome)
    if child is None or raw is None:
        return None
    return ForkResult(request_id=request_id, session=decode_header(wire.text(child), raw, cwd, parent))


def flat(fields: Mapping[str, bytes | str]) -> list[bytes | str]:
    """``fields`` as ``name, value, ...`` (a script's trailing arguments)."""
    return [item for pair in fields.items() for item in pair]


def create_args(header: Header, *, compact: bool = True) -> dict[str, bytes | str]:
    """``create.lua``'s ``header``, ``cwd`` and ``parent_id`` arguments for a record of ``header``
    (``cwd``: ``""`` = none, else ``=`` and the cwd, which may be empty)."""
    fields = header_fields(header, compact=compact)
    cwd = fields.get("cwd")
    return {"header": fields["header"], "cwd": "" if cwd is None else "=" + wire.text(cwd),
            "parent_id": fields.get("parent", "")}


def parent_of(header: bytes | str | None, parent: bytes | str | None) -> str | None:
    """The parent id a record names, from its ``header`` and ``parent`` fields (a compact record's
    ``parent``, or a deleted session's tombstone's, kept while descendants pin it; an old-layout
    record's header), ``None`` for a root or a record gone for good."""
    if parent is not None:
        return wire.text(parent)
    if header is not None and header[:1] in (b"{", "{"):
        found = wire.decode_header(header).parent_session
        return None if found is UNSET else found
    return None


STATE_FIELDS: Final = ("instance", "deleted", "mergedinto", "abandoned")
"""A session's state in its record (``decode_state`` takes them in this order, after ``header``)."""
_merged_tuple = msgspec.json.Decoder(tuple[str, int, str])


def decode_state(sid: str, header: bytes | str | None, instance: bytes | str | None, deleted: bytes | str | None,
                 merged: bytes | str | None, abandoned: bytes | str | None) -> wire.SessionState | None:
    """The ``SessionState`` of a record's ``header`` and ``STATE_FIELDS`` (``None``: no such
    session). The first that holds: deleted, disposed, abandoned, merged, live."""
    into = UNSET if merged is None else merged_into(merged)
    by = UNSET if abandoned is None else wire.text(abandoned)
    if deleted is not None:
        return wire.SessionState(id=sid, state="deleted", merged_into=into, abandoned_by=by)
    if header is None:
        return None
    state: wire.SessionStateName = (
        "disposed" if instance is None else "abandoned" if abandoned is not None
        else "merged" if merged is not None else "live")
    return wire.SessionState(id=sid, state=state, merged_into=into, abandoned_by=by)


def merged_into(raw: bytes | str) -> wire.MergedInto:
    """A record's ``mergedinto`` (JSON ``[parent, seq, request id]``)."""
    parent, seq, request_id = _merged_tuple.decode(raw)
    return wire.MergedInto(session=parent, seq=seq, request_id=request_id)
