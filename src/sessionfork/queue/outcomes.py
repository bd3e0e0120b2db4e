"""Outcomes: stored under the request id first, then announced (outcome stream, reply channel).

Lives on the queue server (a single Redis primary, the one RQ uses). ``Outcomes`` is the worker's
side (claim, record); ``OUTCOME_FIELDS``, ``verdict`` and ``read_outcome`` are the scheduler's
side (the sync wait itself: ``waiting``). Pub/sub only wakes a waiter: the answer is always the
stored outcome (a published message is not an answer: anyone may publish on a channel).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
from redis import Redis

from ..core import keys, lua, records, wire
from ..core.errors import ErrorCode
from ..core.snapshots import Snapshot
from ..core.wire import ForkFailure, Reply

log = logging.getLogger("sessionfork.outcomes")
_ids = msgspec.json.Decoder(list[str])
DIGEST_CHARS = 32
"""A request digest is kept as its first 32 hex digits (128 bits): enough to tell two requests
apart, half the bytes of a retained record's digest."""


def short_digest(digest: str) -> str:
    """The stored form of a request digest (``invalid:`` digests keep their prefix)."""
    return digest[:DIGEST_CHARS + (8 if digest.startswith("invalid:") else 0)]


class _StoredSnapshot(msgspec.Struct, array_like=True):
    """A fan-out's snapshot as kept in its request record: a JSON array. The last two fields came
    with boundary forks; arrays stored before them have four items and decode with the defaults."""

    source: wire.Header
    length: int
    seed_length: int
    segments: list[tuple[str, int, int]]
    seed_end: int | None = None
    last_type: str | None = None


_snapshot_codec = msgspec.json.Decoder(_StoredSnapshot)


def code_of(reply: Reply) -> str:
    """``OK`` for a result, the error code for a failure: the outcome stream's ``code`` field."""
    return reply.code if isinstance(reply, ForkFailure) else "OK"


