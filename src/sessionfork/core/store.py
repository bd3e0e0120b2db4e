"""Sessions in Redis: create, append, dispose and the record's reads: ``SessionStore``, a part of
``registry.Registry`` (whose methods state the contracts).

Every read and write of the session layout (see ``keys``) goes through ``registry.Registry``. Each
atomic step touches the keys of one session only (one hash slot), so the registry runs unchanged
on a single server or a Redis Cluster. Reading a log across its lineage is ``logs.LogReader``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

from msgspec import UNSET

from ..core import errors, keys, records, rules, wire
from .state import RegistryState
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


class SessionStore:
    """Sessions on the state's connection: create, append, dispose, flush, and the reads of a
    session's record (the log itself: ``logs.LogReader``)."""

    def __init__(self, state: RegistryState) -> None:
        self.state = state
        self.redis = state.redis

    # -- lifecycle -----------------------------------------------------------------------------

    def create(self, session_id: str | None = None, *, cwd: str | None = None) -> LiveHandle:
        """``Registry.create``."""
        sid = rules.check_id(session_id) if session_id is not None else self.state.new_id()
        if cwd is not None:
            rules.check_text(cwd, "cwd")
        header = Header(version=wire.HEADER_VERSION, id=sid, created_at=self.state.clock(),
                        cwd=UNSET if cwd is None else cwd)
        token = self.state.new_token()
        state = self.state
        created = state.scripts("create", record=keys.session(sid), log=keys.session_log(sid),
                                turns=keys.session_turns(sid), lifecycle=state.lifecycle_key,
                                **records.create_args(header, compact=state.compact_records), instance=token,
                                length=0, seed_length=0, seed="[]", last_type="",
                                request_id="", maxlen=state.lifecycle_maxlen, session_id=sid, seed_end=-1,
                                parent_header="", last_end="", markers="", summary="", need="", parent_stored="",
                                parent_cwd="", parent_parent="", edits=())
        if created is None:
            raise errors.already_exists(sid)
        if self.state.cluster:
            self.state.emit(self.redis, "session/created", sid, 0)
        return LiveHandle(sid, token)

    def append(self, session: SessionRef, events: Sequence[NewEvent], *,
               expect_length: int | None = None, time_ms: int | None = None,
               usage: wire.Usage | None = None) -> list[Event]:
        """``Registry.append``."""
        sid, instance = split_ref(session)
        if not isinstance(events, Sequence) or isinstance(events, str | bytes):
            raise errors.invalid(f"events must be a sequence of NewEvent, got {type(events).__name__}")
        if usage is not None and not isinstance(usage, wire.Usage):
            raise errors.invalid(f"usage must be a Usage, got {type(usage).__name__}")
        if usage is not None and not events:
            raise errors.invalid("usage rides on an append of at least one event")
        if not events:
            live = self.instance(sid)
            if live is None:
                raise errors.not_found(sid)
            if instance and live != instance:
                raise errors.not_live(sid)
            return []
        ts = self.state.clock() if time_ms is None else time_ms
        payload = self.encode_events(events, ts)
        flush = any(e.type == rules.TURN_END for e in events)
        markers = " ".join(map(str, rules.batch_markers([e.type for e in events])))
        first = int(self.state.scripts(
            "append", record=keys.session(sid), log=keys.session_log(sid), turns=keys.session_turns(sid),
            lifecycle=self.state.lifecycle_key, instance=instance, last_type=events[-1].type,
            expect_length="" if expect_length is None else expect_length, flush="1" if flush else "0",
            maxlen=self.state.lifecycle_maxlen, session_id=sid, call_id=self.state.new_call_id(), markers=markers,
            usage="" if usage is None else " ".join(map(str, usage.values())), events=payload))
        if first == -3:
            raise LengthMoved(sid)
        self._raise_for(first, sid)
        if flush and self.state.cluster:
            self.state.emit(self.redis, "session/flush", sid, first + len(events))
        return [Event(e.type, first + i, ts, e.data, dict(e.extra)) for i, e in enumerate(events)]

    def encode_events(self, events: Sequence[NewEvent], time_ms: int, *, checked: bool = False) -> list[bytes]:
        """``Registry.encode_events``; ``checked``: the events were encoded (so checked) before, at
        another time (``wire.encode_stored_event``): their size is checked again, their values not."""
        payload = [wire.encode_stored_event(e, time_ms, checked=checked) for e in events]
        limit = self.state.max_event_bytes
        for i, raw in enumerate(payload):
            if len(raw) > limit:
                raise errors.invalid(f"event {i} is {len(raw)} bytes, over the limit of {limit}")
        return payload

    def dispose(self, session: SessionRef) -> None:
        """``Registry.dispose``."""
        sid, instance = split_ref(session)
        now = self.state.clock()
        state = self.state
        status = int(state.scripts("dispose", record=keys.session(sid), lifecycle=state.lifecycle_key,
                                   disposed=None if state.cluster else keys.DISPOSED_INDEX, instance=instance,
                                   maxlen=state.lifecycle_maxlen, session_id=sid, now=now))
        self._raise_for(status, sid)
        if self.state.cluster:  # the index and the stream live in other slots: right after the change
            self.redis.zadd(keys.DISPOSED_INDEX, {sid: now})
            self.state.emit(self.redis, "session/disposed", sid, self.length(sid))

    def flush(self, session_id: str) -> None:
        """``Registry.flush``."""
        sid = rules.check_id(session_id)
        self.header(sid)  # SESSION_NOT_FOUND for an id never created
        self.state.emit(self.redis, "session/flush", sid, self.length(sid))

    @staticmethod
    def _raise_for(status: int, sid: str) -> None:
        if status == -1:
            raise errors.not_found(sid)
        if status == -2:
            raise errors.not_live(sid)

    # -- reads of the record (the log itself, seed included: ``logs.LogReader``) ----------------

    def header(self, session_id: str) -> Header:
        """``Registry.header``."""
        sid = rules.check_id(session_id)
        raw, cwd, parent = self.redis.hmget(keys.session(sid), list(records.HEADER_FIELDS))
        if raw is None:
            raise errors.not_found(sid)
        return records.decode_header(sid, raw, cwd, parent)

    def state_of(self, session_id: str) -> wire.SessionState:
        """``Registry.state_of``."""
        sid = rules.check_id(session_id)
        header, *state = self.redis.hmget(keys.session(sid), ["header", *records.STATE_FIELDS])
        found = records.decode_state(sid, header, *state)
        if found is None:
            raise errors.not_found(sid)
        return found

    def instance(self, session_id: str) -> str | None:
        """``Registry.instance``."""
        raw = self.redis.hget(keys.session(rules.check_id(session_id)), "instance")
        return None if raw is None else wire.text(raw)

    def length(self, session_id: str) -> int:
        """``Registry.length``."""
        raw = self.redis.hget(keys.session(rules.check_id(session_id)), "len")
        return 0 if raw is None else int(raw)

    def last_turn_end(self, session_id: str) -> int | None:
        """``Registry.last_turn_end``."""
        sid = rules.check_id(session_id)
        header, raw = self.redis.hmget(keys.session(sid), ["header", "lastend"])
        if header is None:
            raise errors.not_found(sid)
        return None if raw is None or int(raw) < 0 else int(raw)

    def exists(self, session_id: str) -> bool:
        """``Registry.exists``."""
        return bool(self.redis.hexists(keys.session(rules.check_id(session_id)), "header"))

    def usage(self, session_id: str) -> wire.SessionUsage:
        """``Registry.usage``: a breadth-first walk of the subtree, one pipelined round trip per
        level (each node's counters, children and released children)."""
        sid = rules.check_id(session_id)
        own = wire.Usage()
        total, count, level, seen = wire.Usage(), 0, [sid], {sid}
        while level:
            pipe = self.redis.pipeline(transaction=False)
            for node in level:
                pipe.hmget(keys.session(node), ["header", "deleted", *USAGE_COUNTERS])
                pipe.smembers(keys.session_children(node))
                pipe.smembers(keys.session_released(node))
            replies = pipe.execute()
            below: set[str] = set()
            for i, node in enumerate(level):
                got, children, released = replies[3 * i: 3 * i + 3]
                if node == sid:
                    if got[0] is None and got[1] is None:
                        raise errors.not_found(sid)
                    own = usage_of(got[2:])
                total += usage_of(got[2:])
                below.update(wire.text(c) for c in (*children, *released))
            count += len(level)
            level = sorted(below - seen)
            seen.update(level)
        return wire.SessionUsage(id=sid, own=own, subtree=total, sessions=count)

    def children(self, session_id: str) -> list[str]:
        """``Registry.children``."""
        members = self.redis.smembers(keys.session_children(rules.check_id(session_id)))
        return sorted(wire.text(m) for m in members)


USAGE_COUNTERS = ("uin", "uout", "ucr", "ucw", "ucost")
"""The record's own usage counters, in ``wire.USAGE_FIELDS`` order (``keys``: the record)."""


def usage_of(counters: Sequence[bytes | str | None]) -> wire.Usage:
    """A ``Usage`` from the record's counters (absent: 0)."""
    return wire.Usage(**{name: min(int(raw or 0), wire.USAGE_MAX)
                         for name, raw in zip(wire.USAGE_FIELDS, counters, strict=True)})


class LengthMoved(Exception):
    """``append(expect_length=...)`` found the log at another length: re-read and try again."""
