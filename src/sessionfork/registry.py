"""Sessions in Redis: create, append, read, dispose, and the two atomic steps of a fork.

Every read and write of the session layout (see ``keys``) goes through ``Registry``. Each atomic
step touches the keys of one session only (one hash slot), so the registry runs unchanged on a
single server or a Redis Cluster.

Seeds are kept by reference: a forked child's record lists the ancestor log slices it inherits
(immutable, since logs are append-only), so a fork costs the same whatever the parent's length and
a child uses memory only for its own events. Reading resolves the references in one pipelined
round trip after the record is read.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from msgspec import UNSET
from redis import Redis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError

from . import errors, keys, lua, rules, wire
from .factories import new_call_id, new_instance_token, new_session_id, now_ms
from .snapshots import ForkPlan, Snapshot, decode_segments, parse_snapshot
from .wire import Event, Header, LiveHandle, NewEvent

SessionRef: TypeAlias = "str | LiveHandle"
"""A session named by id (any live instance) or by live handle (that instance only)."""


_LINEAGE_CACHE = 4096  # sessions whose seed references a registry remembers (they never change)


def _unpack(ref: SessionRef) -> tuple[str, str]:
    if isinstance(ref, LiveHandle):
        if not ref.instance:  # "" means "any live instance" to the scripts: never from a handle
            raise errors.invalid(f"live handle of {ref.id!r} has an empty instance token")
        return rules.check_id(ref.id), ref.instance
    return rules.check_id(ref), ""


@dataclass(frozen=True, slots=True)
class _Record:
    header: Header
    length: int
    seed_length: int
    segments: tuple[tuple[str, int, int], ...]


class Registry:
    """The session registry on one Redis connection (a ``Redis`` or a ``RedisCluster``).

    ``clock`` returns Unix epoch milliseconds; ``new_id`` and ``new_token`` make session ids and
    instance tokens. All three are injected so tests can pin them.
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
    ) -> None:
        self.redis = redis
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        self.max_event_bytes = max_event_bytes
        self.lifecycle_maxlen = lifecycle_maxlen
        # On a single server the scripts append lifecycle events atomically with their change; on
        # a cluster the stream lives in another slot, so the registry appends them right after.
        self._cluster = isinstance(redis, RedisCluster)
        self._lineages: OrderedDict[str, tuple[int, tuple[tuple[str, int, int], ...]]] = OrderedDict()
        self._lifecycle = [] if self._cluster else [keys.LIFECYCLE_STREAM]
        self._clock = clock
        self._new_id = new_id
        self._new_token = new_token
        self._new_call_id = new_call_id
        self._create = lua.register(redis, "create.lua")
        self._append = lua.register(redis, "append.lua")
        self._snapshot = lua.register(redis, "snapshot.lua")
        self._dispose = lua.register(redis, "dispose.lua")

    # -- lifecycle -----------------------------------------------------------------------------

    def create(self, session_id: str | None = None, *, cwd: str | None = None) -> LiveHandle:
        """Create a live session; raises ``SESSION_ALREADY_EXISTS`` if the id was ever used."""
        sid = rules.check_id(session_id) if session_id is not None else self._new_id()
        header = Header(version=wire.HEADER_VERSION, id=sid, created_at=self._clock(),
                        cwd=UNSET if cwd is None else cwd)
        token = self._new_token()
        raw = wire.encode_header(header)
        created = self._create(keys=[keys.session(sid), *self._lifecycle],
                               args=[raw, token, 0, 0, "[]", "", "", self.lifecycle_maxlen, sid])
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
        ``INVALID_REQUEST`` for an event over ``max_event_bytes``.
        """
        sid, instance = _unpack(session)
        if not events:
            live = self.instance(sid)
            if live is None:
                raise errors.not_found(sid)
            if instance and live != instance:
                raise errors.not_live(sid)
            return []
        ts = self._clock() if time_ms is None else time_ms
        payload = [wire.encode_stored_event(e, ts) for e in events]
        for i, raw in enumerate(payload):
            if len(raw) > self.max_event_bytes:
                raise errors.invalid(f"event {i} is {len(raw)} bytes, over the limit of {self.max_event_bytes}")
        flush = any(e.type == rules.TURN_END for e in events)
        first = int(self._append(
            keys=[keys.session(sid), keys.session_log(sid), *self._lifecycle],
            args=[instance, events[-1].type, "" if expect_length is None else expect_length,
                  "1" if flush else "0", self.lifecycle_maxlen, sid, self._new_call_id(), *payload]))
        if first == -3:
            raise LengthMoved(sid)
        self._raise_for(first, sid)
        if flush and self._cluster:
            self._emit(self.redis, "session/flush", sid, first + len(events))
        return [Event(e.type, first + i, ts, e.data, dict(e.extra)) for i, e in enumerate(events)]

    def dispose(self, session: SessionRef) -> None:
        """End the live incarnation; header and events stay readable, the id is never reused."""
        sid, instance = _unpack(session)
        status = int(self._dispose(keys=[keys.session(sid), *self._lifecycle],
                                   args=[instance, self.lifecycle_maxlen, sid]))
        self._raise_for(status, sid)
        if self._cluster:
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

    # -- reads ---------------------------------------------------------------------------------

    def header(self, session_id: str) -> Header:
        """The header of a session, live or disposed; ``SESSION_NOT_FOUND`` if never created."""
        sid = rules.check_id(session_id)
        raw = self.redis.hget(keys.session(sid), "header")
        if raw is None:
            raise errors.not_found(sid)
        return wire.decode_header(raw)

    def instance(self, session_id: str) -> str | None:
        """The live instance token, or ``None`` when the session is not live."""
        raw = self.redis.hget(keys.session(rules.check_id(session_id)), "instance")
        return None if raw is None else wire.text(raw)

    def length(self, session_id: str) -> int:
        raw = self.redis.hget(keys.session(rules.check_id(session_id)), "len")
        return 0 if raw is None else int(raw)

    def exists(self, session_id: str) -> bool:
        return bool(self.redis.exists(keys.session(rules.check_id(session_id))))

    def events(self, session_id: str, start: int = 0, stop: int | None = None) -> list[Event]:
        """Events with ``start <= seq < stop`` (the whole log by default), inherited seed included.

        One pipelined round trip for all the slices, whatever the depth of the lineage; the first
        read of a session also reads its record (its seed references never change, so they are
        remembered).
        """
        sid = rules.check_id(session_id)
        known = self._lineages.get(sid)
        if known is None:
            record = self._record(sid)
            known = (record.seed_length, record.segments)
            self._lineages[sid] = known
            if len(self._lineages) > _LINEAGE_CACHE:
                self._lineages.popitem(last=False)
        return self._read(sid, known[1], known[0], max(start, 0), stop)

    def children(self, session_id: str) -> list[str]:
        """Ids of the sessions forked from this one, sorted."""
        members = self.redis.smembers(keys.session_children(rules.check_id(session_id)))
        return sorted(wire.text(m) for m in members)

    def _record(self, sid: str) -> _Record:
        header, length, seed_length, seed = self.redis.hmget(
            keys.session(sid), ["header", "len", "seedlen", "seed"]
        )
        if header is None or length is None or seed_length is None or seed is None:
            raise errors.not_found(sid)
        return _Record(wire.decode_header(header), int(length), int(seed_length),
                       decode_segments(seed))

    def _read(self, sid: str, segments: Sequence[tuple[str, int, int]], seed_length: int,
              start: int, stop: int | None) -> list[Event]:
        # Walk the log's pieces (ancestor slices, then the own log) and fetch the overlap of each
        # with [start, stop) in one pipeline; ancestor slices are immutable, so no lock is needed.
        # ``stop=None`` reads the own log to its end, whatever its length now.
        plan: list[tuple[str, int, int, int]] = []  # (log owner, first index, last index, first seq)
        seq = 0
        for owner, lo, hi in segments:
            a, b = max(start, seq), seq + hi - lo if stop is None else min(stop, seq + hi - lo)
            if a < b:
                plan.append((owner, lo + a - seq, lo + b - seq - 1, a))
            seq += hi - lo
        first = max(start, seed_length)
        if stop is None or first < stop:
            plan.append((sid, first - seed_length, -1 if stop is None else stop - seed_length - 1, first))
        pipe = self.redis.pipeline(transaction=False)
        for owner, first, last, _ in plan:
            pipe.lrange(keys.session_log(owner), first, last)
        out: list[Event] = []
        for (_, _, _, first_seq), raws in zip(plan, pipe.execute(), strict=True):
            out.extend(wire.decode_stored_event(raw, first_seq + i) for i, raw in enumerate(raws))
        return out

    # -- the two atomic steps of a fork ----------------------------------------------------------

    def take_snapshot(self, source: SessionRef) -> Snapshot:
        """The source step alone: ``SESSION_NOT_FOUND``, ``SESSION_NOT_LIVE`` or ``OPEN_TURN``."""
        plan = self.prepare_fork(source)
        if plan.error is not None:
            raise plan.error
        assert plan.snapshot is not None
        return plan.snapshot

    def prepare_fork(self, source: SessionRef, child_ids: Sequence[str] = (), *,
                     request_id: str = "") -> ForkPlan:
        """The source step, plus a look at the children-to-be, in one round trip.

        The source step is one script on the source's slot: live? instance? boundary? length?
        Each child id that exists lands in ``existing``, or in ``replayed`` when ``request_id``
        created it (a replay after a crash).
        """
        sid, instance = _unpack(source)  # ids are checked before any Redis call
        checked = [rules.check_id(c) for c in child_ids]
        if self._cluster:
            # A cluster pipeline cannot carry scripts: look at the children, then run the step.
            pipe = self.redis.pipeline(transaction=False)
            for child in checked:
                pipe.hmget(keys.session(child), ["header", "req"])
            taken = pipe.execute() if checked else []
            reply = self._snapshot(keys=[keys.session(sid)], args=[instance])
            return self._plan(sid, checked, request_id, [*taken, reply])
        pipe = self.redis.pipeline(transaction=False)
        parse = self.queue_prepare(pipe, source, checked, request_id=request_id)
        results = pipe.execute(raise_on_error=False)
        if any(isinstance(r, NoScriptError) for r in results):
            self.load_scripts()
            return self.prepare_fork(source, child_ids, request_id=request_id)
        return parse(results)

    def queue_prepare(self, pipe: Any, source: SessionRef, child_ids: Sequence[str] = (), *,
                      request_id: str = "") -> Callable[[list[Any]], ForkPlan]:
        """Queue ``prepare_fork``'s commands on a single server's ``pipe`` (read-only, so safe
        to re-run); returns the parser of their results, which must come last in the pipeline."""
        sid, instance = _unpack(source)
        checked = [rules.check_id(c) for c in child_ids]
        for child in checked:
            pipe.hmget(keys.session(child), ["header", "req"])
        pipe.evalsha(self._snapshot.sha, 1, keys.session(sid), instance)
        count = len(checked) + 1
        return lambda results: self._plan(sid, checked, request_id, results[-count:])

    def load_scripts(self) -> None:
        """Load every script (after a NOSCRIPT: the server restarted or was flushed)."""
        for script in (self._create, self._append, self._snapshot, self._dispose):
            script.sha = self.redis.script_load(script.script)

    def _plan(self, sid: str, checked: list[str], request_id: str, results: list[Any]) -> ForkPlan:
        *taken, reply = results
        existing: list[str] = []
        replayed: dict[str, Header] = {}
        for child, (header, req) in zip(checked, taken, strict=True):
            if header is None:
                continue
            if request_id and req is not None and wire.text(req) == request_id:
                replayed[child] = wire.decode_header(header)
            else:
                existing.append(child)
        try:
            return ForkPlan(parse_snapshot(sid, reply), None, existing, replayed)
        except errors.ForkError as exc:
            return ForkPlan(None, exc, existing, replayed)

    @property
    def is_cluster(self) -> bool:
        return self._cluster

    def read_snapshot(self, snap: Snapshot) -> list[Event]:
        """The events a snapshot covers: fresh objects, safe for the caller to mutate."""
        return self._read(snap.source.id, snap.segments, snap.seed_length, 0, snap.length)

    def child_header(self, snap: Snapshot, child_id: str) -> Header:
        return Header(version=wire.HEADER_VERSION, id=child_id, created_at=self._clock(),
                      cwd=snap.source.cwd, parent_session=snap.source.id, seed_length=snap.length)

    def create_children(self, snap: Snapshot, child_ids: Sequence[str], *,
                        request_id: str = "") -> list[Header | errors.ForkError]:
        """The child step for each id: create it from ``snap``, atomically on its own slot.

        One pipelined round trip for all children, which also indexes them under the parent (on
        a cluster, a second round trip does). A child already created by the same ``request_id`` is returned as it is (a
        replay), so a request forks at most once; any other existing id is
        ``SESSION_ALREADY_EXISTS`` in its place of the result. With ``wait_replicas``, the
        children are acknowledged by that many replicas before this returns
        (``lua.NotReplicated`` otherwise).
        """
        checked = [rules.check_id(c) for c in child_ids]
        segments = wire.encode(snap.child_segments())
        last = "turn/end" if snap.length else ""
        # On one server the script also indexes the child under its parent (atomically); on a
        # cluster the parent's index is in another slot and is written right after.
        index = [] if self._cluster else [keys.session_children(snap.source.id)]
        calls: list[lua.Call] = [
            (self._create, [keys.session(cid), *self._lifecycle, *index],
             [wire.encode_header(self.child_header(snap, cid)), self._new_token(), snap.length, snap.length,
              segments, last, request_id, self.lifecycle_maxlen, cid])
            for cid in checked
        ]
        results: list[Header | errors.ForkError] = [
            errors.already_exists(cid) if raw is None else wire.decode_header(raw)
            for cid, raw in zip(checked, lua.eval_many(self.redis, calls, replicas=self.wait_replicas,
                                                       wait_ms=self.wait_timeout_ms), strict=True)
        ]
        created = [r.id for r in results if isinstance(r, Header)]
        if created and self._cluster:
            pipe = self.redis.pipeline(transaction=False)
            pipe.sadd(keys.session_children(snap.source.id), *created)
            for cid in created:
                self._emit(pipe, "session/created", cid, snap.length)
            pipe.execute()
        return results

    def confirm_replays(self, replayed: Sequence[Header]) -> None:
        """Finish what an earlier attempt of a request may have left undone for its children.

        That attempt created them, then may have stopped before the steps that follow the child
        step: on a cluster, indexing under the parent and the ``session/created`` event (repeated
        here: consumers are idempotent); anywhere, the WAIT for replicas.
        """
        if not replayed:
            return
        if self._cluster:
            pipe = self.redis.pipeline(transaction=False)
            for child in replayed:
                if child.parent_session is not UNSET:
                    pipe.sadd(keys.session_children(child.parent_session), child.id)
                self._emit(pipe, "session/created", child.id, 0 if child.seed_length is UNSET else child.seed_length)
            pipe.execute()
        if self.wait_replicas:
            lua.wait_for_replicas(self.redis, [keys.session(c.id) for c in replayed], self.wait_replicas,
                                  self.wait_timeout_ms)

    def create_child(self, snap: Snapshot, child_id: str | None = None, *,
                     request_id: str = "") -> Header:
        """``create_children`` for one child (generated id by default); raises on failure."""
        cid = self._new_id() if child_id is None else child_id
        (result,) = self.create_children(snap, [cid], request_id=request_id)
        if isinstance(result, errors.ForkError):
            raise result
        return result


class LengthMoved(Exception):
    """``append(expect_length=...)`` found the log at another length: re-read and try again."""