class Then(Protocol):
    """Commands another layer sends right after an outcome's record, in its transaction (a
    worker's RQ success bookkeeping, ``rq_seam.riders.JobFinish``), on the client ``redis``:
    ``add`` puts them in the pipeline (``reply``: the outcome recorded), ``done`` gets their
    replies (raising for an error), ``failed`` hears that the transaction failed."""

    redis: Any

    def add(self, pipe: Any, reply: Reply) -> None: ...

    def done(self, replies: list[Any]) -> None: ...

    def failed(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Claim:
    """The state of a request id when a worker takes it up."""

    state: str  # NEW | RESUME | DONE | CONFLICT
    children: tuple[str, ...] = ()
    snapshot: Snapshot | None = None
    outcome: Reply | None = None


class Outcomes:
    """The outcome store of one queue server."""

    def __init__(self, redis: Redis, *, ttl: int, stream_maxlen: int, compact: bool = True) -> None:
        self.redis = redis
        self.compact = compact
        """Store a one-child outcome in the compact layout (``core.records``); False: one JSON
        ``outcome`` always (``SESSIONFORK_COMPACT_RECORDS=0``)."""
        self.ttl = ttl
        self.stream_maxlen = stream_maxlen
        self._scripts = lua.Scripts(redis)

    def claim_op(self, request_id: str, request: wire.ForkRequest, children: Sequence[str]) -> lua.Op:
        """The claim of ``request_id`` for ``request`` (its digest and identity, kept for the
        any-language enqueue's conflict check), planning ``children`` if new, as an op for
        ``lua.run``; ``claim_of`` reads its result."""
        return self._scripts.op("claim", record=keys.request(request_id), digest=short_digest(wire.digest(request)),
                                children=wire.encode(list(children)), ttl=self.ttl, identity=wire.identity(request),
                                names=_NAMES)

    @staticmethod
    def claim_of(reply: list[Any], request_id: str) -> Claim:
        state = wire.text(reply[0])
        if state == "CONFLICT":
            return Claim(state)
        if state == "DONE":
            return Claim(state, outcome=records.decode_outcome(request_id, reply[1:]))
        snap = _decode_snapshot(reply[2]) if state == "RESUME" and reply[2] else None
        return Claim(state, tuple(_ids.decode(reply[1])), snap)

    def keep_snapshot(self, request_id: str, snap: Snapshot) -> Snapshot:
        """Keep a fan-out's snapshot so that every child of the request gets the same seed.

        The first snapshot stored wins (two attempts of one request may race); returns it.
        """
        value = wire.encode(_StoredSnapshot(snap.source, snap.length, snap.seed_length, list(snap.segments),
                                            snap.seed_end, snap.last_type))
        pipe = self.redis.pipeline(transaction=True)
        pipe.hsetnx(keys.request(request_id), "snapshot", value)
        pipe.hget(keys.request(request_id), "snapshot")
        _, stored = pipe.execute()
        return snap if stored == value else _decode_snapshot(stored)

    def planned(self, request_id: str) -> list[str]:
        """The child ids a request's first claim planned ([] when it was never claimed)."""
        raw = self.redis.hget(keys.request(request_id), "children")
        return [] if raw is None else list(_ids.decode(raw))

    def record(self, reply: Reply, channel: str, *, digest: str = "", duration_us: int = 0,
               latency_us: int = 0, key: str | bytes | None = None, then: Then | None = None) -> Reply:
        """Store ``reply`` as the request's outcome unless one is stored; announce it if stored now.

        ``key``: the request record, when not ``keys.request(reply.request_id)`` (``refuse``).
        ``then``: commands that follow the record in its round trip, when they go on this very
        client (``_record_then``: one transaction). Returns the request's outcome: ``reply``, or
        the outcome stored first. A channel the server refuses (an ACL user that may not publish
        on a request's ``replyTo``) is logged as one warning line: the outcome is stored and
        streamed, not published, and its waiter reads it from the store.
        """
        raw = wire.encode(reply)
        # The compact layout only under the reply's own request id (its key): rebuilt from the key.
        fields = records.outcome_fields(reply, compact=self.compact and key is None)
        named = dict(record=keys.request(reply.request_id) if key is None else key, stream=keys.OUTCOME_STREAM,
                     outcome=raw, channel=channel, ttl=self.ttl, maxlen=self.stream_maxlen,
                     digest=short_digest(digest), request_id=reply.request_id, code=code_of(reply),
                     run_us=duration_us, latency_us=latency_us, names=_NAMES, fields=records.flat(fields))
        if then is not None and then.redis is self.redis:
            stored, *rest = self._record_then(reply, named, then)
        else:
            stored, *rest = self._scripts("record", **named)
        if not stored:
            first = records.decode_outcome(reply.request_id, rest)
            assert first is not None
            return first
        if rest:
            log.warning("outcome of request %s stored but not published on %r: %s", reply.request_id,
                        channel, wire.text(rest[0]))
        return reply

    def _record_then(self, reply: Reply, named: dict[str, Any], then: Then) -> Any:
        """The record script, then ``then``'s commands, in one transaction (``lua.run_loaded``: all
        or nothing, and never ``then``'s without the record on a server that lost its scripts)."""
        try:
            recorded, replies = lua.run_loaded(self.redis, self._scripts.op("record", **named),
                                               lambda pipe: then.add(pipe, reply))
        except BaseException:
            then.failed()
            raise
        if isinstance(recorded, Exception):
            then.failed()
            raise recorded
        then.done(replies)
        return recorded

    def refuse(self, request_id: str | bytes, reason: str, channel: str) -> Reply:
        """Record ``INVALID_REQUEST`` for a job or queue entry that is not a fork request.

        ``request_id`` is the job id, or a queue entry's raw bytes (any bytes: a newline, a NUL,
        not UTF-8). The outcome is stored under exactly that id (``sf:req:<id>``), where its
        producer looks; the outcome's ``requestId`` (also in the stream and the reply) is
        ``shown_id(id)``: escaped and bounded. Returns the request's outcome (the first stored).
        """
        raw = request_id if isinstance(request_id, bytes) else request_id.encode(errors="surrogateescape")
        failure = ForkFailure(request_id=shown_id(raw), code=ErrorCode.INVALID_REQUEST.value, message=reason)
        return self.record(failure, channel, digest="invalid:job", key=keys.request("").encode() + raw)

    def get(self, request_id: str) -> Reply | None:
        return records.decode_outcome(request_id, self.redis.hmget(keys.request(request_id),
                                                                   list(records.STORED_OUTCOME)))


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


def _decode_snapshot(raw: bytes) -> Snapshot:
    s = _snapshot_codec.decode(raw)
    return Snapshot(s.source, s.length, s.seed_length, tuple((a, b, c) for a, b, c in s.segments), s.seed_end,
                    s.last_type)


OUTCOME_FIELDS = records.OUTCOME_FIELDS
"""What a waiter reads of a request's record (``keys.request``), in ``verdict``'s order: the one
stored-outcome read of both clients (``HMGET sf:req:<id> digest outcome child header cwd parent``)."""
_NAMES = " ".join(records.STORED_OUTCOME)


def verdict(request_id: str, fields: Sequence[bytes | str | None], digest: str | None) -> Reply | None:
    """The answer a request with ``digest`` gets from its record's ``OUTCOME_FIELDS``, or ``None``
    (not answered yet). The one verdict of the sync and the asyncio clients.

    ``IDEMPOTENCY_CONFLICT`` when the id was claimed by a request with another digest; else the
    stored outcome, when it is this request id's. A reply seen on a channel is never an answer: it
    only wakes the waiter, which then reads the record (anyone may publish on a channel).
    """
    stored_digest, *outcome = fields
    stored = None if stored_digest is None else wire.text(stored_digest)
    # An "invalid:" digest marks a request refused before it was understood: its outcome stands.
    if digest is not None and stored and not stored.startswith("invalid:") and stored != short_digest(digest):
        return conflict(request_id)
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


def read_outcome(redis: Redis, request_id: str, digest: str | None) -> Reply | None:
    """``verdict`` on the record read now (sync I/O; the asyncio client reads the same fields)."""
    return verdict(request_id, redis.hmget(keys.request(request_id), list(OUTCOME_FIELDS)), digest)


def conflict(request_id: str) -> ForkFailure:
    return ForkFailure(request_id=request_id, code=ErrorCode.IDEMPOTENCY_CONFLICT.value,
                       message=f'request id "{request_id}" was already used for a different request')
