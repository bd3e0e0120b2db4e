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

from ..core import errors, keys, lua, records, rules, wire
from .logs import LINEAGE_CACHE
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
        state = self.state
        call_id, counters = state.new_call_id(), "" if usage is None else " ".join(map(str, usage.values()))
        root = "-" if state.cluster else state.roots.get(sid, "")
        while True:  # at most twice: the first append with usage learns the session's root
            reply = state.scripts(
                "append", record=keys.session(sid), log=keys.session_log(sid), turns=keys.session_turns(sid),
                lifecycle=state.lifecycle_key, tree=keys.session(root) if root not in ("", "-") else None,
                instance=instance, last_type=events[-1].type,
                expect_length="" if expect_length is None else expect_length, flush="1" if flush else "0",
                maxlen=state.lifecycle_maxlen, session_id=sid, call_id=call_id, markers=markers, usage=counters,
                root=root, events=payload)
            if not isinstance(reply, list):
                break
            root = state.roots[sid] = wire.text(reply[1])
            if len(state.roots) > LINEAGE_CACHE:
                state.roots.popitem(last=False)
        first = int(reply)
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
        """``Registry.usage``: a root on one server answers from its record (its tree's totals, which
        every append with usage in the tree adds to); any other session by a breadth-first walk of
        its subtree, one round trip per level: on one server each level summed by ``subtree.lua``
        (chunks of ``USAGE_CHUNK`` sessions, in one pipeline), on a cluster, where a level spans
        slots, each session's counters and children read in one pipeline per level."""
        sid = rules.check_id(session_id)
        got = self.redis.hmget(keys.session(sid), ["header", "deleted", "tree", *USAGE_COUNTERS, *TREE_COUNTERS])
        if got[0] is None and got[1] is None:
            raise errors.not_found(sid)
        n = len(USAGE_COUNTERS)
        own = usage_of(got[3:3 + n])
        totals = got[3 + n:]
        # A root on one server: its tree's totals (a root's tombstone keeps its "tree" mark with the
        # totals it has; totals on one without the mark were all added after it was deleted).
        if not self.state.cluster and (got[2] is not None or any(t is not None for t in totals)):
            return wire.SessionUsage(id=sid, own=own, subtree=usage_of(totals))
        sums, level, seen = [0] * n, [sid], {sid}
        while level:
            below: set[str] = set()
            for part, children in self._level(level):
                sums = [a + b for a, b in zip(sums, part, strict=True)]
                below.update(children)
            level = sorted(below - seen)
            seen.update(level)
        return wire.SessionUsage(id=sid, own=own, subtree=usage_of(sums))

    def _level(self, level: Sequence[str]) -> list[tuple[list[int], list[str]]]:
        """Each chunk's usage sums and the ids below it, for one level of the walk (one round trip)."""
        if self.state.cluster:
            pipe = self.redis.pipeline(transaction=False)
            for node in level:
                pipe.hmget(keys.session(node), list(USAGE_COUNTERS))
                pipe.smembers(keys.session_children(node))
            replies = pipe.execute()
            return [([int(v or 0) for v in got], [wire.text(c) for c in children])
                    for got, children in zip(replies[::2], replies[1::2], strict=True)]
        calls = [self.state.scripts.op("subtree", level=[key for node in level[i:i + USAGE_CHUNK]
                                                         for key in (keys.session(node), keys.session_children(node))])
                 for i in range(0, len(level), USAGE_CHUNK)]
        return [([int(v) for v in reply[:5]], [wire.text(c) for c in reply[5:]])
                for reply in lua.eval_many(self.redis, calls)]

    def children(self, session_id: str) -> list[str]:
        """``Registry.children``."""
        members = self.redis.smembers(keys.session_children(rules.check_id(session_id)))
        return sorted(wire.text(m) for m in members)


USAGE_CHUNK = 1000
"""Sessions one ``subtree.lua`` call sums (a level of more is several calls, in one pipeline)."""
USAGE_COUNTERS = ("uin", "uout", "ucr", "ucw", "ucost")
"""The record's own usage counters, in ``wire.USAGE_FIELDS`` order (``keys``: the record)."""
TREE_COUNTERS = ("tin", "tout", "tcr", "tcw", "tcost")
"""A root's record: its tree's usage totals, in ``wire.USAGE_FIELDS`` order."""


def usage_of(counters: Sequence[bytes | str | int | None]) -> wire.Usage:
    """A ``Usage`` from the record's counters (absent: 0)."""
    return wire.Usage(**{name: min(int(raw or 0), wire.USAGE_MAX)
                         for name, raw in zip(wire.USAGE_FIELDS, counters, strict=True)})


class LengthMoved(Exception):
    """``append(expect_length=...)`` found the log at another length: re-read and try again."""
