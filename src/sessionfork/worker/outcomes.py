"""The worker's side of outcomes: a request id's claim and its one outcome, stored under the
request id first, then announced (outcome stream, reply channel), on the queue server. What a
scheduler reads of them, and the shapes both sides agree on, are ``protocol.outcomes``."""

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
from ..core.wire import ForkFailure, Outcome
from ..protocol.outcomes import OUTCOME_NAMES, code_of, short_digest, shown_id

log = logging.getLogger("sessionfork.outcomes")

SCRIPTS = lua.table(
    lua.Spec("claim", ("records*",), ("ttl", "names", "claims*"), __package__),
    lua.Spec("record", ("stream", "records*"), ("ttl", "maxlen", "names", "outcomes*"), __package__),
)
"""The worker's scripts (``scripts/claim.lua``, ``scripts/record.lua`` of this package), by name."""
_ids = msgspec.json.Decoder(list[str])


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


class Finish(Protocol):
    """Commands another layer sends right after a batch's records, in their transaction (a
    worker's RQ success bookkeeping, ``rq_seam.riders.Finished``), on the client ``redis``:
    ``add`` puts them in the pipeline (with every request's outcome, in batch order), ``done``
    gets their replies (raising for an error), ``failed`` hears that the transaction failed."""

    redis: Any

    def add(self, pipe: Any, results: Sequence[Outcome]) -> None: ...

    def done(self, replies: list[Any]) -> None: ...

    def failed(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Pending:
    """One request's outcome in a batch (``Outcomes.record_many``): stored and announced when
    ``store`` (a request that claimed its id, or was refused), else only passed on (a replay's, a
    conflict's). ``digest``: the request's, kept with the outcome (a refused request's);
    ``key``: its request record, when not ``keys.request(reply.request_id)`` (``refuse``)."""

    reply: Outcome
    channel: str = ""
    duration_us: int = 0
    latency_us: int = 0
    store: bool = True
    digest: str = ""
    key: str | bytes | None = None


@dataclass(frozen=True, slots=True)
class Claim:
    """The state of a request id when a worker takes it up."""

    state: str  # NEW | RESUME | DONE | CONFLICT
    children: tuple[str, ...] = ()
    """The children an earlier attempt planned (``RESUME``); a ``NEW`` claim's are the claimant's."""
    snapshot: Snapshot | None = None
    outcome: Outcome | None = None


class Outcomes:
    """The outcome store of one queue server."""

    def __init__(self, redis: Redis, *, ttl: int, stream_maxlen: int, compact: bool = True) -> None:
        self.redis = redis
        self.compact = compact
        """Store a one-child outcome in the compact layout (``core.records``); False: one JSON
        ``outcome`` always (``SESSIONFORK_COMPACT_RECORDS=0``)."""
        self.ttl = ttl
        self.stream_maxlen = stream_maxlen
        self._scripts = lua.Scripts(redis, SCRIPTS)

    def claim_op(self, claims: Sequence[tuple[str, wire.AnyRequest, Sequence[str]]]) -> lua.Op:
        """The claims of ``claims`` (each a request id, its request, whose digest and identity are
        kept for the any-language enqueue's conflict check, and the children it plans if new), in
        order, as one op for ``lua.run`` (a batch's claims are one script call); its result is
        each claim's reply, for ``claim_of``."""
        flat: list[Any] = []
        for _, request, children in claims:
            identity = wire.identity(request)
            flat += [short_digest(wire.digest_of(identity)), wire.encode(list(children)), identity]
        return self._scripts.op("claim", records=[keys.request(request_id) for request_id, _, _ in claims],
                                ttl=self.ttl, names=OUTCOME_NAMES, claims=flat)

    @staticmethod
    def claim_of(reply: list[Any], request_id: str) -> Claim:
        state = wire.text(reply[0])
        if state == "CONFLICT":
            return Claim(state)
        if state == "DONE":
            return Claim(state, outcome=records.decode_outcome(request_id, reply[1:]))
        if state == "NEW":  # the children planned are the claimant's own
            return Claim(state)
        snap = _decode_snapshot(reply[2]) if state == "RESUME" and reply[2] else None
        return Claim(state, tuple(_ids.decode(reply[1])), snap)

    def keep_snapshots(self, fan_outs: Sequence[tuple[str, Snapshot]]) -> list[Snapshot]:
        """Keep each of ``fan_outs``' snapshot (request id, snapshot), so that every child of the
        request gets the same seed, in one transaction (none for none). The first snapshot stored
        wins (two attempts of one request may race); returns each one stored."""
        if not fan_outs:
            return []
        pipe = self.redis.pipeline(transaction=True)
        values = []
        for request_id, snap in fan_outs:
            value = wire.encode(_StoredSnapshot(snap.source, snap.length, snap.seed_length, list(snap.segments),
                                                snap.seed_end, snap.last_type))
            values.append(value)
            pipe.hsetnx(keys.request(request_id), "snapshot", value)
            pipe.hget(keys.request(request_id), "snapshot")
        stored = pipe.execute()[1::2]
        return [snap if raw == value else _decode_snapshot(raw)
                for (_, snap), value, raw in zip(fan_outs, values, stored, strict=True)]

    def planned(self, request_id: str) -> list[str]:
        """The child ids a request's first claim planned ([] when it was never claimed)."""
        raw = self.redis.hget(keys.request(request_id), "children")
        return [] if raw is None else list(_ids.decode(raw))

    def record(self, reply: Outcome, channel: str, *, digest: str = "", duration_us: int = 0,
               latency_us: int = 0, key: str | bytes | None = None) -> Outcome:
        """Store ``reply`` as the request's outcome unless one is stored; announce it if stored now
        (``record_many`` of one). ``key``: the request record, when not
        ``keys.request(reply.request_id)`` (``refuse``). Returns the request's outcome: ``reply``,
        or the outcome stored first."""
        return self.record_many([Pending(reply, channel, duration_us, latency_us, digest=digest, key=key)])[0]

    def record_many(self, batch: Sequence[Pending], finish: Finish | None = None) -> list[Outcome]:
        """Store each of ``batch`` that is to be stored as its request's outcome unless one is
        stored, announcing those stored now, then ``finish``'s commands (with every reply of
        ``batch``), in one transaction when ``finish`` goes on this very client (else ``finish``
        is not sent: its owner sends it). Returns each request's outcome, in order: its reply, or
        the outcome stored first; the reply of one not stored, as it is. A channel the server
        refuses (an ACL user that may not publish on a request's ``replyTo``) is logged as one
        warning line: the outcome is stored and streamed, not published, and its waiter reads it
        from the store."""
        items = [self._record_item(item.reply, item.channel, item.digest, item.duration_us, item.latency_us, item.key)
                 for item in batch if item.store]
        if finish is not None and finish.redis is not self.redis:
            finish = None
        if finish is None:  # the records alone: one script call, atomic on its own
            recorded = lua.run(self.redis, [self._record_op(items)])[0] if items else []
            stored = iter(recorded)
            return [self._stored(item.reply, item.channel, next(stored)) if item.store else item.reply
                    for item in batch]
        pipe = self.redis.pipeline(transaction=True)
        if items:  # every record of the batch: one script call, never without its record (NOSCRIPT)
            lua.add_loaded(pipe, self._record_op(items))
        if finish is not None:
            finish.add(pipe, [item.reply for item in batch])
        try:
            out = pipe.execute(raise_on_error=False)
        except BaseException:
            if finish is not None:
                finish.failed()
            raise
        recorded, rest = (out[0], out[1:]) if items else ([], out)
        if isinstance(recorded, Exception):
            if finish is not None:
                finish.failed()
            raise recorded
        if finish is not None:
            finish.done(rest)
        stored = iter(recorded)
        return [self._stored(item.reply, item.channel, next(stored)) if item.store else item.reply
                for item in batch]

    def _stored(self, reply: Outcome, channel: str, recorded: list[Any]) -> Outcome:
        """The outcome of a request whose record script answered ``recorded`` for ``reply``."""
        stored, *rest = recorded
        if not stored:
            first = records.decode_outcome(reply.request_id, rest)
            assert first is not None
            return first
        if rest:
            log.warning("outcome of request %s stored but not published on %r: %s", reply.request_id,
                        channel, wire.text(rest[0]))
        return reply

    def _record_item(self, reply: Outcome, channel: str, digest: str, duration_us: int, latency_us: int,
                     key: str | bytes | None) -> tuple[str | bytes, list[Any]]:
        """``reply``'s request record and its arguments of ``record.lua`` (see ``record``)."""
        # The compact layout only under the reply's own request id (its key): rebuilt from the key.
        encoded = wire.encode(reply)  # streamed, published and (unless compact) stored: encoded once
        fields = records.outcome_fields(reply, compact=self.compact and key is None, encoded=encoded)
        own = [encoded, channel, short_digest(digest), reply.request_id, code_of(reply), duration_us,
               latency_us, *records.flat(fields)]
        return keys.request(reply.request_id) if key is None else key, [len(own), *own]

    def _record_op(self, items: Sequence[tuple[str | bytes, list[Any]]]) -> lua.Call:
        """One ``record.lua`` call recording ``items`` (``_record_item``'s), in order."""
        return self._scripts.op("record", stream=keys.OUTCOME_STREAM, records=[key for key, _ in items],
                                ttl=self.ttl, maxlen=self.stream_maxlen, names=OUTCOME_NAMES,
                                outcomes=[arg for _, args in items for arg in args])

    def refuse(self, request_id: str | bytes, reason: str, channel: str) -> Outcome:
        """Record ``INVALID_REQUEST`` for a job or queue entry that is not a fork request.

        ``request_id`` is the job id, or a queue entry's raw bytes (any bytes: a newline, a NUL,
        not UTF-8). The outcome is stored under exactly that id (``sf:req:<id>``), where its
        producer looks; the outcome's ``requestId`` (also in the stream and the reply) is
        ``shown_id(id)``: escaped and bounded. Returns the request's outcome (the first stored).
        """
        raw = request_id if isinstance(request_id, bytes) else request_id.encode(errors="surrogateescape")
        failure = ForkFailure(request_id=shown_id(raw), code=ErrorCode.INVALID_REQUEST.value, message=reason)
        return self.record(failure, channel, digest="invalid:job", key=keys.request("").encode() + raw)

    def get(self, request_id: str) -> Outcome | None:
        return records.decode_outcome(request_id, self.redis.hmget(keys.request(request_id),
                                                                   list(records.STORED_OUTCOME)))


def _decode_snapshot(raw: bytes) -> Snapshot:
    s = _snapshot_codec.decode(raw)
    return Snapshot(s.source, s.length, s.seed_length, tuple((a, b, c) for a, b, c in s.segments), s.seed_end,
                    s.last_type)
