"""What producers, clients and workers agree on about an outcome: its stored fields, its digest
form, how an id is shown, and the verdict a waiter reads from a request's record.

Outcomes live on the queue server (a single Redis primary, the one RQ uses), stored under the
request id first, then announced (outcome stream, reply channel). The worker writes them
(``worker.outcomes``); a scheduler reads them (``verdict``, ``read_outcome``; the sync wait itself:
``clients.waiting``). Pub/sub only wakes a waiter: the answer is always the stored outcome (a
published message is not an answer: anyone may publish on a channel).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from redis import Redis

from ..core import keys, records, wire
from ..core.errors import ErrorCode
from ..core.wire import Outcome
from . import operations, rq_layout

DIGEST_CHARS = 32
"""A request digest is kept as its first 32 hex digits (128 bits): enough to tell two requests
apart, half the bytes of a retained record's digest."""


def short_digest(digest: str) -> str:
    """The stored form of a request digest (``invalid:`` digests keep their prefix)."""
    return digest[:DIGEST_CHARS + (8 if digest.startswith("invalid:") else 0)]


def code_of(reply: Outcome) -> str:
    """``OK`` for a result, the error code for a failure: the outcome stream's ``code`` field."""
    return reply.code if isinstance(reply, wire.Failure) else "OK"


SHOWN_ID_MAX = 256
"""Characters of an id that an outcome, a log line or a message shows (a longer one is cut, with "...")."""


def shown_id(raw: bytes) -> str:
    """A request id as it may be shown anywhere: printable, one line, at most ``SHOWN_ID_MAX`` chars.

    A valid id shows as itself. A backslash shows as ``\\\\``, bytes that are not UTF-8 as ``\\xff``,
    other unprintable characters (a newline, a NUL) as Python escapes (``\\n``, ``\\x00``).
    """
    out: list[str] = []
    for ch in raw.decode(errors="surrogateescape"):
        if "\udc80" <= ch <= "\udcff":
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        elif ch == "\\":
            out.append("\\\\")
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(ch.encode("unicode_escape").decode("ascii"))
    text = "".join(out)
    return text if len(text) <= SHOWN_ID_MAX else text[:SHOWN_ID_MAX - 3] + "..."


OUTCOME_FIELDS = records.OUTCOME_FIELDS
"""What a waiter reads of a request's record (``keys.request``), in ``verdict``'s order: the one
stored-outcome read of both clients (``HMGET sf:req:<id> digest outcome child header cwd parent``)."""
OUTCOME_NAMES = " ".join(records.STORED_OUTCOME)
"""The stored outcome's field names, space-separated, as the claim and record scripts take them."""


STREAM_FIELDS = ("requestId", "code", "durationUs", "latencyUs", "reply")
"""The fields of an outcome stream entry (``keys.OUTCOME_STREAM``), in the order the record script
(``worker/scripts/record.lua``) writes them, pinned equal by a test: the request id, ``OK`` or the
error code, the run time and the enqueue-to-outcome latency (microseconds, 0 when unknown), and the
reply event JSON. Named as the wire names its fields (camelCase)."""
OLD_STREAM_FIELDS = {"request": "requestId", "us": "durationUs", "lat": "latencyUs"}
"""The names entries written before 0.2 carry, and the name each stands for (``stream_entry``)."""


def stream_entry(fields: Mapping[Any, Any]) -> dict[str, bytes]:
    """An outcome stream entry's fields by their ``STREAM_FIELDS`` names (text keys, byte values),
    whichever names it was written with (``OLD_STREAM_FIELDS`` too); a numeric field it lacks is
    ``b"0"`` (unknown)."""
    out = {"durationUs": b"0", "latencyUs": b"0"}
    for key, value in fields.items():
        name = wire.text(key)
        out[OLD_STREAM_FIELDS.get(name, name)] = value if isinstance(value, bytes) else str(value).encode()
    return out


def verdict(request_id: str, fields: Sequence[bytes | str | None], digest: str | None,
            op: str = "fork") -> Outcome | None:
    """The answer a request with ``digest`` gets from its record's ``OUTCOME_FIELDS``, or ``None``
    (not answered yet). The one verdict of the sync and the asyncio clients.

    ``IDEMPOTENCY_CONFLICT`` (the failure type of the request's ``op``: ``fork/error``,
    ``merge/error``, ``select/error``) when the id was claimed by a request with another digest; else the
    stored outcome, when it is this request id's. A reply seen on a channel is never an answer: it
    only wakes the waiter, which then reads the record (anyone may publish on a channel).
    """
    stored_digest, *outcome = fields
    stored = None if stored_digest is None else wire.text(stored_digest)
    # An "invalid:" digest marks a request refused before it was understood: its outcome stands.
    if digest is not None and stored and not stored.startswith("invalid:") and stored != short_digest(digest):
        return conflict(request_id, op)
    reply = records.decode_outcome(request_id, outcome)
    return reply if reply is not None and reply.request_id == request_id else None


def addressee(data: Any) -> str | None:
    """The request id a message on a reply channel names, or ``None`` when it is not a reply.

    Used only to decide whom to wake: the answer is always read from the stored outcome.
    """
    if isinstance(data, str):
        data = data.encode()
    if not isinstance(data, bytes):
        return None
    try:
        return wire.decode_reply(data).request_id
    except (msgspec.DecodeError, RecursionError):
        return None  # not a reply: anyone may publish on a channel


def read_outcome(redis: Redis, request_id: str, digest: str | None, op: str = "fork") -> Outcome | None:
    """``verdict`` on the record read now (sync I/O; the asyncio client reads the same fields)."""
    return verdict(request_id, redis.hmget(keys.request(request_id), list(OUTCOME_FIELDS)), digest, op)


def known_keys(request_id: str) -> tuple[str, str]:
    """The keys one of which exists while the queue server knows ``request_id``: its RQ job hash
    (queued or running) and its record (answered, or claimed). One ``EXISTS`` of both reads them
    at one instant: the worker stores the outcome before, or in the transaction where, the job
    goes."""
    return rq_layout.job_key(request_id), keys.request(request_id)


def is_known(redis: Redis, request_id: str) -> bool:
    """Whether ``request_id`` is queued, running or answered on ``redis`` now (``known_keys``)."""
    return int(redis.exists(*known_keys(request_id))) > 0


def conflict(request_id: str, op: str = "fork") -> wire.Failure:
    """The ``IDEMPOTENCY_CONFLICT`` reply of an ``op`` request whose id another request used."""
    return operations.of(op).failed(request_id, ErrorCode.IDEMPOTENCY_CONFLICT.value,
                         f'request id "{request_id}" was already used for a different request')
