"""Sessions in Redis: create, append, read, dispose (the registry's base; ``registry`` adds forks).

Every read and write of the session layout (see ``keys``) goes through ``registry.Registry``. Each
atomic step touches the keys of one session only (one hash slot), so the registry runs unchanged
on a single server or a Redis Cluster.

Seeds are kept by reference; reading a log across its lineage is ``logs.LogReader``, the store's base.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

from msgspec import UNSET
from redis import Redis
from redis.cluster import RedisCluster

from ..core import errors, keys, lua, records, rules, wire
from .factories import new_call_id, new_instance_token, new_session_id, now_ms
from .logs import LogReader
from .wire import Event, Header, LiveHandle, NewEvent

SessionRef: TypeAlias = "str | LiveHandle"
"""A session named by id (any live instance) or by live handle (that instance only)."""


def split_ref(ref: SessionRef) -> tuple[str, str]:
    """``(id, instance)`` of a session reference (instance ``""``: any live one), ids checked."""
    if isinstance(ref, LiveHandle):
        rules.check_text(ref.instance, f"instance token of {rules.echo(ref.id)}")
        if not ref.instance:  # "" means "any live instance" to the scripts: never from a handle
            raise errors.invalid(f"live handle of {rules.echo(ref.id)} has an empty instance token")
        return rules.check_id(ref.id), ref.instance
    return rules.check_id(ref), ""


class SessionStore(LogReader):
    """Sessions on one Redis connection (a ``Redis`` or a ``RedisCluster``); see ``Registry``.

    ``clock`` returns Unix epoch milliseconds; ``new_id``, ``new_token`` and ``new_call_id`` make
    session ids, instance tokens and append-call ids. All are injected so tests can pin them.
    """

    def __init__(
        self,
        redis: Redis | RedisCluster,
        *,
        clock: Callable[[], int] = now_ms,
        new_id: Callable[[], str] = new_session_id,
        new_token: Callable[[], str] = new_instance_token,
        new_call_id: Callable[[], str] = new_call_id,
        max_event_bytes: int = 1024 * 1024,
        lifecycle_maxlen: int = 1_000_000,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
        compact_records: bool = True,
    ) -> None:
        self.redis = redis
        self.compact_records = compact_records
        """Write records in the compact layout (``records``); False: the old one, for readers of an
        earlier version still running (``SESSIONFORK_COMPACT_RECORDS=0``)."""
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        self.max_event_bytes = max_event_bytes
        self.lifecycle_maxlen = lifecycle_maxlen
        # On a single server the scripts append lifecycle events atomically with their change; on
        # a cluster the stream lives in another slot, so the registry appends them right after.
        self._cluster = isinstance(redis, RedisCluster)
        self._lineages = OrderedDict()
        self._lifecycle_key = None if self._cluster else keys.LIFECYCLE_STREAM  # an optional script key
        self._clock = clock
        self._new_id = new_id
        self._new_token = new_token
        self._new_call_id = new_call_id
        self._scripts = lua.Scripts(redis)

    # -- lifecycle -----------------------------------------------------------------------------

    def create(self, session_id: str | None = None, *, cwd: str | None = None) -> LiveHandle:
        """Create a live session; raises ``SESSION_ALREADY_EXISTS`` if the id was ever used.

        A session id outside the id rule, or a ``cwd`` that is not text, is ``INVALID_REQUEST``
        before any Redis call."""
        sid = rules.check_id(session_id) if session_id is not None else self._new_id()
        if cwd is not None:
            rules.check_text(cwd, "cwd")
        header = Header(version=wire.HEADER_VERSION, id=sid, created_at=self._clock(),
                        cwd=UNSET if cwd is None else cwd)
        token = self._new_token()
        created = self._scripts("create", record=keys.session(sid), log=keys.session_log(sid),
                                turns=keys.session_turns(sid), lifecycle=self._lifecycle_key,
                                **records.create_args(header, compact=self.compact_records), instance=token,
                                length=0, seed_length=0, seed="[]", last_type="",
                                request_id="", maxlen=self.lifecycle_maxlen, session_id=sid, seed_end=-1,
                                parent_header="", last_end="", markers="", summary="", need="", parent_stored="",
                                parent_cwd="", parent_parent="", edits=())
        if created is None:
            raise errors.already_exists(sid)
        if self._cluster:
            self._emit(self.redis, "session/created", sid, 0)
        return LiveHandle(sid, token)

    def append(self, session: SessionRef, events: Sequence[NewEvent], *,
               expect_length: int | None = None, time_ms: int | None = None) -> list[Event]:
        """Append events to a live session; returns them with their ``seq`` and ``time``.

        Concurrent appenders never produce a gap or a duplicate seq (the script assigns the
        positions). A batch holding a ``turn/end`` emits ``session/flush``. With
        ``expect_length``, nothing is appended unless the log has exactly that many events
        (``LengthMoved``). Raises ``SESSION_NOT_FOUND``, ``SESSION_NOT_LIVE``, and
        ``INVALID_REQUEST`` for an event over ``max_event_bytes``, or whose data is not JSON that
        reads back identically (``wire.encode_stored_event``), before any Redis call.
        """
        sid, instance = split_ref(session)
        if not isinstance(events, Sequence) or isinstance(events, str | bytes):
            raise errors.invalid(f"events must be a sequence of NewEvent, got {type(events).__name__}")
        if not events:
            live = self.instance(sid)
            if live is None:
                raise errors.not_found(sid)
            if instance and live != instance:
                raise errors.not_live(sid)
            return []
        ts = self._clock() if time_ms is None else time_ms
        payload = self.encode_events(events, ts)
        flush = any(e.type == rules.TURN_END for e in events)
        markers = " ".join(map(str, rules.batch_markers([e.type for e in events])))
        first = int(self._scripts(
            "append", record=keys.session(sid), log=keys.session_log(sid), turns=keys.session_turns(sid),
            lifecycle=self._lifecycle_key, instance=instance, last_type=events[-1].type,
            expect_length="" if expect_length is None else expect_length, flush="1" if flush else "0",
            maxlen=self.lifecycle_maxlen, session_id=sid, call_id=self._new_call_id(), markers=markers,
            events=payload))
        if first == -3:
            raise LengthMoved(sid)
        self._raise_for(first, sid)
        if flush and self._cluster:
            self._emit(self.redis, "session/flush", sid, first + len(events))
        return [Event(e.type, first + i, ts, e.data, dict(e.extra)) for i, e in enumerate(events)]

    def encode_events(self, events: Sequence[NewEvent], time_ms: int) -> list[bytes]:
        """The stored JSON of ``events`` at ``time_ms``: ``INVALID_REQUEST`` for an event that is
        not JSON that reads back identically, or over ``max_event_bytes`` (``append``'s rules)."""
        payload = [wire.encode_stored_event(e, time_ms) for e in events]
        for i, raw in enumerate(payload):
            if len(raw) > self.max_event_bytes:
                raise errors.invalid(f"event {i} is {len(raw)} bytes, over the limit of {self.max_event_bytes}")
        return payload

    def dispose(self, session: SessionRef) -> None:
        """End the live incarnation; header and events stay readable, the id is never reused.

        The session enters the retention index (``keys.DISPOSED_INDEX``, scored by this time).
        """
        sid, instance = split_ref(session)
        now = self._clock()
        status = int(self._scripts("dispose", record=keys.session(sid), lifecycle=self._lifecycle_key,
                                   disposed=None if self._cluster else keys.DISPOSED_INDEX, instance=instance,
                                   maxlen=self.lifecycle_maxlen, session_id=sid, now=now))
        self._raise_for(status, sid)
        if self._cluster:  # the index and the stream live in other slots: right after the change
            self.redis.zadd(keys.DISPOSED_INDEX, {sid: now})
            self._emit(self.redis, "session/disposed", sid, self.length(sid))

    def flush(self, session_id: str) -> None:
        """Emit ``session/flush`` on demand: persistence backends write what they miss."""
        sid = rules.check_id(session_id)
        self.header(sid)  # SESSION_NOT_FOUND for an id never created
        self._emit(self.redis, "session/flush", sid, self.length(sid))

    def _emit(self, client: Any, kind: str, sid: str, length: int) -> None:
        client.xadd(keys.LIFECYCLE_STREAM, {"type": kind, "id": sid, "len": length},
                    maxlen=self.lifecycle_maxlen, approximate=True)

    @staticmethod
    def _raise_for(status: int, sid: str) -> None:
        if status == -1:
            raise errors.not_found(sid)
        if status == -2:
            raise errors.not_live(sid)

    # -- reads (the log itself, seed included: ``logs.LogReader``) -----------------------------

    def header(self, session_id: str) -> Header:
        """The header of a session, live or disposed; ``SESSION_NOT_FOUND`` if never created."""
        sid = rules.check_id(session_id)
        raw, cwd, parent = self.redis.hmget(keys.session(sid), list(records.HEADER_FIELDS))
        if raw is None:
            raise errors.not_found(sid)
        return records.decode_header(sid, raw, cwd, parent)

    def instance(self, session_id: str) -> str | None:
        """The live instance token, or ``None`` when the session is not live."""
        raw = self.redis.hget(keys.session(rules.check_id(session_id)), "instance")
        return None if raw is None else wire.text(raw)

    def length(self, session_id: str) -> int:
        raw = self.redis.hget(keys.session(rules.check_id(session_id)), "len")
        return 0 if raw is None else int(raw)

    def last_turn_end(self, session_id: str) -> int | None:
        """The seq of the session's newest ``turn/end`` (its last completed turn), seed included:
        one O(1) read, kept by every append. ``None`` when it has none (or is a record written
        before turn indexes). Always a valid fork boundary, now and after any later append (the
        events up to it never change), so ``fork(..., boundary=last_turn_end(id))`` forks a
        running session at its last completed turn. ``SESSION_NOT_FOUND`` if never created.
        """
        sid = rules.check_id(session_id)
        header, raw = self.redis.hmget(keys.session(sid), ["header", "lastend"])
        if header is None:
            raise errors.not_found(sid)
        return None if raw is None or int(raw) < 0 else int(raw)

    def exists(self, session_id: str) -> bool:
        """True for a live or disposed session; False when never created or deleted."""
        return bool(self.redis.hexists(keys.session(rules.check_id(session_id)), "header"))

    def children(self, session_id: str) -> list[str]:
        """Ids of the sessions forked from this one, sorted."""
        members = self.redis.smembers(keys.session_children(rules.check_id(session_id)))
        return sorted(wire.text(m) for m in members)


class LengthMoved(Exception):
    """``append(expect_length=...)`` found the log at another length: re-read and try again."""
