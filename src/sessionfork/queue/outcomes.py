"""Outcomes: stored under the request id first, then announced (outcome stream, reply channel).

Lives on the queue server (a single Redis primary, the one RQ uses). ``Outcomes`` is the worker's
side (claim, record); ``OUTCOME_FIELDS``, ``verdict`` and ``wait_for_reply`` are the scheduler's
side. A waiter subscribes first and then reads the stored outcome, so a reply published before it
listened, or while it reconnected, is never lost; pub/sub only wakes it: the answer is always the
stored outcome (a published message is not an answer: anyone may publish on a channel).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..core import keys, lua, wire
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


@dataclass(frozen=True, slots=True)
class Claim:
    """The state of a request id when a worker takes it up."""

    state: str  # NEW | RESUME | DONE | CONFLICT
    children: tuple[str, ...] = ()
    snapshot: Snapshot | None = None
    outcome: Reply | None = None


class Outcomes:
    """The outcome store of one queue server."""

    def __init__(self, redis: Redis, *, ttl: int, stream_maxlen: int) -> None:
        self.redis = redis
        self.ttl = ttl
        self.stream_maxlen = stream_maxlen
        self._scripts = lua.Scripts(redis)

    def claim_op(self, request_id: str, request: wire.ForkRequest, children: Sequence[str]) -> lua.Op:
        """The claim of ``request_id`` for ``request`` (its digest and identity, kept for the
        any-language enqueue's conflict check), planning ``children`` if new, as an op for
        ``lua.run``; ``claim_of`` reads its result."""
        return self._scripts.op("claim", record=keys.request(request_id), digest=short_digest(wire.digest(request)),
                                children=wire.encode(list(children)), ttl=self.ttl, identity=wire.identity(request))

    @staticmethod
    def claim_of(reply: list[Any]) -> Claim:
        state = wire.text(reply[0])
        if state == "CONFLICT":
            return Claim(state)
        if state == "DONE":
            return Claim(state, outcome=wire.decode_reply(reply[1]))
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
               latency_us: int = 0, key: str | bytes | None = None) -> Reply:
        """Store ``reply`` as the request's outcome unless one is stored; announce it if stored now.

        ``key``: the request record, when not ``keys.request(reply.request_id)`` (``refuse``).
        Returns the request's outcome: ``reply``, or the outcome stored first. A channel the
        server refuses (an ACL user that may not publish on a request's ``replyTo``) is logged as
        one warning line: the outcome is stored and streamed, not published, and its waiter reads
        it from the store.
        """
        raw = wire.encode(reply)
        stored, outcome, *refused = self._scripts(
            "record", record=keys.request(reply.request_id) if key is None else key, stream=keys.OUTCOME_STREAM,
            outcome=raw, channel=channel, ttl=self.ttl, maxlen=self.stream_maxlen, digest=short_digest(digest),
            request_id=reply.request_id, code=code_of(reply), run_us=duration_us, latency_us=latency_us)
        if refused:
            log.warning("outcome of request %s stored but not published on %r: %s", reply.request_id,
                        channel, wire.text(refused[0]))
        return reply if stored else wire.decode_reply(outcome)

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
        raw = self.redis.hget(keys.request(request_id), "outcome")
        return None if raw is None else wire.decode_reply(raw)


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


OUTCOME_FIELDS = ("digest", "outcome")
"""What a waiter reads of a request's record (``keys.request``), in ``verdict``'s order: the one
stored-outcome read of both clients (``HMGET sf:req:<id> digest outcome``)."""


def verdict(request_id: str, fields: Sequence[bytes | str | None], digest: str | None) -> Reply | None:
    """The answer a request with ``digest`` gets from its record's ``OUTCOME_FIELDS``, or ``None``
    (not answered yet). The one verdict of the sync and the asyncio clients.

    ``IDEMPOTENCY_CONFLICT`` when the id was claimed by a request with another digest; else the
    stored outcome, when it is this request id's. A reply seen on a channel is never an answer: it
    only wakes the waiter, which then reads the record (anyone may publish on a channel).
    """
    stored_digest, outcome = fields
    stored = None if stored_digest is None else wire.text(stored_digest)
    # An "invalid:" digest marks a request refused before it was understood: its outcome stands.
    if digest is not None and stored and not stored.startswith("invalid:") and stored != short_digest(digest):
        return conflict(request_id)
    if outcome is None:
        return None
    reply = wire.decode_reply(outcome)
    return reply if reply.request_id == request_id else None


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


def wait_for_reply(redis: Redis, request_id: str, channel: str, timeout: float,
                   *, digest: str | None = None, recheck_every: float = 1.0) -> Reply | None:
    """Wait up to ``timeout`` seconds for the outcome of ``request_id``; ``None`` on time-out.

    Subscribes to ``channel`` and waits for the server's confirmation, then reads the stored
    outcome, then listens. A message naming the request only wakes the waiter: the answer is the
    stored outcome read then (a message with nothing stored behind it is ignored: anyone may
    publish). The stored outcome is read again after a dropped connection and every
    ``recheck_every`` seconds without news, so a reply is never lost: not one published before the
    waiter listened, nor one announced on another channel (an earlier submission of the same
    request with another ``replyTo``). With ``digest``, a request id already used by a different
    request answers ``IDEMPOTENCY_CONFLICT``.
    """
    deadline = time.monotonic() + timeout
    pubsub = redis.pubsub()  # type: ignore[no-untyped-call]
    try:
        subscribed = False
        while True:
            try:
                if not subscribed:
                    pubsub.subscribe(channel)
                    if not _confirmed(pubsub, deadline):
                        return None
                    subscribed = True
                found = read_outcome(redis, request_id, digest)
                if found is not None:
                    return found
                if not _woken(pubsub, request_id, deadline, recheck_every):
                    return None
            except (RedisConnectionError, RedisTimeoutError):
                if time.monotonic() >= deadline:
                    return None
                time.sleep(0.05)  # back off before reconnecting; not synchronisation
                subscribed = False
    finally:
        _release(pubsub)


def _release(pubsub: Any, confirm_within: float = 1.0) -> None:
    """End a wait: unsubscribe and give the connection back to its pool open, once the server has
    confirmed the UNSUBSCRIBE (every message before it drained, so the next user reads only its
    own replies). A new connection per wait costs the server more CPU than the wait itself.
    Unconfirmed (or any connection error): the connection is closed, as ``PubSub.close`` does."""
    conn = pubsub.connection
    try:
        if conn is not None and pubsub.subscribed:
            pubsub.unsubscribe()
            until = time.monotonic() + confirm_within
            while pubsub.subscribed and (left := until - time.monotonic()) > 0:
                pubsub.get_message(timeout=left)
            if not pubsub.subscribed:
                conn.deregister_connect_callback(pubsub.on_connect)
                pubsub.connection = None
                pubsub.connection_pool.release(conn)
    except (RedisConnectionError, RedisTimeoutError):
        pass  # closed below
    finally:
        pubsub.close()


def _confirmed(pubsub: Any, deadline: float) -> bool:
    """Wait for the server to confirm a SUBSCRIBE (a store read before it could miss a reply
    published in between); ``False`` at the deadline."""
    while (left := deadline - time.monotonic()) > 0:
        message = pubsub.get_message(timeout=left)
        if message is not None and message["type"] == "subscribe":
            return True
    return False


def _woken(pubsub: Any, request_id: str, deadline: float, recheck_every: float) -> bool:
    """Listen until a message names ``request_id``, the subscription is renewed (a reconnection:
    replies may have been missed) or ``recheck_every`` passes quietly (``True``: read the store
    again), or until the deadline passes (``False``)."""
    while (left := deadline - time.monotonic()) > 0:
        message = pubsub.get_message(timeout=min(left, recheck_every))
        if message is None or message["type"] == "subscribe" or addressee(message["data"]) == request_id:
            return True
    return False


def conflict(request_id: str) -> ForkFailure:
    return ForkFailure(request_id=request_id, code=ErrorCode.IDEMPOTENCY_CONFLICT.value,
                       message=f'request id "{request_id}" was already used for a different request')
