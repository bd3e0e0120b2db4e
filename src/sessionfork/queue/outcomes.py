"""Outcomes: stored under the request id first, then announced (outcome stream, reply channel).

Lives on the queue server (a single Redis primary, the one RQ uses). ``Outcomes`` is the worker's
side (claim, record); ``wait_for_reply`` is the scheduler's side. A waiter subscribes first and
then reads the stored outcome, so a reply published before it listened, or while it reconnected,
is never lost.
"""

from __future__ import annotations

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
               latency_us: int = 0) -> Reply:
        """Store ``reply`` as the request's outcome unless one is stored; announce it if stored now.

        Returns the request's outcome: ``reply``, or the outcome stored first.
        """
        raw = wire.encode(reply)
        stored, outcome = self._scripts(
            "record", record=keys.request(reply.request_id), stream=keys.OUTCOME_STREAM, outcome=raw,
            channel=channel, ttl=self.ttl, maxlen=self.stream_maxlen, digest=short_digest(digest),
            request_id=reply.request_id, code=code_of(reply), run_us=duration_us, latency_us=latency_us)
        return reply if stored else wire.decode_reply(outcome)

    def refuse(self, request_id: str, reason: str, channel: str) -> Reply | None:
        """Record ``INVALID_REQUEST`` for a job or queue entry that is not a fork request.

        Returns the request's outcome (the first one stored), or ``None`` when ``request_id`` is
        empty, over 256 characters or not printable text: no producer can be waiting on it.
        """
        if not request_id or len(request_id) > 256 or not request_id.isprintable():
            return None
        failure = ForkFailure(request_id=request_id, code=ErrorCode.INVALID_REQUEST.value, message=reason)
        return self.record(failure, channel, digest="invalid:job")

    def get(self, request_id: str) -> Reply | None:
        raw = self.redis.hget(keys.request(request_id), "outcome")
        return None if raw is None else wire.decode_reply(raw)


def _decode_snapshot(raw: bytes) -> Snapshot:
    s = _snapshot_codec.decode(raw)
    return Snapshot(s.source, s.length, s.seed_length, tuple((a, b, c) for a, b, c in s.segments), s.seed_end,
                    s.last_type)


def wait_for_reply(redis: Redis, request_id: str, channel: str, timeout: float,
                   *, digest: str | None = None, recheck_every: float = 1.0) -> Reply | None:
    """Wait up to ``timeout`` seconds for the outcome of ``request_id``; ``None`` on time-out.

    Subscribes to ``channel``, then reads the stored outcome, then listens. The stored outcome is
    read again after a dropped connection and every ``recheck_every`` seconds without news, so a
    reply is never lost: not one published before the waiter listened, nor one announced on
    another channel (an earlier submission of the same request with another ``replyTo``). A
    message that is not a reply, or is another request's, is ignored. With
    ``digest``, a request id already used by a different request answers ``IDEMPOTENCY_CONFLICT``.
    """
    deadline = time.monotonic() + timeout
    needle = request_id.encode()
    pubsub = redis.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    try:
        subscribed = False
        while True:
            try:
                if not subscribed:
                    pubsub.subscribe(channel)
                    subscribed = True
                found = _stored(redis, request_id, digest)
                if found is not None:
                    return found
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    message = pubsub.get_message(timeout=min(left, recheck_every))
                    if message is None:
                        break  # quiet for a while: read the store again
                    data = message["data"]
                    data = data.encode() if isinstance(data, str) else data
                    if isinstance(data, bytes) and needle in data:
                        try:
                            reply = wire.decode_reply(data)
                        except (msgspec.DecodeError, RecursionError):
                            continue  # not a reply: anyone may publish on a channel
                        if reply.request_id == request_id:
                            return _stored(redis, request_id, digest) or reply
            except (RedisConnectionError, RedisTimeoutError):
                if time.monotonic() >= deadline:
                    return None
                time.sleep(0.05)  # back off before reconnecting; not synchronisation
                subscribed = False
    finally:
        pubsub.close()


def _stored(redis: Redis, request_id: str, digest: str | None) -> Reply | None:
    stored_digest, outcome = redis.hmget(keys.request(request_id), ["digest", "outcome"])
    return judge(request_id, stored_digest, outcome, digest)


def judge(request_id: str, stored_digest: bytes | str | None, outcome: bytes | str | None,
          digest: str | None) -> Reply | None:
    """The answer a request with ``digest`` gets from its request id's record (digest, outcome).

    ``IDEMPOTENCY_CONFLICT`` when the id was claimed by a request with another digest; the stored
    outcome; else ``None`` (not answered yet). Shared by the sync and the asyncio waiters.
    """
    stored = None if stored_digest is None else wire.text(stored_digest)
    # An "invalid:" digest marks a request refused before it was understood: its outcome stands.
    if digest is not None and stored and not stored.startswith("invalid:") and stored != short_digest(digest):
        return conflict(request_id)
    return None if outcome is None else wire.decode_reply(outcome)


def conflict(request_id: str) -> ForkFailure:
    return ForkFailure(request_id=request_id, code=ErrorCode.IDEMPOTENCY_CONFLICT.value,
                       message=f'request id "{request_id}" was already used for a different request')
